// The GEMM and flash-attention drivers, written once and instantiated per instruction set: an
// Isa class supplies the inner kernels (tile dot products, dequantization, exp, P·V update).
// Included only by avx2.cpp (compiled for AVX2+FMA) and scalar.cpp.
//
// Summation order (the numerics contract, the same for every M, so a row's result does not
// depend on how many rows are in the batch; chunked prefill == one batch, GEMV == GEMM):
//   y[m][n] = sum over K chunks of kKC, in order, of chunk_dot, where chunk_dot keeps 8 lane
//   partial sums (lane l takes k = l mod 8, fused multiply-adds in k order), reduces them as
//   ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), then adds the len % 8 tail elements in order.
// Weights are dequantized to f32 exactly as dequantize_row does (bit-identical values).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"

namespace ft::cpu {

template <class Isa>
struct Drivers {
  // (Everything here is a member so each ISA gets its own copy; no shared inline symbols.)
  // Elements per block and bytes per block of a weight type (F32/F16/BF16: one element).
  static void block_geometry(GGMLType t, int64_t& elems, int64_t& bytes) {
    switch (t) {
      case GGMLType::F32: elems = 1; bytes = 4; return;
      case GGMLType::F16: elems = 1; bytes = 2; return;
      case GGMLType::BF16: elems = 1; bytes = 2; return;
      case GGMLType::Q8_0: elems = 32; bytes = 34; return;
      case GGMLType::Q4_0: elems = 32; bytes = 18; return;
      case GGMLType::Q4_K: elems = 256; bytes = 144; return;
      case GGMLType::Q6_K: elems = 256; bytes = 210; return;
      default: fail("fast kernels: unsupported weight type ", int(t));
    }
  }

  // Per worker thread: the panel's accumulators C (M, kNR) and the dequantized panel.
  struct alignas(64) Scratch {
    std::vector<float> c;
    alignas(32) float w[kNR * kKC];
  };
  static Scratch& scratch() {
    static thread_local Scratch s;
    return s;
  }
  static void reserve(int64_t max_rows, int threads) {
#pragma omp parallel num_threads(threads)
    {
      Scratch& s = scratch();
      if (s.c.size() < size_t(max_rows) * kNR) s.c.resize(size_t(max_rows) * kNR);
    }
  }

  // out[i*nr + j] = chunk_dot(x[i], w[j], len) for i < mr, j < nr (mr, nr <= 3).
  static void tile(int mr, int nr, const float* const* x, const float* const* w, int64_t len,
                   float* out) {
#define FT_TILE(a, b) \
  case a * 4 + b: Isa::template tile<a, b>(x, w, len, out); return;
    switch (mr * 4 + nr) {
      FT_TILE(1, 1) FT_TILE(1, 2) FT_TILE(1, 3)
      FT_TILE(2, 1) FT_TILE(2, 2) FT_TILE(2, 3)
      FT_TILE(3, 1) FT_TILE(3, 2) FT_TILE(3, 3)
      default: return;
    }
#undef FT_TILE
  }

