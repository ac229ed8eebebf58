// Plain, correct CPU kernels (scalar loops, OpenMP across rows). They define the semantics the
// fast kernels must reproduce.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/rowwise.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace ft {

namespace {

class CpuReferenceBackend final : public Backend {
 public:
  explicit CpuReferenceBackend(int threads) : threads_(std::max(1, threads)) {}
  std::string_view name() const override { return "reference"; }
  int threads() const override { return threads_; }

  void matmul(const float* X, int64_t M, const WeightView& W, float* Y) override {
    if (W.layout != WeightLayout::Rows) fail("reference backend: weights must be in GGUF row layout");
    const int64_t K = W.n_cols, N = W.n_rows;
    const uint64_t rb = *row_bytes(W.type, uint64_t(K));
    const auto* base = static_cast<const uint8_t*>(W.data);
    // Dequantize a tile of weight rows once, then dot it with every activation row.
    constexpr int64_t kTile = 16;
#pragma omp parallel num_threads(threads_)
    {
      std::vector<float> w(size_t(kTile * K));
#pragma omp for schedule(static)
      for (int64_t n0 = 0; n0 < N; n0 += kTile) {
        const int64_t nt = std::min(kTile, N - n0);
        for (int64_t j = 0; j < nt; ++j)
          dequantize_row(W.type, base + uint64_t(n0 + j) * rb, w.data() + j * K, K);
        for (int64_t m = 0; m < M; ++m) {
          const float* x = X + m * K;
          for (int64_t j = 0; j < nt; ++j) {
            const float* wr = w.data() + j * K;
            float acc = 0;
            for (int64_t k = 0; k < K; ++k) acc += x[k] * wr[k];
            Y[m * N + n0 + j] = acc;
          }
        }
      }
    }
  }

  void matmul_multi(const float* X, int64_t M, const MatmulTarget* t, int n) override {
    for (int i = 0; i < n; ++i) {
      const int64_t N = t[i].W.n_rows;
      tmp_.resize(size_t(M * N));
      matmul(X, M, t[i].W, tmp_.data());
      add_lora(t[i].lora, tmp_.data(), N, M);
      if (t[i].bias) add_bias(tmp_.data(), M, N, t[i].bias);
      if (t[i].rope_cs)
        for (int64_t m = 0; m < M; ++m)
          rowwise::rope_rotate(tmp_.data() + m * N, 0, N, t[i].rope_head_dim, t[i].rope_n_rot,
                               t[i].rope_cs + m * t[i].rope_n_rot);
      for (int64_t m = 0; m < M; ++m)
        std::copy(tmp_.data() + m * N, tmp_.data() + (m + 1) * N, t[i].Y + m * t[i].ldy);
    }
  }

  void matmul_add(const float* X, int64_t M, const WeightView& W, float* Y, const LoraDelta& lora) override {
    tmp_.resize(size_t(M * W.n_rows));
    matmul(X, M, W, tmp_.data());
    add_lora(lora, tmp_.data(), W.n_rows, M);
    add(Y, tmp_.data(), M, W.n_rows);
  }

  void ffn_glu(const float* X, int64_t M, const WeightView& Wg, const WeightView& Wu, GateAct act,
               float* A, const LoraDelta* lora) override {
    tmp_.resize(size_t(M * Wu.n_rows));
    matmul(X, M, Wg, A);
    matmul(X, M, Wu, tmp_.data());
    if (lora) {
      add_lora(lora[0], A, Wg.n_rows, M);
      add_lora(lora[1], tmp_.data(), Wu.n_rows, M);
    }
    glu(A, tmp_.data(), act, A, M, Wg.n_rows);
  }

  void matmul_runs(const float* X, int64_t K, const RunTarget* t, int n, bool /*fuse*/) override {
    for (int i = 0; i < n; ++i) {
      if (t[i].A.n_cols != K) fail("matmul_runs: target ", i, " has K ", t[i].A.n_cols, ", X has ", K);
      const int64_t N = t[i].A.n_rows;
      std::vector<float> y(size_t(t[i].n * N));
      matmul(X + t[i].m0 * K, t[i].n, t[i].A, y.data());
      for (int64_t m = 0; m < t[i].n; ++m)
        for (int64_t j = 0; j < N; ++j) t[i].Y[m * t[i].ldy + j] = t[i].scale * y[size_t(m * N + j)];
    }
  }

  void add_bias(float* Y, int64_t M, int64_t N, const float* bias) override { rowwise::add_bias(Y, M, N, bias); }
  void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t n, float eps) override {
    rowwise::rmsnorm(x, w, y, M, n, eps);
  }
  void embed(const WeightView& E, const int32_t* tokens, int64_t M, float* out) override {
    rowwise::embed(E, tokens, M, out);
  }
  void rope_table(const int32_t* pos, int64_t M, const RopeParams& p, float* cs) override {
    rowwise::rope_table(pos, M, p, cs);
  }
  void rope(float* x, int64_t M, int32_t n_heads, int32_t head_dim, const int32_t* pos,
            const RopeParams& p) override {
    rowwise::rope(x, M, n_heads, head_dim, pos, p, threads_);
  }

