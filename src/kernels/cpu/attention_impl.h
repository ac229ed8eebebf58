// Flash attention over the paged KV cache as stored (kernels/kv_layout.h: f32, f16, bf16, q8_0),
// written once and instantiated per instruction set (attention_{scalar,avx2,avx512}.cpp): an
// `A` class supplies the inner kernels (scores of K tiles, softmax, a V row to f32, P.V).
//
// Work item = (query block, KV head): a run of up to kMaxRows / group consecutive batch entries
// of the same sequence x the `group` query heads sharing that KV head, i.e. rows = entries *
// group query vectors (decode: rows = group). KV is walked in chunks of kChunk positions (4 K
// tiles) through the block table:
//   S (rows, kChunk) = Q K^T, 16 positions per vector, straight from the K tiles (F16/BF16
//     widened in registers; Q8_0 from int8 dot products of the quantized query, kv_quantize_query,
//     with exact int32 block sums scaled by both block scales);
//   the soft cap (scores -> cap * tanh(scores / cap), when AttentionShape::softcap > 0);
//   the causal mask (position < n_ctx of the row's query; with a sliding window also position
//     >= n_ctx - window: chunks wholly before every row's window are skipped, the rest masked),
//     then an online softmax per row (running max m, sum l, rescale alpha);
//   O (rows, head_dim) = O * alpha + P V, V rows widened to f32 once per chunk (kChunk * head_dim
//     floats in L1, shared by every row; F32 rows are read in place).
// Memory per thread: O(kMaxRows * (kChunk + head_dim)), independent of context length and type.
// A row's result depends only on its query and its n_ctx (chunks start at fixed positions;
// masked positions get p = 0 exactly), not on which rows share its work item.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kernels.h"

namespace ft::cpu {

namespace {  // (each includer compiles its own copy for its own ISA)
// rows score rows in register tiles of 6, then one of the remaining 1-5: tile(NR, r0) with NR a
// std::integral_constant, so each tile height is its own instantiation.
template <class F>
void for_score_tiles(int rows, F&& tile) {
  int r0 = 0;
  for (; r0 + 6 <= rows; r0 += 6) tile(std::integral_constant<int, 6>{}, r0);
  switch (rows - r0) {
    case 1: return tile(std::integral_constant<int, 1>{}, r0);
    case 2: return tile(std::integral_constant<int, 2>{}, r0);
    case 3: return tile(std::integral_constant<int, 3>{}, r0);
    case 4: return tile(std::integral_constant<int, 4>{}, r0);
    case 5: return tile(std::integral_constant<int, 5>{}, r0);
    default: return;
  }
}
}  // namespace

template <class A>
struct Attention {
  static constexpr int kMaxRows = kAttentionMaxGroup;
  static constexpr int kMaxHead = kAttentionMaxHeadDim;
  static constexpr int kChunkTiles = 4;
  static constexpr int kChunk = kChunkTiles * kKvTile;
  static constexpr int kMaxQBlocks = kMaxHead / kKvQBlock;
  struct alignas(64) Scratch {
    alignas(64) float Q[kMaxRows * kMaxHead];  // float types: the rows' q * scale (rows, head_dim)
    alignas(64) int8_t Qq[kMaxRows * kMaxHead];  // Q8_0: quantized q * scale (rows, head_dim)
    alignas(64) float Qd[kMaxRows * kMaxQBlocks];  // its block scales (rows, q_blocks)
    alignas(64) int32_t Qs[kMaxRows * kMaxQBlocks];  // its block sums (rows, q_blocks)
    alignas(64) float S[kMaxRows * kChunk];  // scores, then P (rows, kChunk)
    alignas(64) float V[kChunk * kMaxHead];  // the chunk's V rows as f32 (kChunk, head_dim)
    alignas(64) float K[kChunkTiles * kMaxHead * kKvTile];  // many rows: the chunk's F16/BF16 K tiles as f32
    alignas(64) float O[kMaxRows * kMaxHead];
    float m[kMaxRows], l[kMaxRows], alpha[kMaxRows];
  };
  // Up to this many rows per work item (decode: rows = group), F16/BF16 K and V are widened in
  // registers as they are used; above it (prefill), once per chunk into f32 scratch shared by all
  // rows. The same values in the same fma order either way: results are bit-identical.
  static constexpr int kWidenInRegistersRows = 8;
  // What O (= sum_j exp(s_j - m) v_j, over l = sum_j exp(s_j - m)) is multiplied by when the
  // softmax's denominator also counts exp(sink - max): 1 / (l + exp(sink - m)), computed
  // against the larger of sink and m so that nothing overflows. Scalar (std::exp), so every
  // ISA's result is the same.
  static float sink_scale(float sink, float m, float l) {
    if (sink > m) {
      const float a = std::exp(m - sink);
      return a / (l * a + 1.0f);
    }
    return 1.0f / (l + std::exp(sink - m));
  }
  static Scratch& scratch() {
    static thread_local Scratch s;
    return s;
  }

