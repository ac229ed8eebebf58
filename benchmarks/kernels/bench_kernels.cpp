// Google Benchmark for the CPU kernels. Every GEMM reports GFLOP/s and its % of this machine's
// fp32 FMA peak, measured at start-up in the same run (counter "pct_peak"); GEMVs report GB/s of
// weights read and % of the measured read bandwidth ("pct_bw"); F32 GEMM runs next to OpenBLAS
// sgemm on the same shapes (BM_OpenBLAS_sgemm) when OpenBLAS is available.
//   build/bench_kernels [--benchmark_filter=Gemm] [FT_BENCH_THREADS=2]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/mapped_memory.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/peak.h"
#include "kernels/quant.h"

#ifdef FT_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace {

using namespace ft;

int threads() {
  const char* e = std::getenv("FT_BENCH_THREADS");
  return e ? std::atoi(e) : 2;
}
double peak_gflops() {
  static const double p = measure_fma_peak_gflops(threads());
  return p;
}
double peak_bw() {
  static const double b = measure_read_bandwidth_gbs(threads());
  return b;
}

struct Weight {
  std::vector<uint8_t> bytes;
  WeightView view;
};
Weight make_weight(GGMLType t, int64_t N, int64_t K) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> row(static_cast<size_t>(K));
  const uint64_t rb = *row_bytes(t, uint64_t(K));
  Weight w;
  w.bytes.resize(rb * uint64_t(N));
  for (int64_t n = 0; n < N; ++n) {
    for (auto& x : row) x = u(rng);
    quantize_row(t, row.data(), w.bytes.data() + uint64_t(n) * rb, K);
  }
  w.view = {t, w.bytes.data(), N, K};
  return w;
}

void BM_GemmPct(benchmark::State& st, GGMLType t) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  const Weight w = make_weight(t, N, K);
  std::vector<float> X(size_t(M * K), 0.5f), Y(size_t(M * N));
  auto be = make_backend("cpu", threads());
  be->reserve(M);
  const WeightView v = be->prepare(w.view);  // repacked as the engine does at load
  double secs = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    be->matmul(X.data(), M, v, Y.data());
    benchmark::DoNotOptimize(Y.data());
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double it = double(st.iterations());
  const double gflops = 2.0 * double(M) * double(N) * double(K) * it / secs / 1e9;
  const double gbs = double(w.bytes.size()) * it / secs / 1e9;
  st.counters["GFLOPs"] = gflops;
  st.counters["pct_peak"] = 100 * gflops / peak_gflops();
  st.counters["W_GBs"] = gbs;
  st.counters["pct_bw"] = 100 * gbs / peak_bw();
}

#ifdef FT_HAVE_OPENBLAS
void BM_OpenBLAS_sgemm(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  std::vector<float> X(size_t(M * K), 0.5f), W(size_t(N * K), 0.25f), Y(size_t(M * N));
  openblas_set_num_threads(threads());
  double secs = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    // Y (M, N) = X (M, K) @ W (N, K)^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.0f, X.data(), int(K),
                W.data(), int(K), 0.0f, Y.data(), int(N));
    benchmark::DoNotOptimize(Y.data());
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gflops = 2.0 * double(M) * double(N) * double(K) * double(st.iterations()) / secs / 1e9;
  st.counters["GFLOPs"] = gflops;
  st.counters["pct_peak"] = 100 * gflops / peak_gflops();
}
#endif