  static constexpr int64_t kSmallM = 2;
  static constexpr int kMR = 3;  // activation rows per register tile (x kNR/8 weight rows: 3x3)
  // One panel: rows[r] (r < nrows) of type types[r], all of the K range;
  // C (M, kNR) = X @ rows^T.
  static void panel(const float* X, int64_t M, int64_t K, const GGMLType* types,
                    const uint8_t* const* rows, int nrows, Scratch& s) {
    float* C = s.c.data();
    const float* wp[kNR];
    if (M <= kSmallM) {
      // Decode / tiny batches: bandwidth-bound. Walk three weight rows at a time along all of K
      // (three sequential streams the prefetcher follows), dequantizing chunk by chunk into L1.
      // Same per-output summation order as below.
      for (int n0 = 0; n0 < nrows; n0 += 3) {
        const int nr = std::min(3, nrows - n0);
        for (int64_t k0 = 0; k0 < K; k0 += kKC) {
          const int64_t len = std::min(kKC, K - k0);
          if (M == 1 && types[n0] == types[n0 + nr - 1]) {  // fused dequant + dot, if the ISA has it
            const uint8_t* rp[3];
            int64_t be, bb;
            block_geometry(types[n0], be, bb);
            const int64_t row_b = K / be * bb, ahead = (k0 + 2 * kKC) / be * bb;
            for (int j = 0; j < nr; ++j) {
              rp[j] = rows[n0 + j] + (k0 / be) * bb;
              if (ahead < row_b)
                Isa::prefetch(rows[n0 + j] + ahead, std::min<int64_t>(kKC / be * bb, row_b - ahead));
              else if (n0 + j + 3 < nrows)
                Isa::prefetch(rows[n0 + j + 3] + (ahead - row_b), std::min<int64_t>(kKC / be * bb, row_b));
            }
            float out[3];
            if (Isa::dot_rows(types[n0], rp, nr, X + k0, len, out)) {
              float* c = C + n0;
              for (int j = 0; j < nr; ++j) c[j] = k0 == 0 ? out[j] : c[j] + out[j];
              continue;
            }
          }
          for (int r = n0; r < n0 + nr; ++r) {
            const GGMLType t = types[r];
            int64_t be, bb;
            block_geometry(t, be, bb);
            // Prefetch this row two chunks ahead (or the next rows' start near the end).
            const int64_t ahead = (k0 + 2 * kKC) / be * bb, row_bytes = K / be * bb;
            if (ahead < row_bytes)
              Isa::prefetch(rows[r] + ahead, std::min<int64_t>(kKC / be * bb, row_bytes - ahead));
            else if (r + 3 < nrows)
              Isa::prefetch(rows[r + 3] + (ahead - row_bytes), std::min<int64_t>(kKC / be * bb, row_bytes));
            if (t == GGMLType::F32) {
              wp[r] = reinterpret_cast<const float*>(rows[r]) + k0;
            } else {
              Isa::dequant(t, rows[r] + (k0 / be) * bb, len, s.w + r * kKC);
              wp[r] = s.w + r * kKC;
            }
          }
          for (int64_t m = 0; m < M; ++m) {
            const float* xp = X + m * K + k0;
            float out[3];
            tile(1, nr, &xp, wp + n0, len, out);
            float* c = C + m * kNR + n0;
            for (int j = 0; j < nr; ++j) c[j] = k0 == 0 ? out[j] : c[j] + out[j];
          }
        }
      }
      return;
    }
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t len = std::min(kKC, K - k0);
      for (int r = 0; r < nrows; ++r) {
        const GGMLType t = types[r];
        int64_t be, bb;
        block_geometry(t, be, bb);
        // F32 rows are copied too: rows kNR apart at a power-of-two stride would all map to
        // the same L1 sets. The panel is contiguous (kNR * kKC floats).
        if (t == GGMLType::F32)
          std::memcpy(s.w + r * kKC, reinterpret_cast<const float*>(rows[r]) + k0, sizeof(float) * size_t(len));
        else
          Isa::dequant(t, rows[r] + (k0 / be) * bb, len, s.w + r * kKC);
        wp[r] = s.w + r * kKC;
      }
      for (int64_t m0 = 0; m0 < M; m0 += kMR) {
        const int mr = int(std::min<int64_t>(kMR, M - m0));
        const float* xp[3];
        for (int i = 0; i < mr; ++i) xp[i] = X + (m0 + i) * K + k0;
        for (int n0 = 0; n0 < nrows; n0 += 3) {
          const int nr = std::min(3, nrows - n0);
          float out[9];
          tile(mr, nr, xp, wp + n0, len, out);
          for (int i = 0; i < mr; ++i) {
            float* c = C + (m0 + i) * kNR + n0;
            if (k0 == 0)
              for (int j = 0; j < nr; ++j) c[j] = out[i * nr + j];
            else
              for (int j = 0; j < nr; ++j) c[j] += out[i * nr + j];
          }
        }
      }
    }
  }

