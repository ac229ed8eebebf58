// The fast CPU kernels against scalar double-precision references written here, on random data
// of odd shapes, on both instruction-set paths (AVX2 when the CPU has it, and the forced scalar
// fallback).
//
// Tolerances. GEMM: each output is one f32 fused multiply-add chain over k in order, so its
// rounding error is at most about K * 2^-24 * sum_k |x_k w_k| (the classic gamma_K bound); we
// allow (K + 8) * 2^-24 * sum|x w| + 1e-6. Weights are dequantized bit-identically to
// dequantize_row (rows or the fast backend's packed panels), so the reference uses its values.
// Quantized weights take the integer path: x is quantized to int8 per 32-block first (its own
// test checks that, and how far it moves the product); the reference multiplies that x in
// double; the kernel's f32 rounding is then one fma per block plus the scale products, well
// inside the same bound (with Q4_K's separate min term counted in the magnitude).
// Attention (every KV type, against a double-precision softmax over the K/V as stored, with the
// Q8_0 query quantized as kv_quantize_query defines): softmax in f32 with a polynomial exp (~2
// ulp), online rescaling and f32 sums over <= 300 positions; we allow 2e-5 * max|v| absolute on
// outputs that are convex combinations of v.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <numbers>
#include <random>
#include <set>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "gguf/ggml_types.h"
#include "kernels/kernels.h"
#include "core/fp16.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/cpu/cpu_kernels.h"  // exp_shifted_for, isa_name
#include "kernels/cpu/packed.h"  // check_packable, convert_rows
#include "kernels/cpu/rowwise.h"  // exp_cephes, silu
#include "test_util.h"

namespace ft {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Every instruction set the kernels have; a test on one this CPU lacks (or this build left out:
// FT_KERNEL_ISAS) is skipped, saying so.
const char* const kIsas[] = {"scalar", "avx2", "avx_vnni", "avx512", "avx512_bf16", "amx"};

bool cpu_has(std::string_view isa) {
  const auto v = cpu_isas();
  return std::find(v.begin(), v.end(), isa) != v.end();
}

std::unique_ptr<Backend> backend_for(std::string_view isa, int threads = 2) {
  set_cpu_isa(isa);
  auto be = make_backend("cpu", threads);
  set_cpu_isa("");
  return be;
}

std::vector<float> randv(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// A quantized weight: its bytes and its dequantized values (what the kernels must multiply).
struct QWeight {
  GGMLType type;
  int64_t N, K;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // (N, K)
  WeightView view() const { return {type, bytes.data(), N, K}; }
};

QWeight make_weight(std::mt19937& rng, GGMLType t, int64_t N, int64_t K) {
  QWeight w{t, N, K, {}, {}};
  const uint64_t rb = *row_bytes(t, uint64_t(K));
  w.bytes.resize(rb * uint64_t(N));
  w.deq.resize(size_t(N * K));
  const auto src = randv(rng, size_t(N * K));
  for (int64_t n = 0; n < N; ++n) {
    quantize_row(t, src.data() + n * K, w.bytes.data() + uint64_t(n) * rb, K);
    dequantize_row(t, w.bytes.data() + uint64_t(n) * rb, w.deq.data() + n * K, K);
  }
  return w;
}

// Weight types the cpu backend multiplies on its integer path (int8 activations, packed.h).
bool int_path(GGMLType t) {
  return t == GGMLType::Q8_0 || t == GGMLType::Q4_0 || t == GGMLType::Q5_0 || t == GGMLType::Q4_1 ||
         t == GGMLType::Q5_1 || t == GGMLType::Q4_K ||
         t == GGMLType::Q5_K || t == GGMLType::Q6_K || t == GGMLType::MXFP4 || t == GGMLType::IQ4_NL ||
         t == GGMLType::IQ4_XS ||
         t == GGMLType::IQ2_XXS || t == GGMLType::IQ3_XXS || t == GGMLType::IQ3_S || t == GGMLType::IQ1_S ||
         t == GGMLType::TQ1_0 || t == GGMLType::TQ2_0 || t == GGMLType::IQ2_XS || t == GGMLType::IQ2_S ||
         t == GGMLType::IQ1_M || t == GGMLType::Q3_K || t == GGMLType::Q2_K;
}

// x rounded to bf16 as BF16 weights' activations are (kernels_impl.h: round_bf16): to nearest,
// ties to even, a denormal to zero.
float bf16_round(float x) {
  if (std::fabs(x) < std::numeric_limits<float>::min()) return std::copysign(0.0f, x);
  return bf16_to_f32(f32_to_bf16(x));
}

// The activations as the kernels multiply them: x itself, rounded to bf16 for BF16 weights
// (matmul; not LoRA's shrink, matmul_runs: bf16_x false), or on the integer path dx * xq.
std::vector<double> kernel_x(const float* X, int64_t M, int64_t K, GGMLType t, bool bf16_x = true) {
  std::vector<double> x(size_t(M * K));
  if (!int_path(t)) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = t == GGMLType::BF16 && bf16_x ? bf16_round(X[i]) : X[i];
    return x;
  }
  std::vector<int16_t> xq(static_cast<size_t>(K));
  std::vector<float> dx(static_cast<size_t>(K / 32));
  std::vector<int32_t> xs(static_cast<size_t>(K / 32));
  for (int64_t m = 0; m < M; ++m) {
    quantize_activations(X + m * K, K, xq.data(), dx.data(), xs.data());
    for (int64_t k = 0; k < K; ++k) x[size_t(m * K + k)] = double(dx[size_t(k / 32)]) * xq[size_t(k)];
  }
  return x;
}

// Q4_K's, Q5_K's and Q2_K's min term dmin * m (Q4_1's and Q5_1's m) of row n at k: the integer path adds it as its own
// product (w = d1 q - m1), so its magnitude counts in the rounding bound even where it cancels
// against d1 q.
template <class B>
double k_min_of(const QWeight& W, int64_t n, int64_t k) {
  const auto* b = reinterpret_cast<const B*>(W.bytes.data() + uint64_t(n) * *row_bytes(W.type, uint64_t(W.K))) + k / 256;
  uint8_t sc, m;
  blocks::scale_min_k4(int(k % 256) / 32, b->scales, sc, m);
  return std::fabs(double(f16_to_f32(load_u16(b->dmin))) * m);
}
double k_min(const QWeight& W, int64_t n, int64_t k) {
  if (W.type == GGMLType::Q4_K) return k_min_of<blocks::Q4_K>(W, n, k);
  if (W.type == GGMLType::Q2_K) {  // (a min per 16)
    const auto* b = reinterpret_cast<const blocks::Q2_K*>(W.bytes.data() + uint64_t(n) * *row_bytes(W.type, uint64_t(W.K))) + k / 256;
    return std::fabs(double(f16_to_f32(load_u16(b->dmin))) * (b->scales[(k % 256) / 16] >> 4));
  }
  if (W.type == GGMLType::Q5_K) return k_min_of<blocks::Q5_K>(W, n, k);
  if (W.type == GGMLType::Q4_1 || W.type == GGMLType::Q5_1) {  // (m at byte 2 of both)
    const uint8_t* b = W.bytes.data() + uint64_t(n) * *row_bytes(W.type, uint64_t(W.K)) + (k / 32) * type_traits(W.type).type_size;
    return std::fabs(double(f16_to_f32(load_u16(b + 2))));
  }
  return 0;
}

// y[m][n] = sum_k x[m][k] w[n][k] in double with x as the kernels see it (kernel_x), and the
// magnitude sum_k |x w| for the tolerance.
void ref_gemm(const float* X, int64_t M, const QWeight& W, std::vector<double>& y, std::vector<double>& mag,
              bool bf16_x = true) {
  const std::vector<double> x = kernel_x(X, M, W.K, W.type, bf16_x);
  y.assign(size_t(M * W.N), 0);
  mag.assign(size_t(M * W.N), 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < W.N; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < W.K; ++k) {
        const double xk = x[size_t(m * W.K + k)];
        const double p = xk * double(W.deq[size_t(n * W.K + k)]);
        s += p;
        a += std::fabs(p) + 2 * std::fabs(xk) * k_min(W, n, k);
      }
      y[size_t(m * W.N + n)] = s;
      mag[size_t(m * W.N + n)] = a;
    }
}

double gemm_tol(int64_t K, double mag) { return double(K + 8) * 0x1p-24 * mag + 1e-6; }

struct TypeCase {
  GGMLType type;
  std::vector<int64_t> Ks;
};

std::vector<TypeCase> type_cases() {
  return {{GGMLType::F32, {1, 13, 64, 520}},  {GGMLType::F16, {7, 64, 300}},
          {GGMLType::BF16, {9, 256, 265}},    {GGMLType::Q8_0, {32, 96, 544}},
          {GGMLType::Q4_0, {32, 288}},        {GGMLType::Q4_K, {256, 512}},
          {GGMLType::Q5_K, {256, 768}},       {GGMLType::Q6_K, {256, 768}},
          {GGMLType::MXFP4, {32, 288}},       {GGMLType::IQ4_NL, {288}},
          {GGMLType::IQ4_XS, {256, 768}},     {GGMLType::IQ2_XXS, {512}},
          {GGMLType::Q5_0, {288}},            {GGMLType::Q4_1, {288}},
          {GGMLType::Q5_1, {288}},            {GGMLType::IQ2_XS, {512}},
          {GGMLType::Q3_K, {256, 768}},       {GGMLType::Q2_K, {512}}};
  // (the levels layout's grid types and the levels16 layout's: one each, its decoder is theirs;
  // Q3_K, whose GEMM chunk is Q8_0's form)
}

// The gate activations in double: silu(g) = g / (1 + e^-g); GELU's tanh form
// g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
double ref_act(GateAct act, double g) {
  if (act == GateAct::SiLU) return g / (1 + std::exp(-g));
  return 0.5 * g * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
}

class KernelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cpu_has(GetParam())) GTEST_SKIP() << "this CPU cannot run " << GetParam() << " or this build has no kernels for it";
  }
};

TEST_P(KernelTest, GemmAllTypesOddShapes) {
  auto be = backend_for(GetParam());
  std::mt19937 rng(42);
  for (const auto& tc : type_cases()) {
    for (int64_t K : tc.Ks) {
      for (int64_t N : {1, 5, 31}) {
        const QWeight W = make_weight(rng, tc.type, N, K);
        for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64, 257}) {
          const auto X = randv(rng, size_t(M * K));
          std::vector<float> Y(size_t(M * N), -1.0f);
          std::vector<double> ref, mag;
          ref_gemm(X.data(), M, W, ref, mag);
          for (bool packed : {false, true}) {
            const WeightView v = packed ? be->prepare(W.view()) : W.view();
            std::fill(Y.begin(), Y.end(), -1.0f);
            be->matmul(X.data(), M, v, Y.data());
            for (size_t i = 0; i < Y.size(); ++i)
              ASSERT_NEAR(Y[i], ref[i], gemm_tol(K, mag[i]))
                  << type_traits(tc.type).name << (packed ? " packed" : " rows") << " M=" << M
                  << " N=" << N << " K=" << K << " at " << i;
          }
        }
      }
    }
  }
}

// The integer path's activation quantization against its definition (kernels.h).
// cpuid read by hand (core/cpu_features.h) says what GCC's own detection says, for every feature
// GCC 12 names (the sanitizer builds use clang, where this comparison is not compiled).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
TEST(CpuFeatures, AgreeWithTheCompilersDetection) {
  __builtin_cpu_init();
  const ft::CpuFeatures& f = ft::cpu_features();
  EXPECT_EQ(f.avx, bool(__builtin_cpu_supports("avx")));
  EXPECT_EQ(f.fma, bool(__builtin_cpu_supports("fma")));
  EXPECT_EQ(f.f16c, bool(__builtin_cpu_supports("f16c")));
  EXPECT_EQ(f.avx2, bool(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(f.avx512f, bool(__builtin_cpu_supports("avx512f")));
  EXPECT_EQ(f.avx512bw, bool(__builtin_cpu_supports("avx512bw")));
  EXPECT_EQ(f.avx512vl, bool(__builtin_cpu_supports("avx512vl")));
  EXPECT_EQ(f.avx512dq, bool(__builtin_cpu_supports("avx512dq")));
  EXPECT_EQ(f.avx512vnni, bool(__builtin_cpu_supports("avx512vnni")));
  EXPECT_EQ(f.avxvnni, bool(__builtin_cpu_supports("avxvnni")));
  EXPECT_EQ(f.avx512bf16, bool(__builtin_cpu_supports("avx512bf16")));
}
#endif

TEST(QuantizeActivations, MatchesItsDefinition) {
  std::mt19937 rng(5);
  const int64_t K = 32 * 9;
  auto x = randv(rng, size_t(K), 3.0f);
  for (int i = 0; i < 32; ++i) x[size_t(32 + i)] = 0.0f;                                   // block 1: zeros
  x[size_t(64 + 5)] = std::numeric_limits<float>::quiet_NaN();                            // block 2: NaN
  x[size_t(96 + 7)] = std::numeric_limits<float>::infinity();                             // block 3: inf
  for (int i = 0; i < 32; ++i) x[size_t(128 + i)] = 1e-30f * float(i - 16);                // block 4: tiny
  for (int i = 0; i < 32; ++i) x[size_t(160 + i)] = float(i % 2 ? 1 : -1) * 127.0f / 2;    // block 5: ties
  std::vector<int16_t> xq(size_t(K), 99);
  std::vector<float> dx(size_t(K / 32));
  std::vector<int32_t> xs(size_t(K / 32));
  quantize_activations(x.data(), K, xq.data(), dx.data(), xs.data());
  for (int64_t b = 0; b < K / 32; ++b) {
    double amax = 0;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[size_t(32 * b + i)])));
    for (int i = 0; i < 32; ++i) sum += xq[size_t(32 * b + i)];
    EXPECT_EQ(xs[size_t(b)], sum) << "block " << b;
    if (b == 2 || b == 3) {
      EXPECT_TRUE(std::isnan(dx[size_t(b)])) << "block " << b;
      continue;
    }
    if (b == 1) {
      EXPECT_EQ(dx[size_t(b)], 0.0f);
      EXPECT_EQ(sum, 0);
      continue;
    }
    EXPECT_NEAR(dx[size_t(b)], amax / 127, 1e-6 * amax / 127) << "block " << b;
    int max_q = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = xq[size_t(32 * b + i)];
      const double xi = x[size_t(32 * b + i)];
      EXPECT_LE(std::abs(q), 127);
      max_q = std::max(max_q, std::abs(q));
      // Nearest: within half a step (plus the f32 rounding of x * 127 / amax).
      EXPECT_LE(std::fabs(xi - double(dx[size_t(b)]) * q), 0.5 * dx[size_t(b)] * (1 + 1e-5)) << "block " << b << " i " << i;
    }
    EXPECT_EQ(max_q, 127) << "block " << b;
  }
  for (int i = 0; i < 32; ++i) EXPECT_EQ(std::abs(xq[size_t(160 + i)]), 127);
}