  // Softmax attention, one query row and position at a time, each K/V row read back as f32
  // (kv_load). With Q8_0 KV the query is quantized first as kv_quantize_query defines.
  void attention(const float* q, int64_t M, const KVLayerView* views, const int32_t* n_ctx,
                 const AttentionShape& s, float* out) override {
    const int32_t group = s.n_heads / s.n_kv_heads, hd = s.head_dim;
    const int64_t qdim = int64_t(s.n_heads) * hd;
#pragma omp parallel num_threads(threads_)
    {
      const size_t n_hd = size_t(hd);
      std::vector<float> scores, qs(n_hd), k(n_hd), v(n_hd), qd(n_hd);
      std::vector<int8_t> qq(n_hd);
      std::vector<int32_t> qsum(n_hd);
#pragma omp for collapse(2) schedule(dynamic)
      for (int64_t m = 0; m < M; ++m) {
        for (int32_t h = 0; h < s.n_heads; ++h) {
          const KVLayerView& kv = views[m];
          const int32_t n = n_ctx[m], g = h / group;
          const float* qh = q + m * qdim + int64_t(h) * hd;
          if (kv.geo.type == GGMLType::Q8_0) {
            kv_quantize_query(qh, hd, s.scale, qq.data(), qd.data(), qsum.data());
            for (int32_t d = 0; d < hd; ++d) qs[size_t(d)] = qd[size_t(d / kKvQBlock)] * float(qq[size_t(d)]);
          } else {
            for (int32_t d = 0; d < hd; ++d) qs[size_t(d)] = qh[d] * s.scale;
          }
          // Visible: [j0, n), the sliding window's last s.window positions or all of them.
          const int32_t j0 = s.window > 0 ? std::max(0, n - s.window) : 0;
          scores.resize(size_t(n));
          float mx = -std::numeric_limits<float>::infinity();
          for (int32_t j = j0; j < n; ++j) {
            kv_load(kv.geo, kv.k_tile(j, g), nullptr, j % kKvTile, k.data(), nullptr);
            float dot = 0;
            for (int32_t d = 0; d < hd; ++d) dot += qs[size_t(d)] * k[size_t(d)];
            if (s.softcap > 0) dot = s.softcap * std::tanh(dot / s.softcap);
            scores[size_t(j)] = dot;
            mx = std::max(mx, dot);
          }
          // gpt-oss's sink: one more logit in the denominator (and in the maximum), no value.
          if (s.sinks) mx = std::max(mx, s.sinks[h]);
          float sum = s.sinks ? std::exp(s.sinks[h] - mx) : 0.0f;
          for (int32_t j = j0; j < n; ++j) {
            scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
            sum += scores[size_t(j)];
          }
          float* o = out + m * qdim + int64_t(h) * hd;
          std::fill(o, o + hd, 0.0f);
          for (int32_t j = j0; j < n; ++j) {
            kv_load_v_row(kv.geo, kv.v_row(j, g), v.data());
            const float p = scores[size_t(j)] / sum;
            for (int32_t d = 0; d < hd; ++d) o[d] += p * v[size_t(d)];
          }
        }
      }
    }
  }

  void glu(const float* gate, const float* up, GateAct act, float* a, int64_t M, int64_t n) override {
    rowwise::glu(gate, up, act, a, M, n);
  }
  void softcap(float* x, int64_t n, float cap) override { rowwise::softcap(x, n, cap); }
  void scale(float* x, int64_t n, float s) override { rowwise::scale(x, n, s); }
  void add(float* y, const float* x, int64_t M, int64_t n) override { rowwise::add(y, x, M, n); }

 private:
  // C (M, N; rows ldc apart) += each run's ya @ B^T (LoraDelta), B in GGUF rows.
  static void add_lora(const LoraDelta& d, float* C, int64_t ldc, int64_t M) {
    for (int32_t i = 0; i < d.n; ++i) {
      const LoraRun& r = d.runs[i];
      const WeightView& B = r.B;
      if (B.layout != WeightLayout::Rows) fail("reference backend: weights must be in GGUF row layout");
      if (r.m0 < 0 || r.n < 0 || r.m0 + r.n > M) fail("lora: run [", r.m0, ", ", r.m0 + r.n, ") outside ", M, " rows");
      const int64_t R = B.n_cols;
      const uint64_t rb = *row_bytes(B.type, uint64_t(R));
      std::vector<float> b(static_cast<size_t>(R));
      for (int64_t j = 0; j < B.n_rows; ++j) {
        dequantize_row(B.type, static_cast<const uint8_t*>(B.data) + uint64_t(j) * rb, b.data(), R);
        for (int64_t m = 0; m < r.n; ++m) {
          const float* ya = r.ya + m * r.ldya;
          float acc = 0;
          for (int64_t k = 0; k < R; ++k) acc += ya[k] * b[size_t(k)];
          C[(r.m0 + m) * ldc + j] += acc;
        }
      }
    }
  }

  int threads_;
  std::vector<float> tmp_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(int threads) {
  return std::make_unique<CpuReferenceBackend>(threads);
}

}  // namespace ft