// Flash attention: M queries at the end of a ctx-token context (TinyLlama heads: 32 query heads,
// 4 KV heads, head_dim 64), the KV cache in type range(2) (a GGMLType id: 0 f32, 1 f16, 8 q8_0,
// 30 bf16). Useful FLOPs: 4 * head_dim per (query head, key).
void BM_FlashAttention(benchmark::State& st) {
  const int32_t ctx = int32_t(st.range(0)), M = int32_t(st.range(1));
  const int32_t H = 32, KVH = 4, D = 64, BS = 16;
  const int32_t nb = (ctx + BS - 1) / BS;
  const KVGeometry geo{GGMLType(st.range(2)), KVH, D, BS};
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint8_t> k(size_t(nb) * KVH * geo.k_head_bytes()), v(size_t(nb) * KVH * geo.v_head_bytes());
  std::vector<float> q(size_t(M) * H * D), out(q.size()), kr(static_cast<size_t>(D)), vr(static_cast<size_t>(D));
  for (int32_t b = 0; b < nb * KVH; ++b)
    for (int32_t row = 0; row < BS; ++row) {
      for (auto& x : kr) x = u(rng);
      for (auto& x : vr) x = u(rng);
      kv_store(geo, k.data() + uint64_t(b) * geo.k_head_bytes(), v.data() + uint64_t(b) * geo.v_head_bytes(), row,
               kr.data(), vr.data());
    }
  for (auto& x : q) x = u(rng);
  std::vector<int32_t> table(static_cast<size_t>(nb));
  for (int32_t i = 0; i < nb; ++i) table[size_t(i)] = i;
  const KVLayerView view{geo, k.data(), v.data(), table.data()};
  std::vector<KVLayerView> views(size_t(M), view);
  std::vector<int32_t> n_ctx(static_cast<size_t>(M));
  double flops = 0;
  for (int32_t i = 0; i < M; ++i) {
    n_ctx[size_t(i)] = ctx - M + i + 1;
    flops += 4.0 * D * H * n_ctx[size_t(i)];
  }
  const AttentionShape s{H, KVH, D, 1.0f / std::sqrt(float(D))};
  auto be = make_backend("cpu", threads());
  double secs = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    be->attention(q.data(), M, views.data(), n_ctx.data(), s, out.data());
    benchmark::DoNotOptimize(out.data());
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gflops = flops * double(st.iterations()) / secs / 1e9;
  st.counters["GFLOPs"] = gflops;
  st.counters["pct_peak"] = 100 * gflops / peak_gflops();
}