// How far the integer path moves a product from the exact one with f32 activations: each x is
// off by at most dx / 2 of its block, so |y - x.w| <= sum_k |w_k| dx_k / 2 (+ rounding).
TEST_P(KernelTest, IntPathWithinActivationQuantization) {
  auto be = backend_for(GetParam());
  std::mt19937 rng(21);
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::MXFP4,
                     GGMLType::IQ4_NL, GGMLType::IQ4_XS, GGMLType::IQ2_XXS, GGMLType::IQ3_XXS, GGMLType::IQ3_S,
                     GGMLType::IQ1_S, GGMLType::Q5_0, GGMLType::Q4_1, GGMLType::Q5_1, GGMLType::TQ2_0,
                     GGMLType::IQ2_XS, GGMLType::Q3_K, GGMLType::Q2_K}) {
    const int64_t K = 512, N = 21, M = 5;
    const QWeight W = make_weight(rng, t, N, K);
    const auto X = randv(rng, size_t(M * K), 2.0f);
    std::vector<float> Y(size_t(M * N));
    be->matmul(X.data(), M, be->prepare(W.view()), Y.data());
    std::vector<double> ref, mag;
    ref_gemm(X.data(), M, W, ref, mag);
    double worst = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, bound = 0;
        for (int64_t b = 0; b < K / 32; ++b) {
          double amax = 0;
          for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(X[size_t(m * K + 32 * b + i)])));
          for (int i = 0; i < 32; ++i) {
            const int64_t k = 32 * b + i;
            const double w = W.deq[size_t(n * K + k)];
            exact += double(X[size_t(m * K + k)]) * w;
            bound += std::fabs(w) * amax / 127 / 2 * (1 + 1e-5);
          }
        }
        const size_t i = size_t(m * N + n);
        ASSERT_NEAR(Y[i], exact, bound + gemm_tol(K, mag[i])) << type_traits(t).name << " m=" << m << " n=" << n;
        worst = std::max(worst, std::fabs(Y[i] - exact) / bound);
      }
    EXPECT_GT(worst, 0.0) << "the integer path should differ from f32 somewhere";
  }
}

// A row's result must not depend on how many rows are in the batch (chunked prefill == one
// batch, decode GEMV == prefill GEMM): bit-identical.
TEST_P(KernelTest, GemmRowsIndependentOfM) {
  auto be = backend_for(GetParam());
  std::mt19937 rng(7);
  for (GGMLType t : {GGMLType::F32, GGMLType::F16, GGMLType::BF16, GGMLType::Q8_0, GGMLType::Q4_0,
                     GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::MXFP4, GGMLType::IQ4_NL,
                     GGMLType::IQ4_XS, GGMLType::IQ1_S, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::IQ1_M}) {
    const int64_t K = 768, N = 37, M = 67;
    const QWeight W = make_weight(rng, t, N, K);
    const auto X = randv(rng, size_t(M * K));
    std::vector<float> all(static_cast<size_t>(M * N)), part(static_cast<size_t>(M * N));
    be->matmul(X.data(), M, W.view(), all.data());
    // Any sub-batch, rows or packed layout: the same bits.
    const WeightView packed = be->prepare(W.view());
    for (const WeightView& v : {W.view(), packed})
      for (int64_t m0 : {0, 1, 2, 3, 7, 65, 66})
        for (int64_t mc : {1, 2, 3, 4, 5, 6, 13, 64}) {
          if (m0 + mc > M) continue;
          be->matmul(X.data() + m0 * K, mc, v, part.data());
          for (int64_t i = 0; i < mc * N; ++i)
            ASSERT_EQ(part[size_t(i)], all[size_t(m0 * N + i)])
                << type_traits(t).name << " m0=" << m0 << " M=" << mc << " i=" << i;
        }
  }
}

// Large M runs in row blocks (kernels_impl.h: row_blocks), block by block: a row's result must
// still be the bits it gets in any small batch (so, by GemmBitIdenticalToScalar, the scalar
// set's), through every epilogue: store with bias and fused RoPE, residual add with a LoRA run
// that crosses the block boundary, the gated FFN.
TEST_P(KernelTest, GemmLargeMRowBlocksIndependentOfM) {
  auto be = backend_for(GetParam());
  std::mt19937 rng(29);
  // K = 2304: blocks of 256 rows, so M = 521 is 2 blocks (260 + 261).
  const int64_t K = 2304, hd = 16, Nq = 2 * hd, Nk = 19, M = 521, R = 16, lo_run = 40, hi_run = 300;
  RopeParams rp;
  rp.style = RopeStyle::Interleaved;
  rp.n_rot = int32_t(hd);
  rp.freq_base = 10000.0f;
  std::vector<int32_t> pos(static_cast<size_t>(M));
  for (auto& p : pos) p = int32_t(rng() % 5000);
  std::vector<float> cs(size_t(M * hd));
  be->rope_table(pos.data(), M, rp, cs.data());
  const auto X = randv(rng, size_t(M * K));
  const auto bq = randv(rng, size_t(Nq));
  const auto ya = randv(rng, size_t((hi_run - lo_run) * R));
  const auto R0 = randv(rng, size_t(M * Nk));
  for (GGMLType t : {GGMLType::F16, GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K,
                     GGMLType::MXFP4, GGMLType::IQ4_XS, GGMLType::Q5_0, GGMLType::Q4_1}) {
    SCOPED_TRACE(type_traits(t).name);
    const QWeight Wq = make_weight(rng, t, Nq, K), Wk = make_weight(rng, t, Nk, K), Wu = make_weight(rng, t, Nq, K);
    const QWeight B = make_weight(rng, GGMLType::F16, Nk, R);
    // All three epilogues over rows [m0, m0 + n) of the batch, into rows [m0, m0 + n) of the outputs.
    struct Out {
      std::vector<float> q, k, res, ffn;
    };
    auto run = [&](Backend& b, int64_t m0, int64_t n, Out& o) {
      Backend::MatmulTarget tg[2] = {{b.prepare(Wq.view()), o.q.data() + m0 * Nq, Nq, bq.data()},
                                     {b.prepare(Wk.view()), o.k.data() + m0 * Nk, Nk, nullptr}};
      tg[0].rope_cs = cs.data() + m0 * hd;
      tg[0].rope_head_dim = int32_t(hd);
      tg[0].rope_n_rot = int32_t(hd);
      b.matmul_multi(X.data() + m0 * K, n, tg, 2);
      const int64_t lo = std::max(lo_run, m0), hi = std::min(hi_run, m0 + n);
      const LoraRun lr{lo - m0, hi - lo, ya.data() + (lo - lo_run) * R, R, b.prepare(B.view())};
      b.matmul_add(X.data() + m0 * K, n, b.prepare(Wk.view()), o.res.data() + m0 * Nk, LoraDelta{&lr, hi > lo ? 1 : 0});
      b.ffn_glu(X.data() + m0 * K, n, b.prepare(Wq.view()), b.prepare(Wu.view()), GateAct::SiLU, o.ffn.data() + m0 * Nq);
    };
    auto fresh = [&] { return Out{std::vector<float>(size_t(M * Nq)), std::vector<float>(size_t(M * Nk)), R0,
                                  std::vector<float>(size_t(M * Nq))}; };
    Out all = fresh(), parts = fresh();
    run(*be, 0, M, all);
    for (int64_t m0 = 0, n = 1; m0 < M; m0 += n, n = n % 23 + 1) run(*be, m0, std::min(n, M - m0), parts);
    auto same = [&](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << what << " at " << i;
    };
    same(all.q, parts.q, "q (bias, rope) vs small batches");
    same(all.k, parts.k, "k vs small batches");
    same(all.res, parts.res, "residual + lora vs small batches");
    same(all.ffn, parts.ffn, "gated ffn vs small batches");
  }
}

TEST_P(KernelTest, FusedQkvResidualSwiglu) {
  std::mt19937 rng(3);
  for (GGMLType t : {GGMLType::F32, GGMLType::Q4_0, GGMLType::Q6_K, GGMLType::MXFP4, GGMLType::IQ4_XS, GGMLType::Q5_1}) {
    // (A backend per type: prepare caches by address, and the next type's weights may reuse one.)
    auto be = backend_for(GetParam());
    const int64_t K = 512, Nq = 40, Nk = 13;
    // V in another type, as Q4_K_M files mix Q4_K and Q6_K within one layer (and Q5_0 or Q5_1
    // with the K types where rows are no multiple of 256).
    const GGMLType tv = t == GGMLType::F32 ? GGMLType::F16 : t == GGMLType::Q6_K || t == GGMLType::Q5_0 ? GGMLType::Q4_K
                        : t == GGMLType::Q5_1 ? GGMLType::Q6_K : GGMLType::Q8_0;
    const QWeight Wq = make_weight(rng, t, Nq, K), Wk = make_weight(rng, t, Nk, K), Wv = make_weight(rng, tv, Nk, K);
    const QWeight Wu = make_weight(rng, t, Nq, K);
    const auto bq = randv(rng, size_t(Nq)), bk = randv(rng, size_t(Nk));
    for (int64_t M : {1, 3, 5, 8, 17, 64})
    for (bool packed : {false, true}) {
      auto view = [&](const QWeight& w) { return packed ? be->prepare(w.view()) : w.view(); };
      const auto X = randv(rng, size_t(M * K));
      // Q, K, V written into one (M, Nq + 2 Nk) buffer through row strides; V without bias.
      const int64_t ld = Nq + 2 * Nk;
      std::vector<float> Y(size_t(M * ld), 0);
      const Backend::MatmulTarget tg[3] = {{view(Wq), Y.data(), ld, bq.data()},
                                           {view(Wk), Y.data() + Nq, ld, bk.data()},
                                           {view(Wv), Y.data() + Nq + Nk, ld, nullptr}};
      be->matmul_multi(X.data(), M, tg, 3);
      const QWeight* ws[3] = {&Wq, &Wk, &Wv};
      const float* bs[3] = {bq.data(), bk.data(), nullptr};
      const int64_t off[3] = {0, Nq, Nq + Nk};
      for (int s = 0; s < 3; ++s) {
        std::vector<double> ref, mag;
        ref_gemm(X.data(), M, *ws[s], ref, mag);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < ws[s]->N; ++n) {
            const size_t i = size_t(m * ws[s]->N + n);
            ASSERT_NEAR(Y[size_t(m * ld + off[s] + n)], ref[i] + (bs[s] ? bs[s][n] : 0.0), gemm_tol(K, mag[i]) + 1e-5);
          }
      }
      // Residual: R += X Wq^T.
      auto R = randv(rng, size_t(M * Nq));
      const auto R0 = R;
      be->matmul_add(X.data(), M, view(Wq), R.data());
      std::vector<double> ref, mag;
      ref_gemm(X.data(), M, Wq, ref, mag);
      for (size_t i = 0; i < R.size(); ++i) ASSERT_NEAR(R[i], R0[i] + ref[i], gemm_tol(K, mag[i]) + 1e-5);
      // Gated FFN: A = act(X Wg^T) * (X Wu^T) with Wg = Wq, Wu = a second (Nq, K) weight, act =
      // SiLU or GELU (tanh form).
      std::vector<double> refu, magu;
      ref_gemm(X.data(), M, Wu, refu, magu);
      for (GateAct act : {GateAct::SiLU, GateAct::GeluTanh}) {
        std::vector<float> A(size_t(M * Nq));
        be->ffn_glu(X.data(), M, view(Wq), view(Wu), act, A.data());
        for (size_t i = 0; i < A.size(); ++i) {
          const double g = ref[i], u = refu[i];
          const double want = ref_act(act, g) * u;
          // d(act(g) u) = act'(g) u dg + act(g) du, |act'| <= 1.13, |act(g)| <= |g| + 0.3
          const double tol = 1.13 * std::fabs(u) * gemm_tol(K, mag[i]) +
                             (std::fabs(g) + 0.3) * gemm_tol(K, magu[i]) + 1e-6 * std::fabs(want) + 1e-7;
          ASSERT_NEAR(A[i], want, tol) << type_traits(t).name << " M=" << M << " i=" << i << " act " << int(act);
        }
      }
    }
  }
}

// RoPE fused into the QKV epilogue (interleaved pairs, from the batch's cos/sin table) gives
// exactly what the GEMM followed by the separate RoPE pass gives; n_rot < head_dim leaves the
// tail dims alone; positions are arbitrary per row.
TEST_P(KernelTest, FusedRopeEqualsSeparate) {
  auto be = backend_for(GetParam());
  std::mt19937 rng(5);
  const int64_t K = 96, hd = 32, Nq = 3 * hd, Nk = hd;
  for (int32_t n_rot : {32, 16}) {
    RopeParams rp;
    rp.style = RopeStyle::Interleaved;
    rp.n_rot = n_rot;
    rp.freq_base = 10000.0f;
    const QWeight Wq = make_weight(rng, GGMLType::Q8_0, Nq, K), Wk = make_weight(rng, GGMLType::F16, Nk, K);
    const auto bq = randv(rng, size_t(Nq));
    for (int64_t M : {1, 5, 19}) {
      const auto X = randv(rng, size_t(M * K));
      std::vector<int32_t> pos(static_cast<size_t>(M));
      for (auto& p : pos) p = int32_t(rng() % 5000);
      std::vector<float> cs(size_t(M * n_rot));
      be->rope_table(pos.data(), M, rp, cs.data());
      std::vector<float> q1(size_t(M * Nq)), k1(size_t(M * Nk)), q2 = q1, k2 = k1;
      Backend::MatmulTarget plain[2] = {{be->prepare(Wq.view()), q1.data(), Nq, bq.data()},
                                        {be->prepare(Wk.view()), k1.data(), Nk, nullptr}};
      be->matmul_multi(X.data(), M, plain, 2);
      be->rope(q1.data(), M, int32_t(Nq / hd), int32_t(hd), pos.data(), rp);
      be->rope(k1.data(), M, int32_t(Nk / hd), int32_t(hd), pos.data(), rp);
      Backend::MatmulTarget fused[2] = {plain[0], plain[1]};
      fused[0].Y = q2.data();
      fused[1].Y = k2.data();
      for (auto& t : fused) {
        t.rope_cs = cs.data();
        t.rope_head_dim = int32_t(hd);
        t.rope_n_rot = n_rot;
      }
      be->matmul_multi(X.data(), M, fused, 2);
      for (size_t i = 0; i < q1.size(); ++i) ASSERT_EQ(q1[i], q2[i]) << "q n_rot=" << n_rot << " M=" << M << " i=" << i;
      for (size_t i = 0; i < k1.size(); ++i) ASSERT_EQ(k1[i], k2[i]) << "k n_rot=" << n_rot << " M=" << M << " i=" << i;
      // And the rotation really happened (unrotated output differs where pos != 0).
      std::vector<float> q0(size_t(M * Nq));
      Backend::MatmulTarget none = plain[0];
      none.Y = q0.data();
      be->matmul_multi(X.data(), M, &none, 1);
      bool differs = false;
      for (size_t i = 0; i < q0.size(); ++i) differs = differs || q0[i] != q2[i];
      EXPECT_TRUE(differs);
    }
  }
}

