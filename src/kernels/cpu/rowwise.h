// The cheap row-wise ops, one plain implementation shared by the reference and the fast CPU
// backends (shape contracts as in kernels.h).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

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
// exp's constants (Cephes): the clamp range, log2(e) and ln(2) in two parts, the polynomial
// from its highest coefficient down. exp_cephes, exp256 (isa_avx2.h) and the AVX-512 forms use
// these with the same operations in the same order, so a lane's result is the same on each.
struct ExpConst {
  static constexpr float lo = -87.3f, hi = 88.3762626647949f, log2e = 1.44269504088896341f;
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  static constexpr float p[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                                 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};
};
// exp(x) within ~2 ulp (Cephes' polynomial): x < lo (and -inf) gives exactly 0, x > hi
// exp(hi), NaN exp(hi) (as min/max_ps order their operands). Each fused step is std::fma (one
// rounding, as the vector fmadd), so vector forms give these bits on any ISA.
inline float exp_cephes(float x) {
  using C = ExpConst;
  const bool underflow = x < C::lo;
  x = x < C::hi ? x : C::hi;  // (_mm_min_ps(x, hi): hi when x is NaN)
  x = x > C::lo ? x : C::lo;
  const float fx = std::floor(std::fma(x, C::log2e, 0.5f));
  x = std::fma(-fx, C::ln2_hi, x);
  x = std::fma(-fx, C::ln2_lo, x);
  const float z = x * x;
  float y = C::p[0];
  for (int i = 1; i < 6; ++i) y = std::fma(y, x, C::p[i]);
  y = std::fma(y, z, x) + 1.0f;
  const uint32_t e = uint32_t(int32_t(fx) + 127) << 23;  // 2^fx: fx in [-126, 127] after the clamp
  float p2;
  std::memcpy(&p2, &e, sizeof p2);
  return underflow ? 0.0f : y * p2;
}
// The gate activations (GateAct), one definition for the GEMM epilogue and the separate pass
// (the epilogue's vector form, Isa::silu_mul, gives these bits).
inline float silu(float x) { return x / (1.0f + exp_cephes(-x)); }
// GELU, tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kA = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kA * x * x)));
}
// (Of SiLU and GELU only: SwigluOai reads the up value too, swiglu_oai below.)
inline float gate_act(GateAct act, float x) { return act == GateAct::GeluTanh ? gelu_tanh(x) : silu(x); }
// gpt-oss's (llama.cpp's swiglu_oai, alpha 1.702, limit 7): the gate clamped from above only,
// the linear part both ways and offset by 1.
inline float swiglu_oai(float g, float u) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  const float x = std::min(g, kLimit), y = std::clamp(u, -kLimit, kLimit);
  return x / (1.0f + exp_cephes(-kAlpha * x)) * (y + 1.0f);
}
void glu(const float* gate, const float* up, GateAct act, float* a, int64_t M, int64_t n);
void softcap(float* x, int64_t n, float cap);
// The contract of ft::exp_shifted (kernels.h), scalar: out[i] = exp_cephes((x[i] - shift) / div).
void exp_shifted(const float* x, int64_t n, float shift, float div, float* out);
void scale(float* x, int64_t n, float s);
void add(float* y, const float* x, int64_t M, int64_t n);

}  // namespace ft::rowwise
