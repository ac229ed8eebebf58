// Portable scalar instantiation of the flash-attention driver (attention_impl.h): the fallback
// when the CPU lacks AVX2, and a second implementation every attention test runs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/fp16.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/cpu_kernels.h"

namespace ft::cpu {
namespace {

struct ScalarAttn {
  static void prefetch(const void*, uint64_t) {}

  // S (rows, ldS)[:, 0:64]: S[r][16t + lane] = sum_d Q[r][d] * K_t[d][lane] (one fma chain, d in order).
  static void scores_f(GGMLType type, int rows, const float* Q, int hd, const uint8_t* const* tiles, float* S,
                       int ldS) {
    const KVGeometry g{type, 1, hd, kKvTile};
    float k[Attention<ScalarAttn>::kMaxHead];
    for (int t = 0; t < Attention<ScalarAttn>::kChunkTiles; ++t)
      for (int lane = 0; lane < kKvTile; ++lane) {
        kv_load(g, tiles[t], nullptr, lane, k, nullptr);
        for (int r = 0; r < rows; ++r) {
          float acc = 0;
          for (int d = 0; d < hd; ++d) acc = std::fma(Q[r * hd + d], k[d], acc);
          S[r * ldS + t * kKvTile + lane] = acc;
        }
      }
  }

  // S as scores_f, from int8 dot products: sum_b float(sum_{d in b} qq * kq) * (kd_b * qd_b).
  static void scores_q8(int rows, const int8_t* Qq, const float* Qd, const int32_t*, int hd, int nqb,
                        const uint8_t* const* tiles, float* S, int ldS) {
    for (int t = 0; t < Attention<ScalarAttn>::kChunkTiles; ++t) {
      const auto* kq = reinterpret_cast<const int8_t*>(tiles[t]);
      const uint8_t* kd = tiles[t] + uint64_t(hd) * kKvTile;
      for (int lane = 0; lane < kKvTile; ++lane)
        for (int r = 0; r < rows; ++r) {
          float acc = 0;
          for (int b = 0; b < nqb; ++b) {
            int32_t dot = 0;
            for (int d = b * kKvQBlock; d < std::min(hd, (b + 1) * kKvQBlock); ++d)
              dot += int32_t(Qq[r * hd + d]) * kq[(d / 4) * kKvTile * 4 + lane * 4 + d % 4];
            float d_k;
            std::memcpy(&d_k, kd + (uint64_t(b) * kKvTile + uint64_t(lane)) * sizeof(float), sizeof(float));
            acc = std::fma(float(dot), d_k * Qd[r * nqb + b], acc);
          }
          S[r * ldS + t * kKvTile + lane] = acc;
        }
    }
  }

  // Per row r < rows over S[r][0:64]: m' = max(m, max_j S), S = exp(S - m'), l = l * alpha +
  // sum_j S (j in order), alpha = exp(m - m'). A row with nothing visible yet keeps m = -inf,
  // l = 0 (alpha 0; its O is 0).
  static void softmax(float* S, int ldS, int rows, float* m, float* l, float* alpha) {
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < rows; ++r) {
      float* s = S + r * ldS;
      float mx = ninf;
      for (int j = 0; j < Attention<ScalarAttn>::kChunk; ++j) mx = std::max(mx, s[j]);
      const float mn = std::max(m[r], mx), mu = mn == ninf ? 0.0f : mn;
      float sum = 0;
      for (int j = 0; j < Attention<ScalarAttn>::kChunk; ++j) sum += (s[j] = std::exp(s[j] - mu));
      alpha[r] = std::exp(m[r] - mu);
      l[r] = l[r] * alpha[r] + sum;
      m[r] = mn;
    }
  }

  static void v_row(const KVGeometry& g, const uint8_t* row, float* v) { kv_load_v_row(g, row, v); }

  // O (rows, hd): O_r = O_r * alpha_r + sum_{j < len} P[r][j] * v[j] (one fma chain per element, j in order).
  static void pv(int rows, float* O, int hd, const float* alpha, const float* P, int ldP, const float* const* v,
                 int len) {
    for (int r = 0; r < rows; ++r)
      for (int d = 0; d < hd; ++d) {
        float o = O[r * hd + d] * alpha[r];
        for (int j = 0; j < len; ++j) o = std::fma(P[r * ldP + j], v[j][d], o);
        O[r * hd + d] = o;
      }
  }
};

}  // namespace

AttentionFn scalar_attention() { return &Attention<ScalarAttn>::run; }

}  // namespace ft::cpu