// The row-wise maps (gated product, soft cap, scale) of every backend against double references
// on odd sizes; each is a few float operations from its definition, so 1e-6 relative.
void check_rowwise_maps(Backend& be) {
  std::mt19937 rng(17);
  for (int64_t M : {1, 3}) {
    for (int64_t n : {1, 7, 33, 257}) {
      const auto gate = randv(rng, size_t(M * n), 6.0f), up = randv(rng, size_t(M * n), 2.0f);
      for (GateAct act : {GateAct::SiLU, GateAct::GeluTanh}) {
        std::vector<float> a(size_t(M * n));
        be.glu(gate.data(), up.data(), act, a.data(), M, n);
        for (size_t i = 0; i < a.size(); ++i) {
          const double want = ref_act(act, gate[i]) * up[i];
          ASSERT_NEAR(a[i], want, 1e-6 * (std::fabs(want) + std::fabs(up[i]))) << "act " << int(act) << " i " << i;
        }
      }
      // gpt-oss's: both inputs past its clamps (7) on either side
      const auto g2 = randv(rng, size_t(M * n), 12.0f), u2 = randv(rng, size_t(M * n), 12.0f);
      std::vector<float> a(size_t(M * n));
      be.glu(g2.data(), u2.data(), GateAct::SwigluOai, a.data(), M, n);
      for (size_t i = 0; i < a.size(); ++i) {
        const double x = std::min(double(g2[i]), 7.0), y = std::clamp(double(u2[i]), -7.0, 7.0);
        const double want = x / (1.0 + std::exp(-1.702 * x)) * (y + 1.0);
        ASSERT_NEAR(a[i], want, 1e-6 * (std::fabs(want) + std::fabs(y) + 1.0)) << "swiglu_oai " << g2[i] << " " << u2[i];
      }
      for (float cap : {0.5f, 30.0f}) {
        auto x = randv(rng, size_t(M * n), 100.0f);
        const auto x0 = x;
        be.softcap(x.data(), M * n, cap);
        for (size_t i = 0; i < x.size(); ++i) {
          const double want = cap * std::tanh(double(x0[i]) / cap);
          ASSERT_NEAR(x[i], want, 1e-6 * cap) << "cap " << cap << " x " << x0[i];
        }
      }
      auto x = randv(rng, size_t(M * n), 3.0f);
      const auto x0 = x;
      be.scale(x.data(), M * n, 11.3137f);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(x[i], x0[i] * 11.3137f);
    }
  }
  // RMSNorm (its sum of squares in partial sums: sizes below, at and past one vector of 8,
  // odd) against the definition in double: y = x / sqrt(mean(x^2) + eps) * w, three float
  // roundings from it, so 1e-6 relative.
  for (int64_t M : {1, 3}) {
    for (int64_t n : {1, 7, 8, 9, 33, 257, 2051}) {
      const auto x = randv(rng, size_t(M * n), 4.0f), w = randv(rng, size_t(n), 2.0f);
      std::vector<float> y(size_t(M * n));
      const float eps = 1e-5f;
      be.rmsnorm(x.data(), w.data(), y.data(), M, n, eps);
      for (int64_t m = 0; m < M; ++m) {
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(m * n + i)]) * x[size_t(m * n + i)];
        const double r = 1.0 / std::sqrt(ss / double(n) + eps);
        for (int64_t i = 0; i < n; ++i) {
          const double want = double(x[size_t(m * n + i)]) * r * w[size_t(i)];
          ASSERT_NEAR(y[size_t(m * n + i)], want, 1e-6 * std::fabs(want) + 1e-30) << "n " << n << " i " << i;
        }
      }
    }
  }
}

// Paged KV for one layer in the cache's layout (kv_layout.h): n_seqs sequences of capacity cap,
// blocks handed out in shuffled order, every position written with random K/V through kv_store.
struct PagedKV {
  KVGeometry geo;
  std::vector<uint8_t> k, v;
  std::vector<std::vector<int32_t>> tables;
  PagedKV(std::mt19937& rng, GGMLType type, int n_seqs, int cap, int32_t bs, int32_t heads, int32_t hd)
      : geo{type, heads, hd, bs} {
    const int per = (cap + bs - 1) / bs, n_blocks = per * n_seqs + 3;
    k.assign(size_t(n_blocks) * size_t(heads) * geo.k_head_bytes(), 0);
    v.assign(size_t(n_blocks) * size_t(heads) * geo.v_head_bytes(), 0);
    std::vector<int32_t> ids(static_cast<size_t>(n_blocks));
    for (int i = 0; i < n_blocks; ++i) ids[size_t(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int s = 0; s < n_seqs; ++s) tables.emplace_back(ids.begin() + s * per, ids.begin() + (s + 1) * per);
    for (int s = 0; s < n_seqs; ++s)
      for (int p = 0; p < per * bs; ++p)
        for (int h = 0; h < heads; ++h) {
          const auto kr = randv(rng, size_t(hd)), vr = randv(rng, size_t(hd));
          const uint64_t b = uint64_t(tables[size_t(s)][size_t(p / bs)]) * uint64_t(heads) + uint64_t(h);
          kv_store(geo, k.data() + b * geo.k_head_bytes(), v.data() + b * geo.v_head_bytes(), p % bs, kr.data(),
                   vr.data());
        }
  }
  KVLayerView view(int s) const { return {geo, k.data(), v.data(), tables[size_t(s)].data()}; }
  // Position pos of KV head h as stored, in f32.
  void load(int s, int pos, int h, float* kk, float* vv) const {
    const KVLayerView kv = view(s);
    kv_load(geo, kv.k_tile(pos, h), nullptr, pos % kKvTile, kk, nullptr);
    kv_load_v_row(geo, kv.v_row(pos, h), vv);
  }
};

// Naive softmax attention in double over the stored K/V; with Q8_0 the query quantized as
// kv_quantize_query defines (the semantics of Q.K on int8 dot products).
void ref_attention(const float* q, int64_t M, const PagedKV& kv, const int* seq, const int32_t* n_ctx,
                   const AttentionShape& s, std::vector<double>& out) {
  const int group = s.n_heads / s.n_kv_heads, hd = s.head_dim;
  const int64_t qdim = int64_t(s.n_heads) * hd;
  out.assign(size_t(M * qdim), 0);
  std::vector<float> kk(static_cast<size_t>(hd)), vv(static_cast<size_t>(hd)), qd(static_cast<size_t>(hd));
  std::vector<double> qs(static_cast<size_t>(hd));
  std::vector<int8_t> qq(static_cast<size_t>(hd));
  std::vector<int32_t> qsum(static_cast<size_t>(hd));
  for (int64_t m = 0; m < M; ++m)
    for (int h = 0; h < s.n_heads; ++h) {
      const float* qh = q + m * qdim + h * hd;
      if (kv.geo.type == GGMLType::Q8_0) {
        kv_quantize_query(qh, hd, s.scale, qq.data(), qd.data(), qsum.data());
        for (int i = 0; i < hd; ++i) qs[size_t(i)] = double(qd[size_t(i / kKvQBlock)]) * qq[size_t(i)];
      } else {
        for (int i = 0; i < hd; ++i) qs[size_t(i)] = double(qh[i]) * s.scale;
      }
      // Visible: [lo, n_ctx), the last s.window positions with a window; scores soft-capped.
      const int lo = s.window > 0 ? std::max(0, n_ctx[m] - s.window) : 0;
      std::vector<double> sc(size_t(n_ctx[m]), 0.0);
      double mx = -1e300;
      for (int j = lo; j < n_ctx[m]; ++j) {
        kv.load(seq[m], j, h / group, kk.data(), vv.data());
        double d = 0;
        for (int i = 0; i < hd; ++i) d += qs[size_t(i)] * kk[size_t(i)];
        if (s.softcap > 0) d = s.softcap * std::tanh(d / s.softcap);
        sc[size_t(j)] = d;
        mx = std::max(mx, d);
      }
      // A sink (gpt-oss): one more logit, in the maximum and the denominator only.
      if (s.sinks) mx = std::max(mx, double(s.sinks[h]));
      double sum = s.sinks ? std::exp(double(s.sinks[h]) - mx) : 0.0;
      for (int j = lo; j < n_ctx[m]; ++j) sum += (sc[size_t(j)] = std::exp(sc[size_t(j)] - mx));
      for (int j = lo; j < n_ctx[m]; ++j) {
        kv.load(seq[m], j, h / group, kk.data(), vv.data());
        for (int i = 0; i < hd; ++i) out[size_t(m * qdim + h * hd + i)] += sc[size_t(j)] / sum * vv[size_t(i)];
      }
    }
}

constexpr GGMLType kKvTypes[] = {GGMLType::F32, GGMLType::F16, GGMLType::BF16, GGMLType::Q8_0};

// Every KV type, GQA shapes with odd head sizes (40: a Q8_0 head of 32 + 8; 36: 32 + 4; 8: one
// short block), a prefill chunk of one sequence and decode entries of another in one batch,
// against ref_attention; |v| <= 1, so 2e-5 absolute is the bound stated at the top.
// The sliding window (odd widths: inside one chunk, across chunks so whole chunks are skipped,
// wider than any context = none) and the soft cap, alone and together, on two of the shapes.
// Sinks (gpt-oss) on two shapes, one with a window: each head's in [-4, 4], one far above every
// score (+40: the outputs shrink toward 0) and one far below (-40: no effect).
void check_attention(Backend& be, bool decode_alone_identical) {
  std::mt19937 rng(11);
  struct Shape { int heads, kv_heads, hd; int window = 0; float softcap = 0; bool sinks = false; };
  const Shape shapes[] = {{12, 4, 64}, {4, 4, 8}, {6, 1, 40}, {9, 3, 36}, {16, 2, 64},
                          {6, 1, 40, 37}, {9, 3, 36, 0, 2.5f}, {12, 4, 64, 100, 1.5f}, {4, 4, 8, 1}, {4, 4, 8, 1000},
                          {12, 4, 64, 0, 0, true}, {6, 1, 40, 37, 0, true}};
  for (GGMLType type : kKvTypes)
    for (Shape sh : shapes) {
      std::vector<float> sinks = randv(rng, size_t(sh.heads), 4.0f);
      sinks[0] = 40.0f;
      sinks[1] = -40.0f;
      const AttentionShape s{sh.heads, sh.kv_heads, sh.hd, 1.0f / std::sqrt(float(sh.hd)), sh.softcap, sh.window,
                             sh.sinks ? sinks.data() : nullptr};
      const int cap = 300;
      const PagedKV kv(rng, type, 2, cap, 16, sh.kv_heads, sh.hd);
      const int64_t qdim = int64_t(sh.heads) * sh.hd;
      // (Sanitizer builds: the first and last positions only, and a 9-row chunk at the last: a
      // 40-row chunk at 250 is ~85% of the pairs, ~40 s there.)
      for (int p0 : test::kSanitized ? std::vector<int>{0, 250} : std::vector<int>{0, 33, 250}) {
        for (int chunk : {1, test::kSanitized && p0 > 0 ? 9 : 40}) {
          std::vector<int> seq;
          std::vector<int32_t> n_ctx;
          std::vector<KVLayerView> views;
          for (int i = 0; i < chunk && p0 + i < cap; ++i) {
            seq.push_back(0);
            n_ctx.push_back(p0 + i + 1);
          }
          for (int p : {0, 31, 299}) {
            seq.push_back(1);
            n_ctx.push_back(p + 1);
          }
          const int64_t M = int64_t(seq.size());
          for (int64_t i = 0; i < M; ++i) views.push_back(kv.view(seq[size_t(i)]));
          const auto q = randv(rng, size_t(M * qdim), 2.0f);
          std::vector<float> out(size_t(M * qdim), -7.0f);
          be.attention(q.data(), M, views.data(), n_ctx.data(), s, out.data());
          std::vector<double> ref;
          ref_attention(q.data(), M, kv, seq.data(), n_ctx.data(), s, ref);
          for (size_t i = 0; i < out.size(); ++i)
            ASSERT_NEAR(out[i], ref[i], 2e-5) << kv_type_name(type) << " heads " << sh.heads << "/" << sh.kv_heads
                                              << " hd " << sh.hd << " window " << sh.window << " softcap " << sh.softcap
                                              << " sinks " << sh.sinks
                                              << " p0 " << p0 << " chunk " << chunk << " at " << i;
          if (!decode_alone_identical) continue;
          // Each entry alone (decode-style) gives bit-identical results.
          std::vector<float> one(static_cast<size_t>(qdim));
          for (int64_t i : {int64_t(0), M - 1}) {
            be.attention(q.data() + i * qdim, 1, views.data() + i, n_ctx.data() + i, s, one.data());
            for (int64_t d = 0; d < qdim; ++d) ASSERT_EQ(one[size_t(d)], out[size_t(i * qdim + d)]);
          }
        }
      }
    }
}

TEST_P(KernelTest, FlashAttentionEveryKvTypeCausalGqaChunks) {
  auto be = backend_for(GetParam());
  check_attention(*be, true);
}

TEST(ReferenceBackend, AttentionEveryKvType) { check_attention(*make_backend("reference", 2), false); }

TEST_P(KernelTest, RowwiseGatedSoftcapScale) { check_rowwise_maps(*backend_for(GetParam())); }
TEST(ReferenceBackend, RowwiseGatedSoftcapScale) { check_rowwise_maps(*make_backend("reference", 2)); }

// kv_store then kv_load gives each type's rounding and nothing else: f32 exact, f16 within
// 2^-11 relative (2^-25 absolute below its normal range), bf16 2^-8, q8_0 within half its block's step (max|x| / 254) with one scale per
// 32 values of a head (a tail block of tiny values keeps its own fine step).
// exp_cephes, the SwiGLU's exp (one definition for every ISA), within 2 ulp of exp wherever it
// does not clamp, and exactly 0 below its range.
TEST(Rowwise, ExpCephesWithinTwoUlpOfExp) {
  for (float x = -87.0f; x < 88.3f; x += 0.00731f) {
    const double want = std::exp(double(x));
    const float w = float(want), ulp = std::nextafter(w, INFINITY) - w;
    ASSERT_LE(std::fabs(double(rowwise::exp_cephes(x)) - want), 2.0 * double(ulp)) << "x " << x;
  }
  EXPECT_EQ(rowwise::exp_cephes(-87.5f), 0.0f);
  EXPECT_EQ(rowwise::exp_cephes(-INFINITY), 0.0f);
  EXPECT_NEAR(rowwise::silu(-200.0f), 0.0f, 1e-35f);  // (-200 / exp(hi): exp clamps, finite)
}

// exp_shifted (the sampler's softmax) on every ISA gives exp_cephes((x - shift) / div)'s bits,
// odd lengths (vector tails), values below exp's range (exactly 0) and out == x included.
TEST_P(KernelTest, ExpShiftedBitIdenticalToScalar) {
  cpu::IsaLevel level = cpu::IsaLevel::Scalar;
  for (cpu::IsaLevel l : cpu::kIsaLevels)
    if (std::string_view(cpu::isa_name(l)) == GetParam()) level = l;
  const cpu::ExpShiftedFn f = cpu::exp_shifted_for(level);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-40, 12);
  for (const int64_t n : {1, 7, 8, 9, 31, 1001}) {
    std::vector<float> x(static_cast<size_t>(n)), out(x.size());
    for (auto& v : x) v = u(rng);
    x[0] = -1e4f;  // (x - shift) / div far below -87.3
    for (const float div : {1.0f, 0.7f}) {
      f(x.data(), n, 11.5f, div, out.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(out[size_t(i)], rowwise::exp_cephes((x[size_t(i)] - 11.5f) / div)) << GetParam() << " n " << n << " i " << i;
      EXPECT_EQ(out[0], 0.0f);
      std::vector<float> in_place = x;
      f(in_place.data(), n, 11.5f, div, in_place.data());
      EXPECT_EQ(in_place, out);
    }
  }
  std::vector<float> x = {0.25f, -3.0f}, out(2);
  exp_shifted(x.data(), 2, 0.25f, 2.0f, out.data());  // (the dispatched one)
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], rowwise::exp_cephes(-3.25f / 2.0f));
}

// The SwiGLU epilogue of every ISA (its vector silu) gives the scalar path's bits, for gates
// far beyond exp's clamp too (X scaled so |gate| reaches ~100), a group's tail included (N odd).
TEST_P(KernelTest, SwigluEpilogueBitIdenticalToScalar) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(23);
  const int64_t K = 64, N = 37;
  for (GGMLType t : {GGMLType::F32, GGMLType::Q8_0}) {
    const QWeight Wg = make_weight(rng, t, N, K), Wu = make_weight(rng, t, N, K);
    for (int64_t M : {1, 5, 17}) {
      const auto X = randv(rng, size_t(M * K), 40.0f);
      std::vector<float> a(size_t(M * N)), b(size_t(M * N));
      native->ffn_glu(X.data(), M, native->prepare(Wg.view()), native->prepare(Wu.view()), GateAct::SiLU, a.data());
      scalar->ffn_glu(X.data(), M, scalar->prepare(Wg.view()), scalar->prepare(Wu.view()), GateAct::SiLU, b.data());
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(a[i], b[i]) << type_traits(t).name << " M=" << M << " at " << i;
    }
  }
}

