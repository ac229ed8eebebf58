// The cheap row-wise ops, one plain implementation shared by the reference and the fast CPU
// backends (shape contracts as in kernels.h).
#pragma once
#include <cmath>
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
// The gate activations (GateAct), one definition for the GEMM epilogue and the separate pass.
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// GELU, tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kA = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kA * x * x)));
}
inline float gate_act(GateAct act, float x) { return act == GateAct::GeluTanh ? gelu_tanh(x) : silu(x); }
void glu(const float* gate, const float* up, GateAct act, float* a, int64_t M, int64_t n);
void softcap(float* x, int64_t n, float cap);
void scale(float* x, int64_t n, float s);
void add(float* y, const float* x, int64_t M, int64_t n);

}  // namespace ft::rowwise
