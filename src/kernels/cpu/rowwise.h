// The cheap row-wise ops, one plain implementation shared by the reference and the fast CPU
// backends (shape contracts as in kernels.h).
#pragma once
#include <cstdint>

#include "kernels/kernels.h"

namespace ft::rowwise {

void add_bias(float* Y, int64_t M, int64_t N, const float* bias);
void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t n, float eps);
void embed(const WeightView& E, const int32_t* tokens, int64_t M, float* out);
// theta accumulated multiplicatively, as ggml does; n_rot <= 512 (table on the stack).
void rope(float* x, int64_t M, int32_t n_heads, int32_t head_dim, const int32_t* pos, const RopeParams& p,
          int threads);
// cs (M, n_rot): row m's cos and sin of rotated pair i at cs[m * n_rot + 2i] and [+ 1].
void rope_table(const int32_t* pos, int64_t M, const RopeParams& p, float* cs);
// One row's columns [col0, col0 + n) of a (.., heads * head_dim) tensor, rotated in place with
// that row's table cs (n_rot,). Interleaved pairs only; col0 and n even.
void rope_rotate(float* y, int64_t col0, int64_t n, int32_t head_dim, int32_t n_rot, const float* cs);
void swiglu(const float* gate, const float* up, float* a, int64_t M, int64_t n);
void add(float* y, const float* x, int64_t M, int64_t n);

}  // namespace ft::rowwise