// Decode with float weights takes two work items (4 groups) per pass where both have two
// groups (Drivers::gemv_items): enough rows that threads' runs hold pairs, an odd group count
// (the last item alone), pairs across the Q/K/V targets' boundaries and SwiGLU's (gate, up)
// items. Every output is the scalar path's bits.
TEST_P(KernelTest, DecodeFloatItemPairsBitIdenticalToScalar) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(29);
  const int64_t K = 72;
  for (GGMLType t : {GGMLType::F32, GGMLType::F16, GGMLType::BF16}) {
    for (int64_t N : {197, 256}) {
      const QWeight Wq = make_weight(rng, t, N, K), Wk = make_weight(rng, t, 48, K), Wv = make_weight(rng, t, 80, K),
                    Wu = make_weight(rng, t, N, K);
      const auto X = randv(rng, size_t(K), 4.0f);
      const auto bias = randv(rng, size_t(N));
      auto run = [&](Backend& be, std::vector<float>& y) {
        const int64_t ld = N + 48 + 80;
        y.assign(size_t(ld + 2 * N), 0.5f);
        const Backend::MatmulTarget tg[3] = {{be.prepare(Wq.view()), y.data(), ld, bias.data()},
                                             {be.prepare(Wk.view()), y.data() + N, ld, nullptr},
                                             {be.prepare(Wv.view()), y.data() + N + 48, ld, nullptr}};
        be.matmul_multi(X.data(), 1, tg, 3);
        be.matmul_add(X.data(), 1, be.prepare(Wu.view()), y.data() + ld);
        be.ffn_glu(X.data(), 1, be.prepare(Wq.view()), be.prepare(Wu.view()), GateAct::SiLU, y.data() + ld + N);
      };
      std::vector<float> a, b;
      run(*native, a);
      run(*scalar, b);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << type_traits(t).name << " N=" << N << " at " << i;
    }
  }
}

TEST(KvLayout, StoreLoadWithinEachTypesRounding) {
  std::mt19937 rng(5);
  for (GGMLType type : kKvTypes)
    for (int hd : {8, 36, 64}) {
      const KVGeometry g{type, 1, hd, 32};
      std::vector<uint8_t> k(g.k_head_bytes()), v(g.v_head_bytes());
      for (int row : {0, 5, 17, 31}) {
        auto x = randv(rng, size_t(hd), 3.0f), y = randv(rng, size_t(hd), 3.0f);
        for (int d = 32; d < hd; ++d) x[size_t(d)] *= 1e-3f, y[size_t(d)] *= 1e-3f;
        kv_store(g, k.data(), v.data(), row, x.data(), y.data());
        std::vector<float> xk(static_cast<size_t>(hd)), yv(static_cast<size_t>(hd));
        kv_load(g, k.data(), v.data(), row, xk.data(), yv.data());
        for (int d = 0; d < hd; ++d)
          for (auto [orig, back] : {std::pair{x, xk}, std::pair{y, yv}}) {
            const float o = orig[size_t(d)], r = back[size_t(d)];
            float bound = 0;
            if (type == GGMLType::F16) bound = std::max(std::fabs(o) * 0x1p-11f, 0x1p-25f);  // (subnormals: 2^-24 steps)
            if (type == GGMLType::BF16) bound = std::fabs(o) * 0x1p-8f;
            if (type == GGMLType::Q8_0) {
              float amax = 0;
              for (int i = d / 32 * 32; i < std::min(hd, d / 32 * 32 + 32); ++i) amax = std::max(amax, std::fabs(orig[size_t(i)]));
              bound = amax / 254.0f * 1.0001f;
            }
            ASSERT_LE(std::fabs(r - o), bound) << kv_type_name(type) << " hd " << hd << " row " << row << " d " << d;
          }
      }
    }
}

// f16 KV rows are converted 8 at a time (F16C where the CPU has it): every stored half is the
// scalar f32_to_f16's, for odd head sizes and values across the whole range (subnormal results,
// ties, overflow to inf, zeros of both signs).
TEST(KvLayout, F16StoreBitIdenticalToScalarConversion) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-30, 17), coin(0, 1);
  for (int hd : {1, 7, 8, 67, 130}) {
    const KVGeometry g{GGMLType::F16, 1, hd, 32};
    std::vector<uint8_t> k(g.k_head_bytes()), v(g.v_head_bytes());
    for (int row : {0, 13, 16, 31}) {
      std::vector<float> x(static_cast<size_t>(hd)), y(static_cast<size_t>(hd));
      for (auto* a : {&x, &y})
        for (float& e : *a) e = std::ldexp(mant(rng), expo(rng)) * (coin(rng) ? -1.0f : 1.0f);
      x[0] = -0.0f;
      if (hd > 2) y[2] = 65520.0f;  // rounds to inf
      if (hd > 3) x[3] = 0x1.0p-25f;  // a tie at the smallest subnormal: rounds to even (0)
      kv_store(g, k.data(), v.data(), row, x.data(), y.data());
      const uint8_t* tile = k.data() + uint64_t(row / kKvTile) * g.k_tile_bytes();
      for (int d = 0; d < hd; ++d) {
        uint16_t kh, vh;
        std::memcpy(&kh, tile + (uint64_t(d) * kKvTile + uint64_t(row % kKvTile)) * 2, 2);
        std::memcpy(&vh, v.data() + uint64_t(row) * g.v_row_bytes() + uint64_t(d) * 2, 2);
        ASSERT_EQ(kh, f32_to_f16(x[size_t(d)])) << "hd " << hd << " row " << row << " d " << d << " x " << x[size_t(d)];
        ASSERT_EQ(vh, f32_to_f16(y[size_t(d)])) << "hd " << hd << " row " << row << " d " << d << " y " << y[size_t(d)];
      }
    }
  }
}

// MXFP4's rows in their GEMM form (convert_rows: Q8_0 rows of the same values), and those values.
QWeight converted(const QWeight& W) {
  const GGMLType pt = GGMLType::Q8_0;
  QWeight C{pt, W.N, W.K, std::vector<uint8_t>(*row_bytes(pt, uint64_t(W.K)) * uint64_t(W.N)),
            std::vector<float>(size_t(W.N * W.K))};
  cpu::convert_rows(W.type, W.bytes.data(), *row_bytes(W.type, uint64_t(W.K)), W.N, W.K, C.bytes.data());
  dequantize_row(pt, C.bytes.data(), C.deq.data(), W.N * W.K);
  return C;
}

// Q2_K (its own layout: u = sc q, s1 = d, a min per 16 k) multiplies by packed.h's integer
// contract, computed here from the GGUF blocks: per 32-block I = sum sc q xq, y = fma(float(I),
// d dx, y), then for each half h y = fma(-(dmin m_h), dx float(X_h), y) (X_h the sum of half
// h's xq). Bit for bit on every ISA at every M (decode's GEMV, the tiles to 32 rows, the GEMM's
// unpacked chunks beyond; K = 768: three 256-blocks), packed or GGUF rows. Row 3 is all-one
// bytes (q = 3, sc = m = 15: u = 45 throughout, whose pair sums would pass int16 within a
// block); row 4's halves have different mins (0 and 15), so a min term taken per 32-block, or
// with its halves swapped, is off.
TEST_P(KernelTest, Q2KMultipliesItsIntegerForm) {
  std::mt19937 rng(67);
  const int64_t N = 67, K = 768, nkb = K / 32;  // (5 groups: decode's pass over 4 at once, and 1)
  QWeight W = make_weight(rng, GGMLType::Q2_K, N, K);
  const uint64_t rb = *row_bytes(GGMLType::Q2_K, uint64_t(K));
  auto rows = [&](int64_t n) { return reinterpret_cast<blocks::Q2_K*>(W.bytes.data() + uint64_t(n) * rb); };
  for (int64_t b = 0; b < K / 256; ++b) {
    std::memset(&rows(3)[b], 0xFF, offsetof(blocks::Q2_K, d));  // (scales and qs)
    for (int h = 0; h < 16; ++h) rows(4)[b].scales[h] = uint8_t((h % 2 ? 0xF0 : 0x00) | (rng() % 16));
  }
  auto be = backend_for(GetParam());
  const WeightView pw = be->prepare(W.view());
  ASSERT_EQ(pw.type, GGMLType::Q2_K);
  for (int64_t M : {1, 2, 5, 8, 9, 16, 17, 32, 33, 64}) {
    const auto X = randv(rng, size_t(M * K));
    std::vector<float> a(size_t(M * N)), b(size_t(M * N));
    be->matmul(X.data(), M, pw, a.data());
    be->matmul(X.data(), M, W.view(), b.data());
    std::vector<int16_t> xq(static_cast<size_t>(K));
    std::vector<float> dx(static_cast<size_t>(nkb));
    std::vector<int32_t> xs(static_cast<size_t>(nkb));
    for (int64_t m = 0; m < M; ++m) {
      quantize_activations(X.data() + m * K, K, xq.data(), dx.data(), xs.data());
      for (int64_t n = 0; n < N; ++n) {
        float y = 0;
        for (int64_t kb = 0; kb < nkb; ++kb) {
          const blocks::Q2_K& blk = rows(n)[kb / 8];
          int32_t I = 0, Xh[2] = {0, 0};
          for (int h = 0; h < 2; ++h) {
            const int e0 = int(kb % 8) * 32 + 16 * h, sm = blk.scales[e0 / 16];
            for (int e = e0; e < e0 + 16; ++e) {
              const int32_t x = xq[size_t(kb * 32 + e - e0 + 16 * h)];
              I += (sm & 0xF) * blocks::q2k_q(blk, e) * x;
              Xh[h] += x;
            }
          }
          y = std::fma(float(I), f16_to_f32(load_u16(blk.d)) * dx[size_t(kb)], y);
          for (int h = 0; h < 2; ++h) {
            const int mh = blk.scales[(kb % 8) * 2 + h] >> 4;
            y = std::fma(-(f16_to_f32(load_u16(blk.dmin)) * float(mh)), dx[size_t(kb)] * float(Xh[h]), y);
          }
        }
        const size_t i = size_t(m * N + n);
        ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(y)) << "M=" << M << " m=" << m << " n=" << n;
        ASSERT_EQ(std::bit_cast<uint32_t>(b[i]), std::bit_cast<uint32_t>(y)) << "M=" << M << " m=" << m << " n=" << n << " (rows)";
      }
    }
  }
}

// MXFP4 always keeps its own packed layout (packed.h: 18 bytes per 32 weights of a row, Q4_0's)
// and multiplies the same integers and scales as its exact Q8_0 conversion: native packed ==
// GGUF rows == the Q8_0 conversion packed == the scalar ISA's, bit for bit, at every M (the GEMV
// up to 32 rows, the GEMM's unpacked chunks beyond; K = 736: a partial last chunk), and within
// gemm_tol of the double reference, across the f16 scales' extremes (e = 104, 2^-24, the least
// subnormal; 143, 2^15, the largest; rows mixing them). Scales below f16 (e < 104: every |value|
// <= 12 * 2^-25) are computed as 0 (a row of only those gives exactly 0), an all-zero block with a
// scale beyond f16 too; a nonzero block beyond f16 (e >= 144) or any e = 255 is refused, packed
// or not (the loader names the tensor: Synthetic.Mxfp4RefusedScalesFailTheLoad).
TEST_P(KernelTest, Mxfp4NativeEqualsItsQ8_0Conversion) {
  std::mt19937 rng(31);
  const int64_t N = 37, K = 736, nb = K / 32;
  QWeight W = make_weight(rng, GGMLType::MXFP4, N, K);
  const uint64_t rb = *row_bytes(GGMLType::MXFP4, uint64_t(K));
  auto blk = [&](QWeight& w, int64_t n, int64_t b) { return w.bytes.data() + uint64_t(n) * rb + uint64_t(b) * 17; };
  auto redo = [&](QWeight& w) {
    for (int64_t n = 0; n < N; ++n) dequantize_row(GGMLType::MXFP4, w.bytes.data() + uint64_t(n) * rb, w.deq.data() + n * K, K);
  };
  std::memset(blk(W, 3, 5), 0, 17);                 // zeros with e = 0 (scale 2^-128: packed as +0)
  std::memset(blk(W, 4, 6) + 1, 0x88, 16);          // -0 indices under its own e
  blk(W, 7, 1)[0] = 104;                            // the least f16 scale, 2^-24 (a subnormal)
  blk(W, 8, nb - 1)[0] = 143;                       // the largest, 2^15
  blk(W, 20, 9)[0] = 113;                           // 2^-15 (a subnormal)
  for (int64_t b = 0; b < nb; ++b) {
    blk(W, 9, b)[0] = b % 2 ? 104 : 143;            // a row alternating the extremes
    blk(W, 10, b)[0] = uint8_t(104 + b * 39 / (nb - 1));  // every step from 104 to 143
    blk(W, 10, b)[1] = 0x7F;                        // (+-12: indices 7 and 15)
  }
  // Tiny scales (e < 104): computed as 0, nibbles and all.
  blk(W, 12, 2)[0] = 0;
  blk(W, 13, 4)[0] = 103;
  blk(W, 14, 7)[0] = 50;
  for (int64_t b = 0; b < nb; ++b) blk(W, 15, b)[0] = uint8_t(b * 103 / (nb - 1));  // a row of only those
  std::memset(blk(W, 16, 3) + 1, 0x80, 16);         // an all-zero block (0, -0) beyond f16: +0
  blk(W, 16, 3)[0] = 200;
  std::memset(blk(W, 17, 0) + 1, 0x08, 16);
  blk(W, 17, 0)[0] = 254;
  redo(W);
  QWeight Z = W;  // the values as computed: tiny-scale blocks 0
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b)
      if (blk(W, n, b)[0] < 104) std::fill_n(Z.deq.begin() + n * K + 32 * b, 32, 0.0f);
  EXPECT_TRUE(std::any_of(W.deq.begin() + 15 * K, W.deq.begin() + 16 * K, [](float v) { return v != 0; }))
      << "(tiny nonzero values the kernels drop)";
  EXPECT_NO_THROW(cpu::check_packable(GGMLType::MXFP4, W.bytes.data(), rb, N, K));
  auto be = backend_for(GetParam()), scalar = backend_for("scalar");
  const WeightView pw = be->prepare(W.view());
  EXPECT_EQ(pw.type, GGMLType::MXFP4);
  EXPECT_EQ(cpu::group_bytes(GGMLType::MXFP4, K), uint64_t(K / 32 * 16 * 18));  // (Q8_0: 34 per 32)
  const QWeight C = converted(W);
  const WeightView pc = be->prepare(C.view()), ps = scalar->prepare(W.view());
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 24, 31, 32, 33, 40, 64, 250}) {
    const auto X = randv(rng, size_t(M * K));
    std::vector<float> native(size_t(M * N)), rows(size_t(M * N)), q8(size_t(M * N)), sc(size_t(M * N));
    be->matmul(X.data(), M, pw, native.data());
    be->matmul(X.data(), M, W.view(), rows.data());
    be->matmul(X.data(), M, pc, q8.data());
    scalar->matmul(X.data(), M, ps, sc.data());
    std::vector<double> ref, mag;
    ref_gemm(X.data(), M, Z, ref, mag);
    for (size_t i = 0; i < native.size(); ++i) {
      ASSERT_EQ(native[i], q8[i]) << "M=" << M << " at " << i;
      ASSERT_EQ(native[i], rows[i]) << "M=" << M << " at " << i;
      ASSERT_EQ(native[i], sc[i]) << "M=" << M << " at " << i;
      ASSERT_TRUE(std::isfinite(native[i])) << "M=" << M << " at " << i;
      ASSERT_NEAR(native[i], ref[i], gemm_tol(K, mag[i])) << "M=" << M << " at " << i;
    }
    for (int64_t m = 0; m < M; ++m) ASSERT_EQ(native[size_t(m * N + 15)], 0.0f) << "M=" << M << " m " << m;
  }
  // Refused: a nonzero block with e >= 144 (2^16: beyond f16; the old Q8_0 fallback's d overflowed
  // to inf from e = 148), and e = 255 (NaN) even on an all-zero block. prepare, the unprepared
  // rows' GEMV and GEMM, and check_packable all fail with an error naming MXFP4 and e.
  struct Bad {
    int e;
    bool zero;
  };
  for (const Bad bad : {Bad{144, false}, Bad{150, false}, Bad{254, false}, Bad{255, false}, Bad{255, true}}) {
    const int e = bad.e;
    const bool zero = bad.zero;
    QWeight B = W;
    blk(B, 30, 2)[0] = uint8_t(e);
    if (zero) std::memset(blk(B, 30, 2) + 1, 0, 16);
    else blk(B, 30, 2)[1] = 0x01;  // (a nonzero value)
    const std::string want = cat("e = ", e);
    auto expect_refused = [&](auto f, const char* what) {
      try {
        f();
        ADD_FAILURE() << what << ": e " << e << " accepted";
      } catch (const Error& err) {
        const std::string msg = err.what();
        EXPECT_NE(msg.find("MXFP4"), std::string::npos) << msg;
        EXPECT_NE(msg.find(want), std::string::npos) << msg;
      }
    };
    auto b2 = backend_for(GetParam());  // (a fresh cache: prepare caches by address)
    expect_refused([&] { cpu::check_packable(GGMLType::MXFP4, B.bytes.data(), rb, N, K); }, "check_packable");
    expect_refused([&] { b2->prepare(B.view()); }, "prepare");
    for (int64_t M : {1, 40}) {
      const auto X = randv(rng, size_t(M * K));
      std::vector<float> Y(size_t(M * N));
      expect_refused([&] { b2->matmul(X.data(), M, B.view(), Y.data()); }, "rows");
    }
  }
}