// A decode's attention from memory, as the 110m model runs it (12 heads of 64, one query, its
// K/V in 16 layers of distinct memory: 2,700 positions = 8.3 MB a layer in f16, past the L3 of
// the two cores; on huge pages, as the KV cache's pools): W_GBs = K/V bytes read per second, to set
// against BM_ReadProbe.
// range(0) = positions, range(1) = KV type, range(2) = 1: blocks in a shuffled order.
void BM_DecodeAttentionFromMemory(benchmark::State& st) {
  const int32_t ctx = int32_t(st.range(0)), H = 12, D = 64, BS = 16, kLayers = 16;
  const int32_t nb = (ctx + BS - 1) / BS;
  const KVGeometry geo{GGMLType(st.range(1)), H, D, BS};
  std::vector<MappedMemory> k, v;  // (on huge pages, as the KV cache's pools)
  std::vector<int32_t> table(static_cast<size_t>(nb));
  for (int32_t i = 0; i < nb; ++i) table[size_t(i)] = i;
  if (st.range(2)) std::shuffle(table.begin(), table.end(), std::mt19937(3));
  std::vector<KVLayerView> views;
  for (int l = 0; l < kLayers; ++l) {
    k.emplace_back(uint64_t(nb) * H * geo.k_head_bytes(), "bench K");
    v.emplace_back(uint64_t(nb) * H * geo.v_head_bytes(), "bench V");
    std::memset(k.back().data(), 0x3c, k.back().size());  // f16/bf16 ~1, q8 small
    std::memset(v.back().data(), 0x3c, v.back().size());
    views.push_back({geo, k.back().data(), v.back().data(), table.data()});
  }
  std::vector<float> q(size_t(H) * D, 0.01f), out(q.size());
  const int32_t n_ctx = ctx;
  const AttentionShape s{H, H, D, 1.0f / std::sqrt(float(D))};
  auto be = make_backend("cpu", threads());
  double secs = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < kLayers; ++l) be->attention(q.data(), 1, &views[size_t(l)], &n_ctx, s, out.data());
    benchmark::DoNotOptimize(out.data());
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double bytes = double(kLayers) * double(nb) * H * double(geo.k_head_bytes() + geo.v_head_bytes());
  st.counters["W_GBs"] = bytes * double(st.iterations()) / secs / 1e9;
  st.counters["us_layer"] = secs / double(st.iterations()) / kLayers * 1e6;
}
BENCHMARK(BM_DecodeAttentionFromMemory)
    ->ArgsProduct({{270, 2700}, {int(GGMLType::F16), int(GGMLType::Q8_0)}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Prefill shapes of TinyLlama (QKV-sized 2048x2048, FFN 5632x2048, down 2048x5632) and decode;
// on the 2048x2048 shape also the adaptive scheduler's chunk sizes (16-128 rows: compare their
// GFLOP/s with M = 512's) and an odd one.
void GemmArgs(benchmark::internal::Benchmark* b) {
  b->Args({512, 2048, 2048})->Args({512, 5632, 2048})->Args({512, 2048, 5632});
  for (const int64_t m : {16, 17, 32, 64, 128}) b->Args({m, 2048, 2048});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
// Large chunks against small ones on the 110m shape's FFN (gate/up 2048x768, down 768x2048): a
// prefill chunk of M rows should cost no more per row at M = 1024-2048 than at 128-256.
void LargeMArgs(benchmark::internal::Benchmark* b) {
  for (const int64_t m : {128, 256, 512, 1024, 2048}) b->Args({m, 2048, 768})->Args({m, 768, 2048});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
void GemvArgs(benchmark::internal::Benchmark* b) {
  // (M = 5: a speculative verification of 4 draft tokens, its compute ceiling with the weights in cache)
  b->Args({1, 5632, 2048})->Args({1, 2048, 5632})->Args({5, 5632, 2048})->Unit(benchmark::kMicrosecond)->UseRealTime();
}


// Decode and the small batches of speculative verification as the model sees them: weights
// from memory, not cache. Copies of one weight, 256 MiB in all, are visited in turn (each copy
// packed once, as at load; the last (type, N, K)'s copies are kept between runs).
struct Streamed {
  GGMLType t{};
  int64_t N = 0, K = 0;
  uint64_t bytes = 0;  // of one copy, in GGUF rows
  std::unique_ptr<Backend> be;
  std::vector<WeightView> views;
};
const Streamed& streamed(GGMLType t, int64_t N, int64_t K) {
  static Streamed s;
  if (s.be && s.t == t && s.N == N && s.K == K) return s;
  s = Streamed{};  // (the previous copies freed first)
  const Weight w = make_weight(t, N, K);
  s.t = t, s.N = N, s.K = K, s.bytes = w.bytes.size();
  s.be = make_backend("cpu", threads());
  const int64_t copies = std::max<int64_t>(2, (int64_t(256) << 20) / int64_t(w.bytes.size()));
  std::vector<std::vector<uint8_t>> src(size_t(copies), w.bytes);  // (prepare keeps its own copy)
  for (auto& b : src) s.views.push_back(s.be->prepare({t, b.data(), N, K}));
  return s;
}
// Times call(X, Y, copy) over the streamed copies of (t, N, K) in turn (copy: the next index
// into w.views; a call may take several), M = range(0) rows; W_GBs counts `weights` copies per call.
template <class Call>
void stream_calls(benchmark::State& st, GGMLType t, int weights, Call&& call) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  const Streamed& w = streamed(t, N, K);
  w.be->reserve(M);
  std::vector<float> X(size_t(M * K)), Y(size_t(M * N));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : X) x = u(rng);
  double secs = 0;
  size_t i = 0;
  auto next = [&]() -> const WeightView& { return w.views[i++ % w.views.size()]; };
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    call(*w.be, X.data(), M, Y.data(), next);
    benchmark::DoNotOptimize(Y.data());
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gbs = weights * double(w.bytes) * double(st.iterations()) / secs / 1e9;
  st.counters["W_GBs"] = gbs;
  st.counters["pct_bw"] = 100 * gbs / peak_bw();
  st.counters["us_per_call"] = secs / double(st.iterations()) * 1e6;
}
// range(0) = M rows of activations: compare each M's time ("ms_per_call") with M = 1's, and
// its W_GBs with the read bandwidth (pct_bw): weights read once per call stay near it.
void BM_GemmFromMemory(benchmark::State& st, GGMLType t) {
  stream_calls(st, t, 1, [](Backend& be, const float* X, int64_t M, float* Y, auto& next) {
    be.matmul(X, M, next(), Y);
  });
}
// The gated FFN's gate and up (two weights of N x K, each item a gate group with its up group,
// SwiGLU in the epilogue) as the model runs them: two copies of the streamed weight per call.
void BM_FfnGluFromMemory(benchmark::State& st, GGMLType t) {
  stream_calls(st, t, 2, [](Backend& be, const float* X, int64_t M, float* Y, auto& next) {
    const WeightView& g = next();
    be.ffn_glu(X, M, g, next(), GateAct::SiLU, Y);
  });
}
// Decode GEMVs (M = 1) on TinyLlama's shapes (QKV-sized, gate+up-sized, down, lm_head).
void GemvMemArgs(benchmark::internal::Benchmark* b) {
  b->Args({1, 2048, 2048})->Args({1, 11264, 2048})->Args({1, 2048, 5632})->Args({1, 32000, 2048});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
// Small batches (speculative verification: k + 1 rows) on the FFN's up shape.
void SmallMArgs(benchmark::internal::Benchmark* b) {
  for (int64_t m = 1; m <= 8; ++m) b->Args({m, 5632, 2048});
  for (const int64_t m : {16, 32, 64}) b->Args({m, 5632, 2048});  // (the scheduler's small chunks)
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
// Speculative verification (k + 1 = 5 rows) against decode (1 row) on each of TinyLlama's
// per-layer shapes (QKV, O, gate+up, down): the ratio is what verification costs per op.
void VerifyArgs(benchmark::internal::Benchmark* b) {
  for (const int64_t m : {1, 5}) b->Args({m, 2560, 2048})->Args({m, 2048, 2048})->Args({m, 11264, 2048})->Args({m, 2048, 5632});
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
// The read probe itself (bench peak's, over 256 MiB), as a benchmark: run it interleaved with
// the GEMVs from memory (--benchmark_enable_random_interleaving) for their W_GBs over the probe's
// in the same minutes, as this machine's bandwidth moves 2x between minutes.
void BM_ReadProbe(benchmark::State& st) {
  double best = 0;
  for (auto _ : st) best = std::max(best, measure_read_bandwidth_gbs(threads(), size_t(256) << 20, 1));
  st.counters["W_GBs"] = best;
}
BENCHMARK(BM_ReadProbe)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmFromMemory, q4_0_verify, ft::GGMLType::Q4_0)->Apply(VerifyArgs);
// A decode GEMV's fixed cost per call: time against N at K = 2048 (fit t = a + bytes / bw).
BENCHMARK_CAPTURE(BM_GemmFromMemory, q4_0_size, ft::GGMLType::Q4_0)
    ->Args({1, 512, 2048})->Args({1, 1024, 2048})->Args({1, 2048, 2048})->Args({1, 4096, 2048})
    ->Args({1, 8192, 2048})->Args({1, 16384, 2048})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FfnGluFromMemory, q4_0, ft::GGMLType::Q4_0)->Args({1, 5632, 2048})->Args({5, 5632, 2048})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FfnGluFromMemory, q4_k, ft::GGMLType::Q4_K)->Args({1, 5632, 2048})->Args({5, 5632, 2048})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmFromMemory, q4_0, ft::GGMLType::Q4_0)->Apply(GemvMemArgs)->Apply(SmallMArgs);
BENCHMARK_CAPTURE(BM_GemmFromMemory, q8_0, ft::GGMLType::Q8_0)->Apply(GemvMemArgs)->Apply(SmallMArgs);
BENCHMARK_CAPTURE(BM_GemmFromMemory, q4_k, ft::GGMLType::Q4_K)->Apply(GemvMemArgs)->Apply(SmallMArgs);
BENCHMARK_CAPTURE(BM_GemmFromMemory, q6_k, ft::GGMLType::Q6_K)->Apply(GemvMemArgs)->Apply(SmallMArgs);
BENCHMARK_CAPTURE(BM_GemmFromMemory, q3_k, ft::GGMLType::Q3_K)->Apply(SmallMArgs);
BENCHMARK_CAPTURE(BM_GemmFromMemory, q2_k, ft::GGMLType::Q2_K)->Apply(GemvMemArgs)->Apply(SmallMArgs);
BENCHMARK_CAPTURE(BM_GemmFromMemory, f16, ft::GGMLType::F16)->Apply(SmallMArgs);

}  // namespace