  static void gemm(const float* X, int64_t M, int64_t K, const GemmSeg* segs, int n_segs,
                   Epilogue e, int threads) {
    // Panels: SwiGLU pairs kNR/2 gate rows with the same kNR/2 up rows; otherwise each
    // segment is cut into panels of kNR rows.
    const int per = e == Epilogue::SwiGLU ? kNR / 2 : kNR;
    int64_t n_panels = 0;
    int64_t first[4] = {0, 0, 0, 0};
    const int ns = e == Epilogue::SwiGLU ? 1 : n_segs;
    for (int i = 0; i < ns; ++i) {
      first[i] = n_panels;
      n_panels += (segs[i].n_rows + per - 1) / per;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t p = 0; p < n_panels; ++p) {
      Scratch& s = scratch();
      if (s.c.size() < size_t(M) * kNR) s.c.resize(size_t(M) * kNR);  // only if reserve() was short
      int si = 0;
      while (si + 1 < ns && p >= first[si + 1]) ++si;
      const GemmSeg& g = segs[si];
      const int64_t n0 = (p - first[si]) * per;
      const int cnt = int(std::min<int64_t>(per, g.n_rows - n0));
      const uint8_t* rows[kNR];
      GGMLType types[kNR];
      for (int r = 0; r < cnt; ++r) {
        rows[r] = g.data + uint64_t(n0 + r) * g.row_bytes;
        types[r] = g.type;
      }
      int nrows = cnt;
      if (e == Epilogue::SwiGLU) {
        for (int r = 0; r < cnt; ++r) {
          rows[cnt + r] = segs[1].data + uint64_t(n0 + r) * segs[1].row_bytes;
          types[cnt + r] = segs[1].type;
        }
        nrows = 2 * cnt;
      }
      panel(X, M, K, types, rows, nrows, s);
      const float* C = s.c.data();
      for (int64_t m = 0; m < M; ++m) {
        const float* c = C + m * kNR;
        float* y = g.Y + m * g.ldy + n0;
        switch (e) {
          case Epilogue::Store:
            if (g.bias)
              for (int j = 0; j < cnt; ++j) y[j] = c[j] + g.bias[n0 + j];
            else
              for (int j = 0; j < cnt; ++j) y[j] = c[j];
            break;
          case Epilogue::Add:
            for (int j = 0; j < cnt; ++j) y[j] += c[j];
            break;
          case Epilogue::SwiGLU:
            for (int j = 0; j < cnt; ++j) {
              const float gt = c[j];
              y[j] = gt / (1.0f + std::exp(-gt)) * c[cnt + j];
            }
            break;
        }
      }
    }
  }

  // ---------------------------------------------------------------------------------------
  // Flash attention. Work item = (query block, KV head): a run of up to QB consecutive batch
  // entries of the same sequence (same block table) x the `group` query heads sharing that KV
  // head, i.e. rows = QB * group query vectors. KV is walked in blocks of kKB positions through
  // the block table (no copy); scores of one block (rows x kKB) live in per-thread scratch,
  // softmax is online (running max m, sum l, output O rescaled by exp(m_old - m_new)), scale
  // and the causal mask (position < n_ctx of the row's query) are applied as scores are made.
  // Memory per thread: O(rows * (kKB + head_dim)), independent of context length. A row's
  // result depends only on its query and its n_ctx (blocks are at fixed absolute positions;
  // fully masked blocks leave m, l and O unchanged exactly), not on which rows share its block.
  static constexpr int kKB = 32;
  static constexpr int kMaxRows = 64;
  static constexpr int kMaxHead = 256;
  struct alignas(64) AttnScratch {
    alignas(32) float S[kMaxRows * kKB];
    alignas(32) float O[kMaxRows * kMaxHead];
    float m[kMaxRows], l[kMaxRows], alpha[kMaxRows];
  };
  static AttnScratch& attn_scratch() {
    static thread_local AttnScratch s;
    return s;
  }

  static void attention(const float* q, int64_t M, const KVLayerView* views, const int32_t* n_ctx,
                        const AttentionShape& sh, float* out, int threads) {
    const int group = sh.n_heads / sh.n_kv_heads;
    const int hd = sh.head_dim;
    if (group > kMaxRows || hd > kMaxHead)
      fail("attention: ", group, " query heads per KV head or head_dim ", hd, " exceeds the kernel's limits");
    const int QB = std::max(1, kMaxRows / group);
    // Query blocks: runs of consecutive entries with the same KV view, at most QB long.
    // (At most M blocks; a small fixed array per call would cap M, so count on the fly.)
    int64_t n_qblocks = 0;
    for (int64_t i = 0; i < M;) {
      int64_t j = i + 1;
      while (j < M && j - i < QB && views[j].block_table == views[i].block_table &&
             views[j].k_pool == views[i].k_pool)
        ++j;
      ++n_qblocks;
      i = j;
    }
    const int64_t n_items = n_qblocks * sh.n_kv_heads;
    const int64_t qdim = int64_t(sh.n_heads) * hd;
#pragma omp parallel num_threads(threads)
    {
      // Each thread walks the block list itself (cheap) to map item -> query block.
      int64_t qb_idx = -1, qb_start = 0, qb_end = 0;
#pragma omp for schedule(dynamic, 1)
      for (int64_t item = 0; item < n_items; ++item) {
        const int64_t want = item / sh.n_kv_heads;
        if (want < qb_idx) { qb_idx = -1; qb_end = 0; }
        while (qb_idx < want) {
          qb_start = qb_end;
          int64_t j = qb_start + 1;
          while (j < M && j - qb_start < QB && views[j].block_table == views[qb_start].block_table &&
                 views[j].k_pool == views[qb_start].k_pool)
            ++j;
          qb_end = j;
          ++qb_idx;
        }
        block(q, qdim, qb_start, qb_end, int(item % sh.n_kv_heads), group, views[qb_start], n_ctx,
              sh, out);
      }
    }
  }