// MXFP4's extreme blocks: every weight +-12 (indices 7 and 15, scale 1) against activations
// +-1 (quantized to +-127, dx = 1/127), so a 32-block's sum I reaches +-12 x 127 x 32 = +-48768,
// past int16 (plain avx2's vpmaddubsw pairs of u = kvalues[q] + 12 would pass 32767 by the sixth
// quad). Every ISA, packed and GGUF rows, GEMV and GEMM: bit for bit the scalar ISA's, and the
// exact integer result 12 x sum(sign w x sign x) (I/127 per block: float rounding only).
TEST_P(KernelTest, Mxfp4ExtremeBlocksExact) {
  std::mt19937 rng(77);
  const int64_t N = 37, K = 256, nb = K / 32;
  const uint64_t rb = *row_bytes(GGMLType::MXFP4, uint64_t(K));
  std::vector<int8_t> sw(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      sw[size_t(n * K + k)] = int8_t(n == 0 ? 1 : n == 1 ? -1 : n == 2 ? (k % 2 ? -1 : 1) : (rng() & 1 ? 1 : -1));
  QWeight W{GGMLType::MXFP4, N, K, std::vector<uint8_t>(rb * uint64_t(N)), std::vector<float>(size_t(N * K))};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = W.bytes.data() + uint64_t(n) * rb + uint64_t(b) * 17;
      blk[0] = 128;  // scale 1
      for (int j = 0; j < 32; ++j) {
        const int q = sw[size_t(n * K + 32 * b + j)] > 0 ? 7 : 15;
        blk[1 + j % 16] = uint8_t(blk[1 + j % 16] | (q << (j < 16 ? 0 : 4)));
      }
    }
  for (int64_t n = 0; n < N; ++n) dequantize_row(GGMLType::MXFP4, W.bytes.data() + uint64_t(n) * rb, W.deq.data() + n * K, K);
  for (int64_t i = 0; i < N * K; ++i) ASSERT_EQ(W.deq[size_t(i)], 12.0f * sw[size_t(i)]);
  auto be = backend_for(GetParam()), scalar = backend_for("scalar");
  const WeightView pw = be->prepare(W.view()), ps = scalar->prepare(W.view());
  ASSERT_EQ(pw.type, GGMLType::MXFP4);
  for (int64_t M : {1, 2, 3, 4, 5, 8, 16, 17, 33, 40, 64}) {
    std::vector<float> X(size_t(M * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        X[size_t(m * K + k)] = m == 0 ? 1.0f : m == 1 ? -1.0f : m == 2 ? (k % 3 ? 1.0f : -1.0f) : (rng() & 1 ? 1.0f : -1.0f);
    std::vector<float> native(size_t(M * N)), rows(size_t(M * N)), sc(size_t(M * N));
    be->matmul(X.data(), M, pw, native.data());
    be->matmul(X.data(), M, W.view(), rows.data());
    scalar->matmul(X.data(), M, ps, sc.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = size_t(m * N + n);
        int64_t I = 0;  // 12 x sum(sign w x sign x): exact (each block's 127-multiples / 127)
        for (int64_t k = 0; k < K; ++k) I += 12 * sw[size_t(n * K + k)] * (X[size_t(m * K + k)] > 0 ? 1 : -1);
        if (m < 2 && n < 2) {  // (all aligned: every block +-48768 / 127)
          ASSERT_EQ(std::abs(I), 12 * K);
        }
        ASSERT_EQ(native[i], sc[i]) << "M=" << M << " m " << m << " n " << n;
        ASSERT_EQ(rows[i], sc[i]) << "M=" << M << " m " << m << " n " << n;
        ASSERT_NEAR(native[i], double(I), 12.0 * K * 0x1p-20) << "M=" << M << " m " << m << " n " << n;
      }
  }
}

// W (exact values) times +-1 activations (xq = +-127, dx = 1/127) on ISA isa, prepared and as
// GGUF rows, at every row count: the scalar ISA's bits, and within 2^-20 of sum |w| (and twice
// the min terms, k_min) of the exact sum.
void expect_exact_against_pm1(const std::string& isa, const QWeight& W, std::mt19937& rng) {
  const int64_t N = W.N, K = W.K;
  auto be = backend_for(isa), scalar = backend_for("scalar");
  const WeightView pw = be->prepare(W.view()), ps = scalar->prepare(W.view());
  ASSERT_EQ(pw.type, W.type);
  for (int64_t M : {1, 2, 3, 4, 5, 8, 16, 17, 33, 40, 64}) {
    std::vector<float> X(size_t(M * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        X[size_t(m * K + k)] = m == 0 ? 1.0f : m == 1 ? -1.0f : (rng() % 8 ? 1.0f : -1.0f);
    std::vector<float> native(size_t(M * N)), rows(size_t(M * N)), sc(size_t(M * N));
    be->matmul(X.data(), M, pw, native.data());
    be->matmul(X.data(), M, W.view(), rows.data());
    scalar->matmul(X.data(), M, ps, sc.data());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = size_t(m * N + n);
        double want = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          want += double(W.deq[size_t(n * K + k)]) * X[size_t(m * K + k)];
          mag += std::fabs(double(W.deq[size_t(n * K + k)])) + 2 * k_min(W, n, k);
        }
        ASSERT_EQ(native[i], sc[i]) << "M=" << M << " m " << m << " n " << n;
        ASSERT_EQ(rows[i], sc[i]) << "M=" << M << " m " << m << " n " << n;
        ASSERT_NEAR(native[i], want, mag * 0x1p-20) << "M=" << M << " m " << m << " n " << n;
      }
  }
}

// The level types, Q5_0, Q4_1 and Q5_1 on their own layouts (packed.h), from raw random blocks
// (any index, sign, 5th bit and scale bits) under a power-of-two d (and m), so every weight is
// exact: IQ4_NL and
// IQ4_XS with every level and every 6-bit scale (IQ4_XS ls in [0, 63], sc = ls - 32), the grid
// types with every grid entry their random indices reach; against +-1 activations (xq = +-127).
// A third of the rows are all-zero bytes (IQ4's extreme level -127 under sc = -32: each
// 32-block's sum reaches 127 x 127 x 32, and plain AVX2's signed pair sums are 2 x 127 x 127
// each), Q5_0's and Q5_1's all-one bytes (u = 31 throughout: eight quads' unsigned pair sums
// would pass int16), the ternary types' too (TQ2_0: q = 3, value +2d, which a file may hold).
// The ternary types' d is their last 2 bytes. Every ISA, every row count, packed or GGUF rows, gives the scalar path's bits and the
// exact sums.
TEST_P(KernelTest, NibbleTypesExactFromRawBlocks) {
  std::mt19937 rng(79);
  for (GGMLType t : {GGMLType::IQ4_NL, GGMLType::IQ4_XS, GGMLType::IQ2_XXS, GGMLType::IQ3_XXS, GGMLType::IQ3_S,
                     GGMLType::IQ1_S, GGMLType::Q5_0, GGMLType::Q4_1, GGMLType::Q5_1, GGMLType::TQ1_0, GGMLType::TQ2_0,
                     GGMLType::IQ2_XS, GGMLType::IQ2_S, GGMLType::IQ1_M, GGMLType::Q3_K, GGMLType::Q2_K}) {
    SCOPED_TRACE(type_traits(t).name);
    const int64_t N = 19, K = 512;
    const uint64_t rb = *row_bytes(t, uint64_t(K)), bb = type_traits(t).type_size;
    const bool ternary = t == GGMLType::TQ1_0 || t == GGMLType::TQ2_0;
    QWeight W{t, N, K, std::vector<uint8_t>(rb * uint64_t(N)), std::vector<float>(size_t(N * K))};
    for (int64_t n = 0; n < N; ++n)
      for (uint64_t b = 0; b < rb / bb; ++b) {
        uint8_t* blk = W.bytes.data() + uint64_t(n) * rb + b * bb;
        // (IQ4: level 0, -127; ls 0. TQ2_0: every q = 3, +2, which ggml never writes. The
        // levels16 types: every step 2s + 1 its largest. Q3_K: every q -4 under scale -32, a
        // value of 128 d, packed as -128 (-d). Q2_K: every q 3 under scale and min 15, u = 45.)
        const bool sub16 = t == GGMLType::IQ2_XS || t == GGMLType::IQ2_S || t == GGMLType::IQ1_M;
        const uint8_t extreme = t == GGMLType::Q5_0 || t == GGMLType::Q5_1 || ternary || sub16 || t == GGMLType::Q2_K ? 0xFF : 0;
        for (uint64_t i = 0; i < bb; ++i) blk[i] = n % 3 == 2 ? extreme : uint8_t(rng());
        const uint16_t d = uint16_t(0x1800 + 0x400 * (rng() % 4));  // f16 2^-9 .. 2^-6
        if (t == GGMLType::IQ1_M) {  // (d's bits 4i .. 4i + 3 at bits 12-15 of its scales' u16 i)
          auto& x = *reinterpret_cast<blocks::IQ1_M*>(blk);
          for (int i = 0; i < 4; ++i) x.scales[2 * i + 1] = uint8_t((x.scales[2 * i + 1] & 0x0F) | ((d >> (4 * i)) & 0xF) << 4);
        } else if (t == GGMLType::Q2_K) {  // (d, then dmin, last)
          const uint16_t dmin = uint16_t(0x1800 + 0x400 * (rng() % 4));
          std::memcpy(blk + bb - 4, &d, 2);
          std::memcpy(blk + bb - 2, &dmin, 2);
        } else {  // (d last in the ternary types and Q3_K, first in the others)
          std::memcpy(blk + (ternary || t == GGMLType::Q3_K ? bb - 2 : 0), &d, 2);
        }
        if (t == GGMLType::Q4_1 || t == GGMLType::Q5_1) {  // m: +-2^-8 .. 2^-5
          const uint16_t m = uint16_t(0x1C00 + 0x400 * (rng() % 4) + (rng() % 2 ? 0x8000 : 0));
          std::memcpy(blk + 2, &m, 2);
        }
        if (t == GGMLType::IQ4_XS && n % 3 != 2) {  // ls of sub-block j: every value in turn
          auto& x = *reinterpret_cast<blocks::IQ4_XS*>(blk);
          uint16_t sh = 0;
          for (int j = 0; j < 8; ++j) {
            const int ls = int((n * 16 + int64_t(b) * 8 + j) % 64);
            x.scales_l[j / 2] = uint8_t((x.scales_l[j / 2] & (0xF0 >> 4 * (j % 2))) | (ls & 0xF) << 4 * (j % 2));
            sh = uint16_t(sh | (ls >> 4) << 2 * j);
          }
          std::memcpy(x.scales_h, &sh, 2);
        }
      }
    for (int64_t n = 0; n < N; ++n) dequantize_row(t, W.bytes.data() + uint64_t(n) * rb, W.deq.data() + n * K, K);
    std::set<int> levels, scales;
    for (int64_t n = 0; n < N; ++n)
      for (uint64_t b = 0; b < rb / bb; ++b) {
        const uint8_t* blk = W.bytes.data() + uint64_t(n) * rb + b * bb;
        if (t == GGMLType::IQ4_XS)
          for (int j = 0; j < 8; ++j) scales.insert(blocks::scale_iq4xs(*reinterpret_cast<const blocks::IQ4_XS*>(blk), j));
        if (t != GGMLType::IQ4_XS && t != GGMLType::IQ4_NL) continue;
        const uint8_t* qs = t == GGMLType::IQ4_XS ? blk + offsetof(blocks::IQ4_XS, qs) : blk + 2;
        for (uint64_t i = 0; i < (t == GGMLType::IQ4_XS ? 128u : 16u); ++i) levels.insert(qs[i] & 0xF), levels.insert(qs[i] >> 4);
      }
    if (t == GGMLType::IQ4_XS || t == GGMLType::IQ4_NL) {
      ASSERT_EQ(levels.size(), 16u);
    }
    if (t == GGMLType::IQ4_XS) {
      ASSERT_EQ(scales.size(), 64u);
    }
    ASSERT_NO_FATAL_FAILURE(expect_exact_against_pm1(GetParam(), W, rng));
  }
}

// Q3_K (the levels16 layout: -d, sc - 32, levels -q; its GEMM chunks in Q8_0's form) multiplies
// exactly what Q8_0 rows of d' = -d, q' = -q (sc - 32) (in [-128, 124]) do, as it ran until it
// had a layout of its own: bit for bit, on every ISA, at every M (the half-block GEMV, the
// chunks above 16 rows, the GEMM's unpacked chunks above 32; K = 768: three 256-blocks, chunks of
// 256), packed or GGUF rows. Row 5 is all-zero bytes under its d: every q' = -128.
TEST_P(KernelTest, Q3KEqualsItsExactQ8_0Form) {
  std::mt19937 rng(61);
  const int64_t N = 37, K = 768;
  QWeight W = make_weight(rng, GGMLType::Q3_K, N, K);
  const uint64_t rb = *row_bytes(GGMLType::Q3_K, uint64_t(K)), rb8 = *row_bytes(GGMLType::Q8_0, uint64_t(K));
  auto* row5 = reinterpret_cast<blocks::Q3_K*>(W.bytes.data() + 5 * rb);
  for (int64_t b = 0; b < K / 256; ++b) std::memset(&row5[b], 0, offsetof(blocks::Q3_K, d));
  QWeight Q{GGMLType::Q8_0, N, K, std::vector<uint8_t>(rb8 * uint64_t(N)), {}};
  for (int64_t n = 0; n < N; ++n) {
    const auto* src = reinterpret_cast<const blocks::Q3_K*>(W.bytes.data() + uint64_t(n) * rb);
    auto* dst = reinterpret_cast<blocks::Q8_0*>(Q.bytes.data() + uint64_t(n) * rb8);
    for (int64_t e = 0; e < K; ++e) {
      const blocks::Q3_K& b = src[e / 256];
      blocks::Q8_0& o = dst[e / 32];
      const uint16_t neg_d = uint16_t((b.d[0] | b.d[1] << 8) ^ 0x8000);
      std::memcpy(o.d, &neg_d, 2);
      const int q = -blocks::q3k_q(b, int(e % 256)) * (blocks::scale_k3(int(e % 256) / 16, b.scales) - 32);
      ASSERT_TRUE(q >= -128 && q <= 124) << q;
      o.qs[e % 32] = int8_t(q);
    }
  }
  EXPECT_EQ(int8_t(reinterpret_cast<const blocks::Q8_0*>(Q.bytes.data() + 5 * rb8)[0].qs[0]), -128);
  auto be = backend_for(GetParam());
  const WeightView p3 = be->prepare(W.view()), p8 = be->prepare(Q.view());
  ASSERT_EQ(p3.type, GGMLType::Q3_K);
  for (int64_t M : {1, 2, 6, 7, 16, 17, 32, 33, 64}) {
    const auto X = randv(rng, size_t(M * K));
    std::vector<float> a(size_t(M * N)), b(size_t(M * N)), c(size_t(M * N));
    be->matmul(X.data(), M, p3, a.data());
    be->matmul(X.data(), M, W.view(), b.data());
    be->matmul(X.data(), M, p8, c.data());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(c[i])) << "M=" << M << " at " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(b[i]), std::bit_cast<uint32_t>(c[i])) << "M=" << M << " at " << i << " (rows)";
    }
  }
}