  // S (n,) -> cap * tanh(S / cap): the ISA's vector form when it has one (A::softcap), else scalar.
  static void softcap_scores(float* S, int n, float cap) {
    if constexpr (requires { A::softcap(S, n, cap); }) {
      A::softcap(S, n, cap);
    } else {
      const float inv = 1.0f / cap;
      for (int i = 0; i < n; ++i) S[i] = cap * std::tanh(S[i] * inv);
    }
  }

  static bool same_seq(const KVLayerView& a, const KVLayerView& b) {
    return a.block_table == b.block_table && a.k_pool == b.k_pool;
  }

  static void run(const float* q, int64_t M, const KVLayerView* views, const int32_t* n_ctx,
                  const AttentionShape& sh, float* out, int threads) {
    if (M <= 0) return;
    const int group = sh.n_heads / sh.n_kv_heads;
    const int hd = sh.head_dim;
    if (group > kMaxRows || hd > kMaxHead)
      fail("attention: ", group, " query heads per KV head or head_dim ", hd, " exceeds the kernel's limits");
    for (int64_t i = 0; i < M; ++i)
      if (views[i].geo.head_dim != hd || views[i].geo.n_kv_heads != sh.n_kv_heads)
        fail("attention: the KV cache holds ", views[i].geo.n_kv_heads, " heads of ", views[i].geo.head_dim,
             ", the model ", sh.n_kv_heads, " of ", hd);
    const int QB = std::max(1, kMaxRows / group);
    // Query blocks: runs of consecutive entries with the same KV view, at most QB long.
    int64_t n_qblocks = 0;
    for (int64_t i = 0; i < M;) {
      int64_t j = i + 1;
      while (j < M && j - i < QB && same_seq(views[j], views[i])) ++j;
      ++n_qblocks;
      i = j;
    }
    const int64_t n_items = n_qblocks * sh.n_kv_heads;
    const int64_t qdim = int64_t(sh.n_heads) * hd;
    std::atomic<int64_t> next{0};
    parallel(int(std::min<int64_t>(threads, n_items)), [&](int, int) {
      // Each thread walks the block list itself (cheap) to map item -> query block.
      int64_t qb_idx = -1, qb_start = 0, qb_end = 0;
      for (int64_t item; (item = next.fetch_add(1, std::memory_order_relaxed)) < n_items;) {
        const int64_t want = item / sh.n_kv_heads;
        if (want < qb_idx) {
          qb_idx = -1;
          qb_end = 0;
        }
        while (qb_idx < want) {
          qb_start = qb_end;
          int64_t j = qb_start + 1;
          while (j < M && j - qb_start < QB && same_seq(views[j], views[qb_start])) ++j;
          qb_end = j;
          ++qb_idx;
        }
        block(q, qdim, qb_start, qb_end, int(item % sh.n_kv_heads), group, views[qb_start], n_ctx, sh, out);
      }
    });
  }