  static void block(const float* q, int64_t qdim, int64_t i0, int64_t i1, int g, int group,
                    const KVLayerView& kv, const int32_t* n_ctx, const AttentionShape& sh,
                    float* out) {
    AttnScratch& s = attn_scratch();
    const int hd = sh.head_dim;
    const int nq = int(i1 - i0);
    const int rows = nq * group;
    const float* qp[kMaxRows];
    int32_t row_ctx[kMaxRows];
    int32_t n_end = 0;
    for (int qi = 0; qi < nq; ++qi)
      for (int hh = 0; hh < group; ++hh) {
        const int r = qi * group + hh;
        qp[r] = q + (i0 + qi) * qdim + int64_t(g * group + hh) * hd;
        row_ctx[r] = n_ctx[i0 + qi];
        n_end = std::max(n_end, row_ctx[r]);
      }
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < rows; ++r) {
      s.m[r] = ninf;
      s.l[r] = 0;
      std::memset(s.O + r * hd, 0, sizeof(float) * size_t(hd));
    }
    const int64_t kv_off = int64_t(g) * hd;
    const float* kp[kKB];
    const float* vp[kKB];
    for (int32_t j0 = 0; j0 < n_end; j0 += kKB) {
      const int len = std::min(kKB, n_end - j0);
      for (int j = 0; j < len; ++j) {
        const int32_t pos = j0 + j;
        const int64_t row = int64_t(kv.block_table[pos / kv.block_size]) * kv.block_size + pos % kv.block_size;
        kp[j] = kv.k_pool + row * kv.kv_dim + kv_off;
        vp[j] = kv.v_pool + row * kv.kv_dim + kv_off;
      }
      // S = scale * Q K^T, masked.
      for (int r0 = 0; r0 < rows; r0 += 3) {
        const int mr = std::min(3, rows - r0);
        for (int c0 = 0; c0 < len; c0 += 3) {
          const int nr = std::min(3, len - c0);
          float o[9];
          tile(mr, nr, qp + r0, kp + c0, hd, o);
          for (int i = 0; i < mr; ++i)
            for (int j = 0; j < nr; ++j)
              s.S[(r0 + i) * kKB + c0 + j] =
                  j0 + c0 + j < row_ctx[r0 + i] ? o[i * nr + j] * sh.scale : ninf;
        }
      }
      // Online softmax per row, always over kKB columns (the ones past len masked) so the
      // summation order of l does not depend on which rows share the block.
      for (int r = 0; r < rows; ++r) {
        float* S = s.S + r * kKB;
        for (int j = len; j < kKB; ++j) S[j] = ninf;
        float mx = ninf;
        for (int j = 0; j < len; ++j) mx = std::max(mx, S[j]);
        const float m_new = std::max(s.m[r], mx);
        if (m_new == ninf) {  // nothing visible yet: leave the row as it is
          s.alpha[r] = 1.0f;
          for (int j = 0; j < kKB; ++j) S[j] = 0;
          continue;
        }
        s.alpha[r] = s.m[r] == ninf ? 0.0f : Isa::exp1(s.m[r] - m_new);
        const float sum = Isa::exp_row(S, kKB, m_new);
        s.l[r] = s.l[r] * s.alpha[r] + sum;
        s.m[r] = m_new;
      }
      // O = O * alpha + P V.
      for (int r0 = 0; r0 < rows; r0 += 3) {
        const int nr = std::min(3, rows - r0);
        Isa::pv(nr, s.O + r0 * hd, s.alpha + r0, s.S + r0 * kKB, kKB, vp, len, hd);
      }
    }
    for (int qi = 0; qi < nq; ++qi)
      for (int hh = 0; hh < group; ++hh) {
        const int r = qi * group + hh;
        float* o = out + (i0 + qi) * qdim + int64_t(g * group + hh) * hd;
        const float inv = 1.0f / s.l[r];
        for (int d = 0; d < hd; ++d) o[d] = s.O[r * hd + d] * inv;
      }
  }
};

template <class Isa>
const IsaKernels& make_table(const char* name) {
  static const IsaKernels k{name, &Drivers<Isa>::gemm, &Drivers<Isa>::attention,
                            &Drivers<Isa>::reserve};
  return k;
}

}  // namespace ft::cpu