// A block whose scale in the file is inf or NaN, on the types that run on their own layouts
// (the levels layouts', the legacy ones'): each output it reaches is inf or NaN on every ISA, as
// the scalar path's (NaN where that is NaN: the same exact integer times the same scale), in
// decode and prefill, packed or GGUF rows; every other output is the scalar path's bits. (ggml
// computes such a block's values as inf or NaN too.) N = 131: decode's pass over four groups
// at one row (avx512) too.
TEST_P(KernelTest, NonFiniteScalesReachOnlyTheirOutputs) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(83);
  for (GGMLType t : {GGMLType::IQ4_NL, GGMLType::IQ4_XS, GGMLType::IQ2_XS, GGMLType::TQ2_0, GGMLType::Q5_0,
                     GGMLType::Q4_1, GGMLType::Q3_K, GGMLType::Q2_K}) {
    SCOPED_TRACE(type_traits(t).name);
    const int64_t N = 131, K = 512;
    QWeight W = make_weight(rng, t, N, K);
    const uint64_t rb = *row_bytes(t, uint64_t(K)), bb = type_traits(t).type_size;
    const uint64_t d_at = t == GGMLType::TQ2_0 || t == GGMLType::Q3_K ? bb - 2 : t == GGMLType::Q2_K ? bb - 4 : 0;
    const uint16_t inf = 0x7c00, nan = 0x7e00;
    std::memcpy(W.bytes.data() + 4 * rb + bb + d_at, &inf, 2);  // (row 4, its second block)
    std::memcpy(W.bytes.data() + 9 * rb + d_at, &nan, 2);       // (row 9, its first)
    for (int64_t M : {1, 3, 40}) {
      const auto X = randv(rng, size_t(M * K));
      std::vector<float> a(size_t(M * N)), b(size_t(M * N));
      for (bool packed : {false, true}) {
        native->matmul(X.data(), M, packed ? native->prepare(W.view()) : W.view(), a.data());
        scalar->matmul(X.data(), M, packed ? scalar->prepare(W.view()) : W.view(), b.data());
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            const size_t i = size_t(m * N + n);
            if (n == 4 || n == 9) {
              ASSERT_FALSE(std::isfinite(a[i])) << "M=" << M << " m=" << m << " n=" << n << (packed ? " packed" : " rows");
              ASSERT_EQ(std::isnan(a[i]), std::isnan(b[i])) << "M=" << M << " m=" << m << " n=" << n;
            } else {
              ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i]))
                  << "M=" << M << " m=" << m << " n=" << n << (packed ? " packed" : " rows");
            }
          }
      }
    }
  }
}

// Q5_K at its extremes: every q = 31 (5th bit set) under scale 1 and no min, against +-1
// activations (xq = +-127): each 32-block's products reach 31 x 127 x 32 = 125984, so any SIMD
// sum that stayed in int16 past four quads (avx2's vpmaddubsw pairs: 2 x 31 x 127 each)
// overflows. Rows mix all-31 blocks with alternating 31/0 ones (a 5th bit set and not); every
// ISA, every row count, packed or GGUF rows, gives the scalar path's bits and the exact sums.
TEST_P(KernelTest, Q5KExtremeBlocksExact) {
  std::mt19937 rng(78);
  const int64_t N = 19, K = 512, nb = K / 256;
  const uint64_t rb = *row_bytes(GGMLType::Q5_K, uint64_t(K));
  QWeight W{GGMLType::Q5_K, N, K, std::vector<uint8_t>(rb * uint64_t(N)), std::vector<float>(size_t(N * K))};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      auto& blk = reinterpret_cast<blocks::Q5_K*>(W.bytes.data() + uint64_t(n) * rb)[b];
      const uint16_t one = 0x3C00;  // f16 1.0
      std::memcpy(blk.d, &one, 2);
      std::memset(blk.dmin, 0, 2);
      // scale_min_k4: sub-blocks 0-3 take scales[0..3] & 63 (mins scales[4..7]), 4-7 the low
      // nibbles of scales[8..11] (mins their high nibbles): every scale 1, every min 0.
      for (int j = 0; j < 12; ++j) blk.scales[j] = j < 4 ? 1 : j < 8 ? 0 : 0x01;
      const bool all = n % 3 != 2;  // (else q alternates 31, 0 along k)
      std::memset(blk.qs, all ? 0xFF : 0x0F, sizeof blk.qs);  // (low nibble: even sub-blocks)
      std::memset(blk.qh, all ? 0xFF : 0x55, sizeof blk.qh);  // (bit s: sub-block s)
    }
  for (int64_t n = 0; n < N; ++n) dequantize_row(GGMLType::Q5_K, W.bytes.data() + uint64_t(n) * rb, W.deq.data() + n * K, K);
  for (int64_t i = 0; i < N * K; ++i) {
    const bool all = (i / K) % 3 != 2, even_sub = (i % 256) / 32 % 2 == 0;
    ASSERT_EQ(W.deq[size_t(i)], all || even_sub ? 31.0f : 0.0f) << i;
  }
  expect_exact_against_pm1(GetParam(), W, rng);
}

INSTANTIATE_TEST_SUITE_P(Isa, KernelTest, ::testing::ValuesIn(kIsas),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Every instruction set computes the same fma chains over the same weight values (and exact
// integer block sums on the integer path, whatever instructions form them): their GEMM results
// are bit-identical to the scalar path's (so a model gives the same tokens with any FT_ISA), for
// packed and unprepared weights, decode (M <= 4) and every tile remainder, and across the
// 240-row blocks of the integer GEMM.
TEST_P(KernelTest, GemmBitIdenticalToScalar) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(11);
  for (const auto& tc : type_cases()) {
    const int64_t K = tc.Ks.back(), N = 37;
    const QWeight W = make_weight(rng, tc.type, N, K);
    for (bool pack : {true, false})
      for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 24, 31, 32, 33, 40, 47, 250}) {
        const auto X = randv(rng, size_t(M * K));
        std::vector<float> a(size_t(M * N)), b(size_t(M * N));
        native->matmul(X.data(), M, pack ? native->prepare(W.view()) : W.view(), a.data());
        scalar->matmul(X.data(), M, pack ? scalar->prepare(W.view()) : W.view(), b.data());
        for (size_t i = 0; i < a.size(); ++i)
          ASSERT_EQ(a[i], b[i]) << type_traits(tc.type).name << " M=" << M << " packed " << pack << " at " << i;
      }
  }
}

// BF16 weights on the numerics of vdpbf16ps (kernels_impl.h), on the values random data never
// gives: denormal weights and activations (taken as zero), partial sums that fall below 2^-126
// (flushed to zero), activations on a rounding tie, an odd K; in one batch (M = 3) +-inf and a NaN
// among the activations (NaN where the scalar path gives NaN). Each ISA gives the scalar path's
// bits: the vector ones emulate the instruction (MXCSR flushes their FMAs) or run it
// (avx512_bf16), the scalar one spells it out.
TEST_P(KernelTest, Bf16WeightsSpecialValuesBitIdenticalToScalar) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(17);
  const int64_t N = 33;
  for (int64_t K : {67, 300}) {
    QWeight W{GGMLType::BF16, N, K, std::vector<uint8_t>(size_t(N * K * 2)), {}};
    for (int64_t i = 0; i < N * K; ++i) {
      const uint32_t r = rng();
      // 1 in 8 a denormal (exponent 0); rows n % 3 == 0 tiny (~2^-64), the others ~1.
      float v = std::ldexp(float(int(r % 2001) - 1000) / 1000.0f, (i / K) % 3 == 0 ? -64 : 0);
      uint16_t b = f32_to_bf16(v);
      if (r % 8 == 0) b = uint16_t((b & 0x8000u) | (1 + (r >> 16) % 127));
      std::memcpy(W.bytes.data() + 2 * i, &b, 2);
    }
    for (int64_t M : {1, 3, 13}) {
      std::vector<float> X(size_t(M * K));
      for (size_t i = 0; i < X.size(); ++i) {
        const uint32_t r = rng();
        // rows m % 2 == 1 tiny (~2^-64: with the tiny weight rows, products below 2^-126)
        float v = std::ldexp(float(int(r % 2001) - 1000) / 1000.0f, (i / size_t(K)) % 2 ? -64 : 0);
        if (r % 16 == 1) v = std::ldexp(float(int(r >> 8 & 1023) - 512), -140);  // denormal
        if (r % 16 == 2) {  // a tie: halfway between two bf16
          uint32_t u;
          std::memcpy(&u, &v, 4);
          u = (u & 0xffff0000u) | 0x8000u;
          std::memcpy(&v, &u, 4);
        }
        X[i] = v;
      }
      if (M == 3) {  // (row 0: +inf and a NaN whose payload is all below bf16's bits, which rounding
                     // alone would make inf; row 2: -inf and the largest float, which rounds up to inf)
        X[5] = std::numeric_limits<float>::infinity();
        const uint32_t nan_bits = 0x7f800001u;
        std::memcpy(&X[7], &nan_bits, 4);
        X[size_t(2 * K + 1)] = -std::numeric_limits<float>::infinity();
        X[size_t(2 * K + 9)] = std::numeric_limits<float>::max();
      }
      for (bool pack : {true, false}) {
        std::vector<float> a(size_t(M * N)), b(size_t(M * N));
        native->matmul(X.data(), M, pack ? native->prepare(W.view()) : W.view(), a.data());
        scalar->matmul(X.data(), M, pack ? scalar->prepare(W.view()) : W.view(), b.data());
        int flushed = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          if (std::isnan(b[i])) {
            ASSERT_TRUE(std::isnan(a[i])) << "K=" << K << " M=" << M << " packed " << pack << " at " << i;
            continue;
          }
          ASSERT_EQ(a[i], b[i]) << "K=" << K << " M=" << M << " packed " << pack << " at " << i;
          ASSERT_EQ(std::signbit(a[i]), std::signbit(b[i])) << "K=" << K << " M=" << M << " at " << i;
          flushed += a[i] == 0.0f;
        }
        // (the tiny x tiny outputs: every partial sum below 2^-126, flushed)
        if (M > 1) {
          EXPECT_GT(flushed, 0) << "K=" << K << " M=" << M;
        }
      }
    }
  }
}

// The integer path's activation quantization (vectorized per ISA) on the blocks random data
// never gives: zeros, ties at the rounding midpoint, values far below and above 1, one block's
// max on its last element, and rows holding inf or NaN. Each ISA's GEMM gives the scalar path's
// bits (NaN where it gives NaN).
TEST_P(KernelTest, IntPathSpecialActivationBlocksBitIdenticalToScalar) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(13);
  const int64_t K = 256, N = 19;
  for (int64_t M : {1, 2, 5, 8, 17}) {
    auto X = randv(rng, size_t(M * K));
    for (int64_t m = 0; m < M; ++m) {
      float* x = X.data() + m * K;
      const int variant = int(m % 5);
      for (int i = 0; i < 32; ++i) x[i] = 0.0f;                                        // block 0
      for (int i = 0; i < 31; ++i) x[32 + i] = float(i % 2 ? 1 : -1) * (i + 0.5f);     // block 1: ties
      x[32 + 31] = 127.0f;  // (so x * 127 / amax = x: every other value a tie)
      for (int i = 0; i < 32; ++i) x[64 + i] *= variant == 1 ? 1e-30f : 3e4f;          // block 2
      x[96 + 31] = 40.0f;                                                              // block 3
      if (variant == 3) x[128 + 7] = std::numeric_limits<float>::infinity();
      if (variant == 4) x[160 + 3] = std::numeric_limits<float>::quiet_NaN();
    }
    for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::MXFP4,
                       GGMLType::IQ4_NL, GGMLType::IQ4_XS, GGMLType::IQ2_XXS, GGMLType::IQ3_XXS, GGMLType::IQ3_S,
                       GGMLType::IQ1_S, GGMLType::Q5_0, GGMLType::Q4_1, GGMLType::Q5_1}) {
      const QWeight W = make_weight(rng, t, N, K);
      std::vector<float> a(size_t(M * N)), b(size_t(M * N));
      native->matmul(X.data(), M, native->prepare(W.view()), a.data());
      scalar->matmul(X.data(), M, scalar->prepare(W.view()), b.data());
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(b[i])) ASSERT_TRUE(std::isnan(a[i])) << type_traits(t).name << " M=" << M << " at " << i;
        else ASSERT_EQ(a[i], b[i]) << type_traits(t).name << " M=" << M << " at " << i;
      }
    }
  }
}

// A packed weight is readable only by the backend that packed it; the reference backend refuses it.
TEST(KernelIsas, PackedLayoutIsBackendPrivate) {
  std::mt19937 rng(12);
  const QWeight W = make_weight(rng, GGMLType::Q8_0, 20, 64);
  auto be = backend_for(cpu_isa());
  const WeightView p = be->prepare(W.view());
  EXPECT_EQ(p.layout, WeightLayout::Packed);
  EXPECT_EQ(be->prepare(W.view()).data, p.data);  // packed once
  std::vector<float> X(64, 0.5f), Y(20);
  EXPECT_THROW(make_backend("reference", 1)->matmul(X.data(), 1, p, Y.data()), std::exception);
}

// Packed weights under 2 MiB share huge-page chunks (fast_backend.cpp's arena): releasing one
// leaves the others of its chunk intact (under ASan a freed chunk would be a use after free),
// and a weight prepared after a release is correct too.
TEST(KernelIsas, SmallPackedWeightsSurviveTheirNeighboursRelease) {
  std::mt19937 rng(13);
  auto be = backend_for(cpu_isa());
  const QWeight A = make_weight(rng, GGMLType::Q4_0, 37, 96), B = make_weight(rng, GGMLType::Q8_0, 21, 64),
                C = make_weight(rng, GGMLType::Q4_0, 40, 64);
  const auto X = randv(rng, size_t(3 * 96));
  auto product = [&](Backend& b, const QWeight& w) {
    std::vector<float> Y(size_t(3 * w.N));
    b.matmul(X.data(), 3, b.prepare(w.view()), Y.data());
    return Y;
  };
  be->prepare(A.view());
  const auto b0 = product(*be, B);
  be->release_prepared(A.bytes.data());
  EXPECT_FALSE(be->has_copy_of(A.bytes.data()));
  EXPECT_EQ(product(*be, B), b0);
  const auto c0 = product(*be, C);
  be->release_prepared(B.bytes.data());
  EXPECT_EQ(product(*be, C), c0);
  EXPECT_EQ(c0, product(*backend_for(cpu_isa()), C));
}