  static void block(const float* q, int64_t qdim, int64_t i0, int64_t i1, int g, int group,
                    const KVLayerView& kv, const int32_t* n_ctx, const AttentionShape& sh, float* out) {
    Scratch& s = scratch();
    const KVGeometry& geo = kv.geo;
    const int hd = sh.head_dim, nqb = geo.q_blocks();
    const bool q8 = geo.type == GGMLType::Q8_0;
    const int rows = int(i1 - i0) * group;
    int32_t row_ctx[kMaxRows], row_lo[kMaxRows];  // row r sees positions [row_lo, row_ctx)
    int32_t n_end = 0, n_begin = std::numeric_limits<int32_t>::max();
    for (int r = 0; r < rows; ++r) {
      row_ctx[r] = n_ctx[i0 + r / group];
      row_lo[r] = sh.window > 0 ? std::max(0, row_ctx[r] - sh.window) : 0;
      n_end = std::max(n_end, row_ctx[r]);
      n_begin = std::min(n_begin, row_lo[r]);
      const float* qr = q + (i0 + r / group) * qdim + int64_t(g * group + r % group) * hd;
      if (q8) {
        kv_quantize_query(qr, hd, sh.scale, s.Qq + r * hd, s.Qd + r * nqb, s.Qs + r * nqb);
      } else {
        for (int d = 0; d < hd; ++d) s.Q[r * hd + d] = qr[d] * sh.scale;
      }
      s.m[r] = -std::numeric_limits<float>::infinity();
      s.l[r] = 0;
      std::memset(s.O + r * hd, 0, sizeof(float) * size_t(hd));
    }
    const float* vp[kChunk];
    const uint8_t* tiles[kChunkTiles];
    // Chunks start at multiples of kChunk whatever the window: a skipped chunk would have been
    // all masked for every row (p = 0 exactly), so results do not depend on the skipping.
    for (int32_t j0 = n_begin / kChunk * kChunk; j0 < n_end; j0 += kChunk) {
      const int len = std::min(kChunk, n_end - j0);
      // Tiles past the context repeat the first (their scores are masked): every call computes
      // whole chunks.
      for (int t = 0; t < kChunkTiles; ++t)
        tiles[t] = kv.k_tile(j0 + (t * kKvTile < len ? t * kKvTile : 0), g);
      // The next chunk's K tiles and V rows, while this one computes (they come from memory).
      for (int t = 0; t < kChunkTiles && j0 + kChunk + t * kKvTile < n_end; ++t) {
        const int32_t p = j0 + kChunk + t * kKvTile;
        A::prefetch(kv.k_tile(p, g), geo.k_tile_bytes());
        A::prefetch(kv.v_row(p, g), geo.v_row_bytes() * uint64_t(std::min(kKvTile, n_end - p)));
      }
      const bool half = geo.type == GGMLType::F16 || geo.type == GGMLType::BF16;
      const bool widen_once = half && rows > kWidenInRegistersRows;
      if (q8) {
        A::scores_q8(rows, s.Qq, s.Qd, s.Qs, hd, nqb, tiles, s.S, kChunk);
      } else if (widen_once) {
        // A tile is hd * 16 contiguous elements: widened as one "row" of that length.
        const KVGeometry flat{geo.type, 1, hd * kKvTile, kKvTile};
        const uint8_t* wide[kChunkTiles];
        for (int t = 0; t < kChunkTiles; ++t) {
          if (t > 0 && tiles[t] == tiles[0]) {  // (past the context)
            wide[t] = wide[0];
            continue;
          }
          float* dst = s.K + t * hd * kKvTile;
          A::v_row(flat, tiles[t], dst);
          wide[t] = reinterpret_cast<const uint8_t*>(dst);
        }
        A::scores_f(GGMLType::F32, rows, s.Q, hd, wide, s.S, kChunk);
      } else {
        A::scores_f(geo.type, rows, s.Q, hd, tiles, s.S, kChunk);
      }
      if (sh.softcap > 0) softcap_scores(s.S, rows * kChunk, sh.softcap);
      for (int r = 0; r < rows; ++r) {
        for (int j = std::max(0, row_ctx[r] - j0); j < kChunk; ++j) s.S[r * kChunk + j] = -std::numeric_limits<float>::infinity();
        for (int j = 0; j < std::min(kChunk, row_lo[r] - j0); ++j) s.S[r * kChunk + j] = -std::numeric_limits<float>::infinity();
      }
      A::softmax(s.S, kChunk, rows, s.m, s.l, s.alpha);
      if constexpr (requires { A::pv_half; }) {
        if (half && !widen_once) {  // V widened in registers
          const uint8_t* raw[kChunk];
          for (int j = 0; j < len; ++j) raw[j] = kv.v_row(j0 + j, g);
          A::pv_half(geo.type, rows, s.O, hd, s.alpha, s.S, kChunk, raw, len);
          continue;
        }
      }
      for (int j = 0; j < len; ++j) {
        const uint8_t* row = kv.v_row(j0 + j, g);
        if (geo.type == GGMLType::F32) {
          vp[j] = reinterpret_cast<const float*>(row);
        } else {
          A::v_row(geo, row, s.V + j * hd);
          vp[j] = s.V + j * hd;
        }
      }
      A::pv(rows, s.O, hd, s.alpha, s.S, kChunk, vp, len);
    }
    for (int r = 0; r < rows; ++r) {
      float* o = out + (i0 + r / group) * qdim + int64_t(g * group + r % group) * hd;
      float inv = 1.0f / s.l[r];
      if (sh.sinks) inv = sink_scale(sh.sinks[g * group + r % group], s.m[r], s.l[r]);
      for (int d = 0; d < hd; ++d) o[d] = s.O[r * hd + d] * inv;
    }
  }
};

}  // namespace ft::cpu