#define FT_TYPE_BENCH(name, T)                                                       \
  BENCHMARK_CAPTURE(BM_GemmPct, name, ft::GGMLType::T)->Apply(GemmArgs);              \
  BENCHMARK_CAPTURE(BM_GemmPct, name##_gemv, ft::GGMLType::T)->Apply(GemvArgs);
FT_TYPE_BENCH(f32, F32)
FT_TYPE_BENCH(f16, F16)
FT_TYPE_BENCH(bf16, BF16)
FT_TYPE_BENCH(q8_0, Q8_0)
FT_TYPE_BENCH(q4_0, Q4_0)
FT_TYPE_BENCH(q4_k, Q4_K)
FT_TYPE_BENCH(q6_k, Q6_K)
FT_TYPE_BENCH(q3_k, Q3_K)
FT_TYPE_BENCH(q2_k, Q2_K)
// A decode GEMV's compute rate: one row, ~0.5-0.6 MB of weights (in L2), FT_BENCH_THREADS=1
// for one core's rate (W_GBs) against what one core streams from memory (bench peak -t 1).
BENCHMARK_CAPTURE(BM_GemmPct, l2_q4_0, ft::GGMLType::Q4_0)->Args({1, 512, 2048})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmPct, l2_q8_0, ft::GGMLType::Q8_0)->Args({1, 256, 2048})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmPct, l2_q4_k, ft::GGMLType::Q4_K)->Args({1, 512, 2048})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmPct, l2_q6_k, ft::GGMLType::Q6_K)->Args({1, 384, 2048})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmPct, l2_f16, ft::GGMLType::F16)->Args({1, 128, 2048})->UseRealTime();
BENCHMARK_CAPTURE(BM_GemmPct, q8_0_large_m, ft::GGMLType::Q8_0)->Apply(LargeMArgs);
BENCHMARK_CAPTURE(BM_GemmPct, q4_k_large_m, ft::GGMLType::Q4_K)->Apply(LargeMArgs);
BENCHMARK_CAPTURE(BM_GemmPct, q5_k_large_m, ft::GGMLType::Q5_K)->Apply(LargeMArgs);
BENCHMARK_CAPTURE(BM_GemmPct, f16_large_m, ft::GGMLType::F16)->Apply(LargeMArgs);
#ifdef FT_HAVE_OPENBLAS
BENCHMARK(BM_OpenBLAS_sgemm)->Apply(GemmArgs);
#endif
BENCHMARK(BM_FlashAttention)
    ->ArgsProduct({{4096}, {512, 1}, {0, 1, 30, 8}})
    ->Args({1024, 512, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A decode step's GEMMs as the model runs them, layer after layer (TinyLlama's shapes, Q4_0,
// 22 layers of distinct weights): QKV (three weights, RoPE in the epilogue), Wo (+= residual),
// gate+up (SwiGLU), down (+= residual). Per op: us_<op> per call, to compare with the op alone
// (BM_GemmFromMemory on the same shape). range(0): 1 = ops in model order, 0 = each op over
// all layers before the next op (the same calls, another neighbour).
void BM_DecodeLayers(benchmark::State& st) {
  constexpr int kLayers = 22;
  constexpr int64_t D = 2048, KV = 256, F = 5632;
  const GGMLType t = GGMLType::Q4_0;
  auto be = make_backend("cpu", threads());
  be->reserve(1);
  const Weight wq = make_weight(t, D, D), wkv = make_weight(t, KV, D), wo = make_weight(t, D, D),
               wf = make_weight(t, F, D), wd = make_weight(t, D, F);
  struct Layer { WeightView q, k, v, o, g, u, d; };
  std::vector<Layer> L;
  std::vector<std::vector<uint8_t>> src;  // a copy per weight: prepare() packs a source once
  src.reserve(size_t(kLayers) * 7);
  auto own = [&](const Weight& w) {
    src.push_back(w.bytes);
    WeightView v = w.view;
    v.data = src.back().data();
    return be->prepare(v);
  };
  for (int l = 0; l < kLayers; ++l)
    L.push_back({own(wq), own(wkv), own(wkv), own(wo), own(wf), own(wf), own(wd)});
  std::vector<float> x(size_t(D), 0.1f), h(size_t(D), 0.2f), q(size_t(D), 0.0f), k(size_t(KV), 0.0f), v(size_t(KV), 0.0f),
      a(size_t(F), 0.05f), cs(64, 0.0f);
  const int32_t pos = 7;
  be->rope_table(&pos, 1, RopeParams{RopeStyle::Interleaved, 64}, cs.data());
  double sec[4] = {0, 0, 0, 0};
  auto timed = [&](int op, auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    sec[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto qkv = [&](const Layer& y) {
    Backend::MatmulTarget tg[3] = {{y.q, q.data(), D}, {y.k, k.data(), KV}, {y.v, v.data(), KV}};
    for (int i = 0; i < 2; ++i) tg[i].rope_cs = cs.data(), tg[i].rope_head_dim = 64, tg[i].rope_n_rot = 64;
    be->matmul_multi(h.data(), 1, tg, 3);
  };
  const auto ops = std::to_array<std::function<void(const Layer&)>>({
      qkv,
      [&](const Layer& y) { be->matmul_add(h.data(), 1, y.o, x.data()); },
      [&](const Layer& y) { be->ffn_glu(h.data(), 1, y.g, y.u, GateAct::SiLU, a.data(), nullptr); },
      [&](const Layer& y) { be->matmul_add(a.data(), 1, y.d, x.data()); }});
  for (auto _ : st) {
    if (st.range(0) == 1) {
      for (const Layer& y : L)
        for (int op = 0; op < 4; ++op) timed(op, [&] { ops[size_t(op)](y); });
    } else {
      for (int op = 0; op < 4; ++op)
        for (const Layer& y : L) timed(op, [&] { ops[size_t(op)](y); });
    }
    benchmark::DoNotOptimize(x.data());
  }
  const double calls = double(st.iterations()) * kLayers;
  const char* names[4] = {"us_qkv", "us_wo", "us_gateup", "us_down"};
  for (int op = 0; op < 4; ++op) st.counters[names[op]] = sec[op] / calls * 1e6;
}
BENCHMARK(BM_DecodeLayers)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

// A decode step's GEMMs on the 110m shape (4 KV heads; Q8_0, 12 layers of distinct weights) for
// S sequences: the base's step, and the same step with each sequence under its own rank-16
// adapter on all seven weights (the engine's calls: one fused shrink per input, then the
// projection with its deltas), alternated step by step so that both see the same machine.
// range(0) = S (1, or 4: `bench lora`'s mixed batch); range(1): the A's type, 0 F16, 1 Q8_0 (a
// Q8_0 adapter as llama.cpp's converter writes rank 16: its B's stay F16). Counters: us_<op> per call of the base,
// x_<op> adapted/base per op, x_step for the step (issue 17's decode cost without the model
// around it).
void BM_DecodeLayersLora(benchmark::State& st) {
  constexpr int kLayers = 12;
  constexpr int64_t D = 768, KV = 256, F = 2048, R = 16;
  const int64_t S = st.range(0);
  const GGMLType t = GGMLType::Q8_0;
  auto be = make_backend("cpu", threads());
  be->reserve(S);
  std::vector<std::vector<uint8_t>> src;  // a copy per weight: prepare() packs a source once
  src.reserve(size_t(kLayers) * size_t(7 + 11 * S));
  auto own = [&](GGMLType type, int64_t N, int64_t K) {
    src.push_back(make_weight(type, N, K).bytes);
    return be->prepare({type, src.back().data(), N, K});
  };
  struct Adapter {
    WeightView a_qkv, a_o, a_gu, a_d;              // stacked A (16 x the projections sharing an input, K)
    WeightView b_q, b_k, b_v, b_o, b_g, b_u, b_d;  // B (N, 16)
  };
  struct Layer {
    WeightView q, k, v, o, g, u, d;
    std::vector<Adapter> ad;  // one per sequence
  };
  std::vector<Layer> L;
  const GGMLType f = GGMLType::F16, fa = st.range(1) ? GGMLType::Q8_0 : f;
  for (int l = 0; l < kLayers; ++l) {
    Layer y{own(t, D, D), own(t, KV, D), own(t, KV, D), own(t, D, D), own(t, F, D), own(t, F, D), own(t, D, F), {}};
    for (int64_t i = 0; i < S; ++i)
      y.ad.push_back({own(fa, 3 * R, D), own(fa, R, D), own(fa, 2 * R, D), own(fa, R, F), own(f, D, R), own(f, KV, R),
                      own(f, KV, R), own(f, D, R), own(f, F, R), own(f, F, R), own(f, D, R)});
    L.push_back(std::move(y));
  }
  const size_t s = size_t(S);
  std::vector<float> x(s * D, 0.1f), h(s * D, 0.2f), q(s * D, 0.0f), k(s * KV, 0.0f), v(s * KV, 0.0f),
      a(s * F, 0.05f), ya(s * 3 * R, 0.0f);
  std::vector<RunTarget> rt(s);
  // Each sequence's shrink of one input (its adapter's stacked A of that input: ad.*A).
  auto shrink = [&](const Layer& y, const float* in, int64_t K, WeightView Adapter::*A) {
    for (size_t i = 0; i < s; ++i) rt[i] = {int64_t(i), 1, y.ad[i].*A, ya.data() + i * 3 * R, 3 * R, 0.5f};
    be->matmul_runs(in, K, rt.data(), int(S), true);
  };
  std::vector<LoraRun> runs(3 * s);
  // Slot j's deltas (B = ad.*B, its ya columns from col).
  auto delta = [&](const Layer& y, int j, WeightView Adapter::*B, int64_t col) {
    for (size_t i = 0; i < s; ++i) runs[size_t(j) * s + i] = {int64_t(i), 1, ya.data() + i * 3 * R + col, 3 * R, y.ad[i].*B};
    return LoraDelta{runs.data() + size_t(j) * s, int32_t(S)};
  };
  double sec[2][4] = {};
  auto step = [&](int lora) {
    for (const Layer& y : L) {
      auto t0 = std::chrono::steady_clock::now();
      auto lap = [&](int op) {
        const auto t1 = std::chrono::steady_clock::now();
        sec[lora][op] += std::chrono::duration<double>(t1 - t0).count();
        t0 = t1;
      };
      Backend::MatmulTarget tg[3] = {{y.q, q.data(), D}, {y.k, k.data(), KV}, {y.v, v.data(), KV}};
      if (lora) {
        shrink(y, h.data(), D, &Adapter::a_qkv);
        tg[0].lora = delta(y, 0, &Adapter::b_q, 0), tg[1].lora = delta(y, 1, &Adapter::b_k, R);
        tg[2].lora = delta(y, 2, &Adapter::b_v, 2 * R);
      }
      be->matmul_multi(h.data(), S, tg, 3);
      lap(0);
      if (lora) shrink(y, h.data(), D, &Adapter::a_o);
      be->matmul_add(h.data(), S, y.o, x.data(), lora ? delta(y, 0, &Adapter::b_o, 0) : LoraDelta{});
      lap(1);
      LoraDelta gu[2];
      if (lora) shrink(y, h.data(), D, &Adapter::a_gu), gu[0] = delta(y, 0, &Adapter::b_g, 0), gu[1] = delta(y, 1, &Adapter::b_u, R);
      be->ffn_glu(h.data(), S, y.g, y.u, GateAct::SiLU, a.data(), lora ? gu : nullptr);
      lap(2);
      if (lora) shrink(y, a.data(), F, &Adapter::a_d);
      be->matmul_add(a.data(), S, y.d, x.data(), lora ? delta(y, 0, &Adapter::b_d, 0) : LoraDelta{});
      lap(3);
    }
  };
  for (auto _ : st) {
    step(0);
    step(1);
    benchmark::DoNotOptimize(x.data());
  }
  const double calls = double(st.iterations()) * kLayers;
  const char* names[4] = {"qkv", "wo", "gateup", "down"};
  double tot[2] = {0, 0};
  for (int op = 0; op < 4; ++op) {
    st.counters[std::string("us_") + names[op]] = sec[0][op] / calls * 1e6;
    st.counters[std::string("us_lora_") + names[op]] = sec[1][op] / calls * 1e6;
    st.counters[std::string("x_") + names[op]] = sec[1][op] / sec[0][op];
    tot[0] += sec[0][op], tot[1] += sec[1][op];
  }
  st.counters["x_step"] = tot[1] / tot[0];
}
BENCHMARK(BM_DecodeLayersLora)
    ->Args({1, 0})
    ->Args({4, 0})
    ->Args({1, 1})
    ->Args({4, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// LoRA's shrink at decode (one row, one adapter): ya (N) = A (N, K) x, A in F16 as the engine
// packs it, one call as the model makes per layer input. range: N (A's rows: 16 x the
// projections sharing the input), K, cold (1: a fresh copy of A per call, from memory; 0: one A
// in cache).
void BM_LoraShrink(benchmark::State& st) {
  const int64_t N = st.range(0), K = st.range(1);
  const bool cold = st.range(2) != 0;
  auto be = make_backend("cpu", threads());
  be->reserve(1);
  const Weight w = make_weight(GGMLType::F16, N, K);
  const int64_t copies = cold ? std::max<int64_t>(2, (int64_t(256) << 20) / int64_t(w.bytes.size())) : 1;
  std::vector<std::vector<uint8_t>> src(size_t(copies), w.bytes);
  std::vector<WeightView> views;
  for (auto& b : src) {
    WeightView v = w.view;
    v.data = b.data();
    views.push_back(be->prepare(v));
  }
  std::vector<float> x(size_t(K), 0.25f), y(size_t(N), 0.0f);
  size_t i = 0;
  for (auto _ : st) {
    const RunTarget t{0, 1, views[i++ % views.size()], y.data(), N, 0.5f};
    be->matmul_runs(x.data(), K, &t, 1);
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_LoraShrink)->ArgsProduct({{16, 32, 48}, {768, 2048}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();

// Dispatch cost of the worker pool: one region of nt threads whose work is one relaxed add per
// thread (the fixed cost every GEMM, attention call and RoPE pays), back to back as in a forward
// pass (workers spinning between regions).
static void BM_PoolRegion(benchmark::State& state) {
  const int nt = int(state.range(0));
  std::atomic<int64_t> sink{0};
  for (auto _ : state)
    ft::cpu::parallel(nt, [&](int t, int) { sink.fetch_add(t, std::memory_order_relaxed); });
  benchmark::DoNotOptimize(sink.load());
}
BENCHMARK(BM_PoolRegion)->Arg(2)->UseRealTime();

BENCHMARK_MAIN();