TEST(KernelSelection, ReportsIsa) {
  const auto isas = cpu_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), "scalar");
  if (!std::getenv("FT_ISA")) {
    EXPECT_EQ(cpu_isa(), isas.back());  // the best by default
  }
  for (std::string_view isa : isas) {
    set_cpu_isa(isa);
    EXPECT_EQ(cpu_isa(), isa);
  }
  set_cpu_isa("");
  EXPECT_THROW(set_cpu_isa("sse9"), std::exception);  // not an instruction set
  for (std::string_view isa : kIsas)
    if (!cpu_has(isa)) {
      EXPECT_THROW(set_cpu_isa(isa), std::exception) << isa;  // above this CPU, or not built
    }
  EXPECT_EQ(make_backend("reference", 1)->name(), "reference");
  EXPECT_THROW(make_backend("gpu", 1), std::exception);
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// MXFP4 blocks across the E8M0 range: those whose scale 2^(e - 128) is an f16 (e in [104, 143])
// convert exactly (d = that f16, q = kvalues[q]), bit for bit; smaller ones (their values below
// f16's subnormals: Q8_0 cannot hold them) become (+0, q = 0), as they pack natively; all-zero
// blocks are exact whatever their e; a nonzero block beyond f16 (e >= 144) or e = 255 fails.
TEST(ConvertRows, Mxfp4ExactWhereTheScaleIsAnF16) {
  std::mt19937 rng(9);
  const int64_t N = 3, K = 32 * 44, nb = N * K / 32;
  std::vector<uint8_t> rows(size_t(nb) * 17);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = rows.data() + 17 * b;
    blk[0] = uint8_t(100 + b % 44);  // e in [100, 143]
    for (int j = 1; j < 17; ++j) blk[j] = uint8_t(rng());
    blk[1] = 0x77;  // (+12 in elements 0 and 16: every block's amax is 12 * 2^(e - 128))
  }
  EXPECT_EQ(cpu::mxfp4_f16_scale(103), 0);
  EXPECT_EQ(cpu::mxfp4_f16_scale(104), 0x0001);  // 2^-24, the least f16 subnormal
  EXPECT_EQ(cpu::mxfp4_f16_scale(113), 0x0200);  // 2^-15, a subnormal
  EXPECT_EQ(cpu::mxfp4_f16_scale(114), 0x0400);  // 2^-14, the least normal
  EXPECT_EQ(cpu::mxfp4_f16_scale(128), 0x3C00);  // 1
  EXPECT_EQ(cpu::mxfp4_f16_scale(143), 0x7800);  // 2^15
  EXPECT_EQ(cpu::mxfp4_f16_scale(144), 0);
  EXPECT_EQ(cpu::mxfp4_f16_scale(0), 0);
  std::vector<uint8_t> q8(size_t(nb) * 34);
  const int64_t exact = cpu::convert_rows(GGMLType::MXFP4, rows.data(), uint64_t(K / 32 * 17), N, K, q8.data());
  EXPECT_EQ(exact, N * 40);  // e in [104, 143]
  {  // all-zero blocks (indices 0 and 8) under any e are exact; refused ones fail
    std::vector<uint8_t> z(17, 0x80), o(34);
    for (int e : {0, 103, 144, 200, 254}) {
      z[0] = uint8_t(e);
      EXPECT_EQ(cpu::convert_rows(GGMLType::MXFP4, z.data(), 17, 1, 32, o.data()), 1) << e;
      EXPECT_EQ(o, std::vector<uint8_t>(34, 0)) << e;
    }
    z[0] = 255;
    EXPECT_THROW(cpu::convert_rows(GGMLType::MXFP4, z.data(), 17, 1, 32, o.data()), Error);
    z[0] = 144;
    z[16] = 0x81;
    EXPECT_THROW(cpu::convert_rows(GGMLType::MXFP4, z.data(), 17, 1, 32, o.data()), Error);
  }
  std::vector<float> w(size_t(N * K)), v(size_t(N * K));
  dequantize_row(GGMLType::MXFP4, rows.data(), w.data(), N * K);
  dequantize_row(GGMLType::Q8_0, q8.data(), v.data(), N * K);
  for (int64_t b = 0; b < nb; ++b) {
    const int e = rows[size_t(17 * b)];
    const auto* o = reinterpret_cast<const blocks::Q8_0*>(q8.data()) + b;
    for (int i = 0; i < 32; ++i) {
      const float x = w[size_t(32 * b + i)], y = v[size_t(32 * b + i)];
      if (e >= 104 && e <= 143) {
        ASSERT_EQ(std::bit_cast<uint32_t>(y), std::bit_cast<uint32_t>(x)) << "e " << e << " i " << i;
        const int qi = i < 16 ? rows[size_t(17 * b + 1 + i)] & 15 : rows[size_t(17 * b + 1 + i - 16)] >> 4;
        ASSERT_EQ(int(o->qs[i]), int(blocks::kValuesMXFP4[qi])) << "e " << e << " i " << i;
        ASSERT_EQ(load_u16(o->d), cpu::mxfp4_f16_scale(uint8_t(e)));
      } else {  // e < 104: +0
        ASSERT_EQ(std::bit_cast<uint32_t>(y), 0u) << "e " << e << " i " << i;
        ASSERT_EQ(int(o->qs[i]), 0) << "e " << e << " i " << i;
        ASSERT_EQ(load_u16(o->d), 0) << "e " << e;
        ASSERT_LE(std::fabs(x), 12 * 0x1p-25f) << "e " << e << " i " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// LoRA's kernels (kernels.h): matmul_runs (the segmented shrink) and the deltas each GEMM
// epilogue adds (LoraDelta), against double references on odd shapes: three runs of different
// ranks, A and B types (F32, F16, BF16), scales, with rows in no run between them (they get no
// ya and no delta), packed and GGUF-row weights, a float and an integer-path base weight.
// Tolerances: ya is one fma chain over K times the scale: |scale| * the GEMM bound. The expand
// reference uses the kernel's ya (so the shrink's error is not counted twice): one fma chain
// over the rank, (R + 8) 2^-24 sum|ya b|, plus one f32 add (2^-24 of the sum); the base GEMM's
// own bound as in the other tests; the gated FFN's as FusedQkvResidualSwiglu's, over g + dg.
void check_lora(Backend& be, bool reference) {
  std::mt19937 rng(17);
  // (Every weight lives to the end: prepare() caches by address, which a freed one may reuse.)
  std::deque<QWeight> keep;
  auto make = [&](GGMLType t, int64_t N, int64_t K) -> const QWeight& { return keep.emplace_back(make_weight(rng, t, N, K)); };
  struct RunSpec {
    int64_t m0, n, rank;
    GGMLType ta, tb;
    float scale;
  };
  const std::vector<RunSpec> float_specs = {{0, 4, 3, GGMLType::F32, GGMLType::F32, 0.5f},
                                            {7, 1, 16, GGMLType::F16, GGMLType::F16, 2.0f},
                                            {9, 13, 5, GGMLType::BF16, GGMLType::BF16, -1.25f}};
  // (Runs of up to 4 rows take the epilogue's in-register path, longer ones the unpacked one.)
  const int64_t M = 23, N = 21, ld = 19;  // rows 4, 5, 6, 8, 22: the base (4-5: a Q8_0 A's run where K allows)
  // (The reference backend reads GGUF rows only, and multiplies quantized weights by f32 x, not
  // the integer path kernel_x models.)
  for (const bool packed : {false, true}) {
    if (packed && reference) continue;
    auto view = [&](const QWeight& w) { return packed ? be.prepare(w.view()) : w.view(); };
    for (const GGMLType tw : {GGMLType::F32, GGMLType::Q4_0}) {
      if (tw != GGMLType::F32 && reference) continue;
      const int64_t K = tw == GGMLType::F32 ? 37 : 64;
      // A Q8_0 A (the shrink on the integer path, from row 4: its rows of qa) needs K in whole
      // blocks; the reference backend multiplies quantized weights by f32 x (not kernel_x's).
      std::vector<RunSpec> specs = float_specs;
      if (K % 32 == 0 && !reference) specs.push_back({4, 2, 16, GGMLType::Q8_0, GGMLType::F16, 1.5f});
      const auto X = randv(rng, size_t(M * K));
      std::vector<const QWeight*> A, Bg, Bu;
      for (const RunSpec& r : specs) {
        A.push_back(&make(r.ta, r.rank, K));
        Bg.push_back(&make(r.tb, N, r.rank));
        Bu.push_back(&make(r.tb, N, r.rank));
      }
      // Shrink: ya (M, ld), every run's target in one call; untouched rows keep their sentinel.
      std::vector<float> ya(size_t(M * ld), 777.0f);
      std::vector<RunTarget> targets;
      for (size_t i = 0; i < std::size(specs); ++i)
        targets.push_back({specs[i].m0, specs[i].n, view(*A[i]), ya.data() + specs[i].m0 * ld, ld, specs[i].scale});
      be.matmul_runs(X.data(), K, targets.data(), int(targets.size()));
      std::vector<int> run_of(size_t(M), -1);
      for (size_t i = 0; i < std::size(specs); ++i) {
        const RunSpec& r = specs[i];
        std::vector<double> ref, mag;
        ref_gemm(X.data() + r.m0 * K, r.n, *A[i], ref, mag, false);
        for (int64_t m = 0; m < r.n; ++m) {
          run_of[size_t(r.m0 + m)] = int(i);
          for (int64_t j = 0; j < r.rank; ++j) {
            const size_t k = size_t(m * r.rank + j);
            ASSERT_NEAR(ya[size_t((r.m0 + m) * ld + j)], r.scale * ref[k], std::fabs(r.scale) * gemm_tol(K, mag[k]))
                << be.name() << " run " << i << " m " << m << " j " << j;
          }
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < ld; ++j)
          if (run_of[size_t(m)] < 0 || j >= specs[run_of[size_t(m)]].rank) {
            ASSERT_EQ(ya[size_t(m * ld + j)], 777.0f) << "written outside the runs: m " << m << " j " << j;
          }
      // The deltas' reference over the kernel's ya: d[m][n] and its magnitude, 0 outside the runs.
      auto delta_ref = [&](const std::vector<const QWeight*>& B, std::vector<double>& d, std::vector<double>& dmag) {
        d.assign(size_t(M * N), 0);
        dmag.assign(size_t(M * N), 0);
        for (int64_t m = 0; m < M; ++m) {
          const int i = run_of[size_t(m)];
          if (i < 0) continue;
          for (int64_t n = 0; n < N; ++n)
            for (int64_t r = 0; r < specs[i].rank; ++r) {
              const double p = double(ya[size_t(m * ld + r)]) * B[size_t(i)]->deq[size_t(n * specs[i].rank + r)];
              d[size_t(m * N + n)] += p;
              dmag[size_t(m * N + n)] += std::fabs(p);
            }
        }
      };
      std::vector<LoraRun> rg, ru;
      for (size_t i = 0; i < std::size(specs); ++i) {
        rg.push_back({specs[i].m0, specs[i].n, ya.data() + specs[i].m0 * ld, ld, view(*Bg[i])});
        ru.push_back({specs[i].m0, specs[i].n, ya.data() + specs[i].m0 * ld, ld, view(*Bu[i])});
      }
      const LoraDelta dg{rg.data(), int32_t(rg.size())}, du{ru.data(), int32_t(ru.size())};
      std::vector<double> dref, dmag, uref, umag;
      delta_ref(Bg, dref, dmag);
      delta_ref(Bu, uref, umag);
      const QWeight &Wg = make(tw, N, K), &Wu = make(tw, N, K);
      std::vector<double> gref, gmag, wuref, wumag;
      ref_gemm(X.data(), M, Wg, gref, gmag);
      ref_gemm(X.data(), M, Wu, wuref, wumag);
      auto tol = [&](size_t i, const std::vector<double>& mag, const std::vector<double>& dm, double want) {
        return gemm_tol(K, mag[i]) + gemm_tol(20, dm[i]) + 0x1p-23 * std::fabs(want) + 1e-6;
      };
      const std::string what = cat(be.name(), " ", type_traits(tw).name, packed ? " packed" : " rows");
      // matmul_multi: target 0 with the delta and a bias, target 1 (up) without.
      const auto bias = randv(rng, size_t(N));
      std::vector<float> Y0(size_t(M * N)), Y1(size_t(M * N));
      Backend::MatmulTarget t[2] = {{view(Wg), Y0.data(), N, bias.data()}, {view(Wu), Y1.data(), N}};
      t[0].lora = dg;
      be.matmul_multi(X.data(), M, t, 2);
      for (size_t i = 0; i < Y0.size(); ++i) {
        const double want = gref[i] + dref[i] + bias[i % size_t(N)];
        ASSERT_NEAR(Y0[i], want, tol(i, gmag, dmag, want) + 1e-6) << what << " multi at " << i;
        ASSERT_NEAR(Y1[i], wuref[i], gemm_tol(K, wumag[i])) << what << " multi (no delta) at " << i;
      }
      // matmul_add: R += X Wg^T + d.
      auto R = randv(rng, size_t(M * N));
      const auto R0 = R;
      be.matmul_add(X.data(), M, view(Wg), R.data(), dg);
      for (size_t i = 0; i < R.size(); ++i) {
        const double want = R0[i] + gref[i] + dref[i];
        ASSERT_NEAR(R[i], want, tol(i, gmag, dmag, want) + 1e-6) << what << " add at " << i;
      }
      // ffn_glu: act(X Wg^T + dg) * (X Wu^T + du).
      const LoraDelta both[2] = {dg, du};
      for (GateAct act : {GateAct::SiLU, GateAct::GeluTanh}) {
        std::vector<float> Aout(size_t(M * N));
        be.ffn_glu(X.data(), M, view(Wg), view(Wu), act, Aout.data(), both);
        for (size_t i = 0; i < Aout.size(); ++i) {
          const double g = gref[i] + dref[i], u = wuref[i] + uref[i], want = ref_act(act, g) * u;
          const double t_all = 1.13 * std::fabs(u) * tol(i, gmag, dmag, g) + (std::fabs(g) + 0.3) * tol(i, wumag, umag, u) +
                               1e-6 * std::fabs(want) + 1e-7;
          ASSERT_NEAR(Aout[i], want, t_all) << what << " glu at " << i << " act " << int(act);
        }
      }
    }
  }
}

TEST_P(KernelTest, LoraShrinkAndEpilogueDeltas) { check_lora(*backend_for(GetParam()), false); }
TEST(ReferenceBackend, LoraShrinkAndEpilogueDeltas) { check_lora(*make_backend("reference", 2), true); }

// matmul_runs with few work items (decode: one adapter's shrink is one or two items of two
// groups) gives each thread one group of A's rows per item so none idles; where every target
// is one row of packed A of one type (decode), an ISA with gemv_runs takes up to 4 (target,
// group) pairs per call, their chains side by side (a Q8_0 A: the integer path over the targets'
// rows of the quantized X, K 64). Those paths, at 2 and 3 threads, on odd shapes (A rows not a multiple of 16, K odd, F32/F16/BF16/Q8_0, packed and GGUF
// rows, runs of 1-3 rows at odd offsets): ya within |scale| * the GEMM bound (K + 8) 2^-24
// sum|x a| of the double reference (one fma chain over K, then the scale), and bit-identical to
// the scalar ISA's at 1 thread (two groups per item: the same chains, so the same bits).
TEST_P(KernelTest, LoraShrinkOneGroupPerItem) {
  auto scalar = backend_for("scalar", 1);
  std::mt19937 rng(23);
  std::deque<QWeight> keep;
  struct Spec {
    int64_t m0, n, rank;
    GGMLType ta;
    float scale;
  };
  const std::vector<std::vector<Spec>> cases = {
      {{1, 3, 37, GGMLType::F16, 0.5f}},                                      // 3 groups, one target
      {{0, 1, 19, GGMLType::F32, -1.5f}, {3, 2, 5, GGMLType::BF16, 2.0f}},    // 2 + 1 groups
      {{2, 1, 48, GGMLType::F16, 1.0f}},                                      // Q/K/V's stack shape
      {{0, 1, 16, GGMLType::F32, 0.25f}},                                     // one group: one item
      // A decode batch mixing adapters (one row each, one type): 10 and 5 (target, group)
      // pairs, more than one call of Isa::gemv_runs where the ISA has it.
      {{0, 1, 48, GGMLType::F16, 1.0f}, {1, 1, 48, GGMLType::F16, -0.5f}, {2, 1, 37, GGMLType::F16, 2.0f},
       {4, 1, 16, GGMLType::F16, 0.75f}},
      {{0, 1, 16, GGMLType::F32, 1.0f}, {1, 1, 16, GGMLType::F32, 0.5f}, {2, 1, 16, GGMLType::F32, -1.0f},
       {3, 1, 16, GGMLType::F32, 3.0f}, {5, 1, 9, GGMLType::F32, 1.5f}},
      // Q8_0 A's (K in whole blocks only): the integer path over the targets' rows of the
      // quantized X; a decode batch (one row each: one call per target and two groups).
      {{1, 3, 37, GGMLType::Q8_0, 0.5f}},
      {{0, 1, 48, GGMLType::Q8_0, 1.0f}, {1, 1, 48, GGMLType::Q8_0, -0.5f}, {2, 1, 37, GGMLType::Q8_0, 2.0f},
       {4, 1, 16, GGMLType::Q8_0, 0.75f}},
  };
  const int64_t M = 6, ld = 53;
  for (const int threads : {2, 3})
    for (const bool packed : {false, true})
      for (const int64_t K : {int64_t(37), int64_t(53), int64_t(64)}) {
        auto be = backend_for(GetParam(), threads);
        const auto X = randv(rng, size_t(M * K));
        for (size_t c = 0; c < cases.size(); ++c) {
          if (K % 32 != 0 && cases[c][0].ta == GGMLType::Q8_0) continue;
          std::vector<const QWeight*> A;
          std::vector<RunTarget> t, ts;
          std::vector<float> ya(size_t(M * ld), 777.0f), ys(size_t(M * ld), 777.0f);
          for (const Spec& sp : cases[c]) {
            A.push_back(&keep.emplace_back(make_weight(rng, sp.ta, sp.rank, K)));
            t.push_back({sp.m0, sp.n, packed ? be->prepare(A.back()->view()) : A.back()->view(),
                         ya.data() + sp.m0 * ld, ld, sp.scale});
            ts.push_back({sp.m0, sp.n, packed ? scalar->prepare(A.back()->view()) : A.back()->view(),
                          ys.data() + sp.m0 * ld, ld, sp.scale});
          }
          be->matmul_runs(X.data(), K, t.data(), int(t.size()));
          scalar->matmul_runs(X.data(), K, ts.data(), int(ts.size()));
          const std::string what = cat(GetParam(), " threads ", threads, packed ? " packed" : " rows", " K ", K,
                                       " case ", c);
          for (size_t i = 0; i < ya.size(); ++i) ASSERT_EQ(ya[i], ys[i]) << what << " vs scalar at " << i;
          for (size_t i = 0; i < cases[c].size(); ++i) {
            const Spec& sp = cases[c][i];
            std::vector<double> ref, mag;
            ref_gemm(X.data() + sp.m0 * K, sp.n, *A[i], ref, mag, false);
            for (int64_t m = 0; m < sp.n; ++m)
              for (int64_t j = 0; j < sp.rank; ++j) {
                const size_t k = size_t(m * sp.rank + j);
                ASSERT_NEAR(ya[size_t((sp.m0 + m) * ld + j)], sp.scale * ref[k], std::fabs(sp.scale) * gemm_tol(K, mag[k]))
                    << what << " target " << i << " m " << m << " j " << j;
              }
          }
        }
      }
}

// A decode batch mixing adapters: runs of one row each, every one its own B, expanded several
// at once (Isa::gemv_runs) where the ISA has it; with a 2-row run, a base row, a B of another
// type and one of another rank between them (the batch splits there). Bit-identical to the
// scalar ISA (one fma chain over the rank per output, whichever path), for matmul_add (one
// group per item at N = 21 and two at 35) and ffn_glu.
TEST_P(KernelTest, LoraSingleRowRunsToScalar) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(31);
  std::deque<QWeight> keep;
  const int64_t M = 9, K = 64;
  struct Spec {
    int64_t m0, n, rank;
    GGMLType tb;
  };
  // rows 0-3: four single-row F16 runs; 4-5: a 2-row run; 6: base; 7: F32 B; 8: rank 5
  const Spec specs[] = {{0, 1, 16, GGMLType::F16}, {1, 1, 16, GGMLType::F16}, {2, 1, 16, GGMLType::F16},
                        {3, 1, 16, GGMLType::F16}, {4, 2, 16, GGMLType::F16}, {7, 1, 16, GGMLType::F32},
                        {8, 1, 5, GGMLType::F16}};
  const auto X = randv(rng, size_t(M * K));
  const auto ya = randv(rng, size_t(M * 16));
  for (const int64_t N : {int64_t(21), int64_t(35)}) {
    const QWeight& W = keep.emplace_back(make_weight(rng, GGMLType::Q8_0, N, K));
    const QWeight& Wu = keep.emplace_back(make_weight(rng, GGMLType::Q8_0, N, K));
    std::vector<const QWeight*> B, Bu;
    for (const Spec& sp : specs) {
      B.push_back(&keep.emplace_back(make_weight(rng, sp.tb, N, sp.rank)));
      Bu.push_back(&keep.emplace_back(make_weight(rng, sp.tb, N, sp.rank)));
    }
    auto run = [&](Backend& be, std::vector<float>& out) {
      std::vector<LoraRun> r, ru;
      for (size_t i = 0; i < std::size(specs); ++i) {
        r.push_back({specs[i].m0, specs[i].n, ya.data() + specs[i].m0 * 16, 16, be.prepare(B[i]->view())});
        ru.push_back({specs[i].m0, specs[i].n, ya.data() + specs[i].m0 * 16, 16, be.prepare(Bu[i]->view())});
      }
      out.assign(size_t(M * N), 0.5f);
      be.matmul_add(X.data(), M, be.prepare(W.view()), out.data(), LoraDelta{r.data(), int32_t(r.size())});
      std::vector<float> A(size_t(M * N));
      const LoraDelta gu[2] = {{r.data(), int32_t(r.size())}, {ru.data(), int32_t(ru.size())}};
      be.ffn_glu(X.data(), M, be.prepare(W.view()), be.prepare(Wu.view()), GateAct::SiLU, A.data(), gu);
      out.insert(out.end(), A.begin(), A.end());
    };
    std::vector<float> a, b;
    run(*native, a);
    run(*scalar, b);
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << GetParam() << " N " << N << " at " << i;
  }
}

// matmul_runs(fuse = true): the shrink runs inside the next projection's call (on an ISA with
// gemv_runs, at decode: every target one row) and gives the bits of the separate call, for
// matmul_add, matmul_multi (Q/K/V's three deltas reading one stacked ya) and ffn_glu; ya is
// NaN before each call, so an expand that ran before the shrink finished shows. Four adapters
// on rows 0-3 and one on two rows (4-5: not the decode shape, so a separate pass), at 2 threads;
// F16 and Q8_0 A's (the integer path: the projection's quantized X where it is the shrink's X,
// else the shrink's own, quantized first: another X), over
// Q8_0 and F16 base weights (then X is quantized for the shrink alone). One row, 8 times: its
// pairs of items expand as soon as the shrink is done, those done before it at the end of their
// thread's run (which half of them depends on the threads' timing: a pair left out fails).
TEST_P(KernelTest, LoraShrinkFusedIntoTheProjection) {
  auto be = backend_for(GetParam(), 2);
  std::mt19937 rng(37);
  std::deque<QWeight> keep;
  const int64_t K = 1024, N = 288, R = 16, S = 3 * R;  // S: the stacked ya of Q, K, V
  const auto X = randv(rng, size_t(6 * K));
  const auto X_elsewhere = randv(rng, size_t(6 * K));  // (other values: a shrink reading the projection's qa shows)
  for (const GGMLType tw : {GGMLType::Q8_0, GGMLType::F16})
    for (const GGMLType ta : {GGMLType::F16, GGMLType::Q8_0})
      for (const bool same_x : {true, false}) {
        if (!same_x && ta != GGMLType::Q8_0) continue;
        const QWeight& Wq = keep.emplace_back(make_weight(rng, tw, N, K));
        const QWeight& Wk = keep.emplace_back(make_weight(rng, tw, N, K));
        const QWeight& Wv = keep.emplace_back(make_weight(rng, tw, N, K));
        struct Adapter {
          const QWeight* A;    // (S, K)
          const QWeight* B[3];  // (N, R)
        };
        std::vector<Adapter> ad;
        for (int i = 0; i < 4; ++i)
          ad.push_back({&keep.emplace_back(make_weight(rng, ta, S, K)),
                        {&keep.emplace_back(make_weight(rng, GGMLType::F16, N, R)),
                         &keep.emplace_back(make_weight(rng, GGMLType::F16, N, R)),
                         &keep.emplace_back(make_weight(rng, GGMLType::F16, N, R))}});
        const std::string what = cat(GetParam(), " W ", type_traits(tw).name, " A ", type_traits(ta).name,
                                     same_x ? "" : " (the shrink's X elsewhere)");
        for (const int64_t M : {int64_t(1), int64_t(4), int64_t(6)}) {
          auto run = [&](bool fuse) {
            std::vector<float> ya(size_t(M * S), std::numeric_limits<float>::quiet_NaN()), out;
            std::vector<RunTarget> t;
            std::vector<LoraRun> r[3];
            for (int64_t m = 0; m < std::min<int64_t>(M, 4); ++m) {
              const Adapter& a = ad[size_t(m)];
              t.push_back({m, 1, be->prepare(a.A->view()), ya.data() + m * S, S, 0.5f});
              for (int j = 0; j < 3; ++j) r[j].push_back({m, 1, ya.data() + m * S + j * R, S, be->prepare(a.B[j]->view())});
            }
            if (M > 4) {  // (a 2-row run of adapter 0)
              t.push_back({4, 2, be->prepare(ad[0].A->view()), ya.data() + 4 * S, S, 0.5f});
              for (int j = 0; j < 3; ++j) r[j].push_back({4, 2, ya.data() + 4 * S + j * R, S, be->prepare(ad[0].B[j]->view())});
            }
            const LoraDelta d[3] = {{r[0].data(), int32_t(r[0].size())}, {r[1].data(), int32_t(r[1].size())},
                                    {r[2].data(), int32_t(r[2].size())}};
            auto shrink = [&] {
              std::fill(ya.begin(), ya.end(), std::numeric_limits<float>::quiet_NaN());
              be->matmul_runs(same_x ? X.data() : X_elsewhere.data(), K, t.data(), int(t.size()), fuse);
            };
            std::vector<float> y(size_t(M * N), 0.25f);
            shrink();
            be->matmul_add(X.data(), M, be->prepare(Wq.view()), y.data(), d[0]);
            out.insert(out.end(), y.begin(), y.end());
            std::vector<float> q(size_t(M * N)), k(size_t(M * N)), v(size_t(M * N));
            Backend::MatmulTarget mt[3] = {{be->prepare(Wq.view()), q.data(), N}, {be->prepare(Wk.view()), k.data(), N},
                                           {be->prepare(Wv.view()), v.data(), N}};
            for (int j = 0; j < 3; ++j) mt[j].lora = d[j];
            shrink();
            be->matmul_multi(X.data(), M, mt, 3);
            for (const auto* p : {&q, &k, &v}) out.insert(out.end(), p->begin(), p->end());
            std::vector<float> g(size_t(M * N));
            shrink();
            be->ffn_glu(X.data(), M, be->prepare(Wq.view()), be->prepare(Wk.view()), GateAct::SiLU, g.data(), d);
            out.insert(out.end(), g.begin(), g.end());
            return out;
          };
          const std::vector<float> sep = run(false);
          for (size_t i = 0; i < sep.size(); ++i) ASSERT_FALSE(std::isnan(sep[i])) << what << " M " << M << " at " << i;
          for (int rep = 0; rep < (M == 1 ? 8 : 1); ++rep) {  // (one row: see above)
            const std::vector<float> fused = run(true);
            for (size_t i = 0; i < sep.size(); ++i)
              ASSERT_EQ(fused[i], sep[i]) << what << " M " << M << " rep " << rep << " at " << i;
          }
        }
      }
}

// A row's LoRA delta does not depend on the rows around it (the numerics contract of the GEMM
// holds with deltas: decode == prefill, alone == mixed), and every ISA gives the scalar bits.
TEST_P(KernelTest, LoraDeltaBitIdenticalAloneAndToScalar) {
  auto native = backend_for(GetParam()), scalar = backend_for("scalar");
  std::mt19937 rng(19);
  const int64_t M = 17, K = 64, R = 16;
  // N = 35: two work items; 200, 288 and 1000: 13, 18 and 63 groups, so one adapter's single-row
  // expands go over spans of items (runs of up to 16 items per thread: 4 at a time and a tail),
  // for matmul_add, ffn_glu's gate/up and matmul_multi's two targets (each its own B: a span
  // ends at a target's last item).
  for (const int64_t N : {int64_t(35), int64_t(200), int64_t(288), int64_t(1000)}) {
    const QWeight W = make_weight(rng, GGMLType::Q8_0, N, K), Wu = make_weight(rng, GGMLType::Q8_0, N, K),
                  A = make_weight(rng, GGMLType::F16, 2 * R, K), B = make_weight(rng, GGMLType::F16, N, R),
                  Bu = make_weight(rng, GGMLType::F16, N, R);
    const auto X = randv(rng, size_t(M * K));
    auto run = [&](Backend& be, int64_t m0, int64_t n, std::vector<float>& Y) {
      std::vector<float> ya(size_t(n * 2 * R));
      const RunTarget t{0, n, be.prepare(A.view()), ya.data(), 2 * R, 0.75f};
      be.matmul_runs(X.data() + m0 * K, K, &t, 1);
      const LoraRun r{0, n, ya.data(), 2 * R, be.prepare(B.view())}, ru{0, n, ya.data() + R, 2 * R, be.prepare(Bu.view())};
      Y.assign(size_t(4 * n * N), 0.0f);
      be.matmul_add(X.data() + m0 * K, n, be.prepare(W.view()), Y.data(), LoraDelta{&r, 1});
      const LoraDelta gu[2] = {{&r, 1}, {&ru, 1}};
      be.ffn_glu(X.data() + m0 * K, n, be.prepare(W.view()), be.prepare(Wu.view()), GateAct::SiLU, Y.data() + n * N, gu);
      Backend::MatmulTarget t2[2] = {{be.prepare(W.view()), Y.data() + 2 * n * N, N}, {be.prepare(Wu.view()), Y.data() + 3 * n * N, N}};
      t2[0].lora = {&r, 1}, t2[1].lora = {&ru, 1};
      be.matmul_multi(X.data() + m0 * K, n, t2, 2);
    };
    std::vector<float> all, ref, one;
    run(*native, 0, M, all);
    run(*scalar, 0, M, ref);
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], ref[i]) << "N " << N << " vs scalar at " << i;
    // (Runs of 1..4 rows: the epilogue's in-register path; M: the unpacked one.)
    for (int64_t m = 0, n = 1; m < M; m += n, n = n % 4 + 1) {
      const int64_t rows = std::min(n, M - m);
      run(*native, m, rows, one);
      for (int part = 0; part < 4; ++part)
        for (int64_t i = 0; i < rows * N; ++i)
          ASSERT_EQ(one[size_t(part * rows * N + i)], all[size_t(part * M * N + m * N + i)])
              << "N " << N << " part " << part << " (matmul_add, ffn_glu, matmul_multi x2), rows " << m << "+" << rows << " alone, at " << i;
    }
  }
}

}  // namespace
}  // namespace ft
