// The GEMM drivers, written once and instantiated per instruction set: an
// Isa class supplies the inner kernels (tile dot products, dequantization). (Attention: attention_impl.h.)
// Included only by avx2.cpp (compiled for AVX2+FMA) and scalar.cpp.
//
// Numerics contract (the same for every M, so a row's result does not depend on how many rows
// are in the batch: chunked prefill == one batch, decode GEMV == prefill GEMM, bitwise):
//   F32/F16 weights: every output is ONE fused multiply-add chain over k in order, weights
//   dequantized to f32 exactly as dequantize_row does;
//   quantized weights: the integer path of packed.h (int8 activations, exact integer block sums,
//   one fma chain over 32-blocks in order);
//   BF16 weights: AVX-512 BF16's vdpbf16ps, which every ISA computes or emulates bit for bit:
//   x rounded to bf16 (round_bf16), then one f32 chain per output over the pairs of k in order,
//   y = fma(x[2p+1], w[2p+1], y); y = fma(x[2p], w[2p], y), denormal inputs and results flushed
//   to zero (an odd K's last k pairs with a zero: y = y + 0 first).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/rowwise.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/quant.h"

namespace ft::cpu {

// The integer path's activation rows of one register tile (up to kMaxIntRows): row j's quantized
// values xq[j] (int16) and xq8[j] (the same as int8; only for ISAs with kInt8Act) from the
// chunk's k0, and its blocks' dx[j] and xs[j] (sum of xq) from block k0 / 32.
constexpr int kMaxIntRows = 8;
struct IntRows {
  const int16_t* xq[kMaxIntRows];
  const int8_t* xq8[kMaxIntRows];
  const float* dx[kMaxIntRows];
  const int32_t* xs[kMaxIntRows];
  const int32_t* xs0[kMaxIntRows];  // (the sums of each block's first 16: Q6_K's half blocks)
  const float* fx[kMaxIntRows];      // (dx times each half block's sum: Q2_K's mins; QAct::fx)
};

// An Isa's optional properties (see Drivers): kInt8Act (activations also as int8), kMRInt.
template <class Isa>
constexpr bool int8_act() {
  if constexpr (requires { Isa::kInt8Act; }) return Isa::kInt8Act;
  else return false;
}

template <class Isa>
struct Drivers {
  // (Everything here is a member so each ISA gets its own copy; no shared inline symbols.)
  // Per worker thread: the work item's accumulators C (M, kItemGroups * kGroup), the weights of
  // one K chunk unpacked to f32 (kKC, kGroup) per group, and rows dequantized before transposing.
  static constexpr int kItemGroups = 2;
  static constexpr int64_t kQPerKC = kKC / kQBlock;
  struct alignas(64) Scratch {
    std::vector<float> c;
    std::vector<float> run_c;  // gemm_run: its run's items' C, one after another
    alignas(64) float w[kItemGroups][kKC * kGroup];
    alignas(64) float t[kGroup * kKC];
    // Integer path: one K chunk of a group as unpack_group_int gives it (Q2_K's min scales after
    // it: q2k_min_scales), and (GGUF rows only) the chunk packed first (Q8_0 is the largest per
    // element: 34 bytes per 32).
    alignas(64) int16_t v[kItemGroups][kKC * kGroup + q2k_min_scales_int16s(kKC)];
    alignas(64) float s1[kItemGroups][kQPerKC * kGroup];
    alignas(64) float s2[kItemGroups][kQPerKC * kGroup];
    alignas(64) uint8_t raw[kQPerKC * (32 + 32 * kGroup)];
    alignas(64) uint8_t conv[kGroup * kQPerKC * 34];  // (MXFP4 rows as Q8_0 rows: int_weights_at)
  };
  static Scratch& scratch() {
    static thread_local Scratch s;
    return s;
  }
  static void quantize(const float* X, int64_t M, int64_t K, QAct& q, int threads) {
    q.reserve(M, K);  // (no-op after Backend::reserve)
    const int64_t kb = K / kQBlock;
    parallel_for_static(M, M * K >= (1 << 16) ? threads : 1, [&](int64_t m) {
      if constexpr (requires { Isa::quantize_act; }) {  // (vectorized, both forms at once)
        Isa::quantize_act(X + m * K, K, q.xq.data() + m * K, q.xq8.data() + m * K, q.dx.data() + m * kb,
                          q.xs.data() + m * kb, q.xs0.data() + m * kb);
      } else {
        quantize_activations(X + m * K, K, q.xq.data() + m * K, q.dx.data() + m * kb, q.xs.data() + m * kb);
        for (int64_t b = 0; b < kb; ++b) {
          int32_t s = 0;
          for (int e = 0; e < kQBlock / 2; ++e) s += q.xq[size_t(m * K + b * kQBlock + e)];
          q.xs0[size_t(m * kb + b)] = s;
        }
        if constexpr (int8_act<Isa>()) {
          const int16_t* a = q.xq.data() + m * K;
          int8_t* b = q.xq8.data() + m * K;
          for (int64_t k = 0; k < K; ++k) b[k] = int8_t(a[k]);  // |xq| <= 127: exact
        }
      }
      const float* dx = q.dx.data() + m * kb;
      const int32_t *xs = q.xs.data() + m * kb, *xs0 = q.xs0.data() + m * kb;
      float* fx = q.fx.data() + 2 * m * kb;
      for (int64_t b = 0; b < kb; ++b) fx[2 * b] = dx[b] * float(xs0[b]), fx[2 * b + 1] = dx[b] * float(xs[b] - xs0[b]);
    });
  }

  // X (M, K) -> qa.xbf (and qa.xbs where kBf16Panels, qa.xbp where kBf16Dot: QAct): each x
  // rounded to the nearest bf16, ties to even, a denormal to zero (as vcvtneps2bf16 does), a NaN
  // kept quiet; a zero after an odd K.
  static void round_bf16(const float* X, int64_t M, int64_t K, QAct& q, int threads) {
    const int64_t Kp = K + (K & 1);
    q.reserve_bf16(M, K);
    parallel_for_static(M, M * K >= (1 << 16) ? threads : 1, [&](int64_t m) {
      // (Branch-free bit operations, so that the compiler vectorizes them for the ISA: a
      // prefill's GEMMs round every activation once per call.)
      const float* x = X + m * K;
      float* f = q.xbf.data() + m * Kp;
      int64_t k0 = 0;
      if constexpr (requires { Isa::round_bf16_8; })  // (8 at a time; the rest below)
        for (; k0 + 8 <= K; k0 += 8) Isa::round_bf16_8(x + k0, f + k0);
      for (int64_t k = k0; k < K; ++k) {
        uint32_t u;
        std::memcpy(&u, x + k, 4);
        u = bf16_bits_daz(u);
        std::memcpy(f + k, &u, 4);
      }
      if (K & 1) f[K] = 0;
      if constexpr (kBf16Panels) {
        float* fs = q.xbs.data() + m * Kp;
        for (int64_t k = 0; k < Kp; k += 2) fs[k] = f[k + 1], fs[k + 1] = f[k];
      }
      if constexpr (kBf16Dot) {  // (the pairs: for vdpbf16ps)
        uint32_t* p = q.xbp.data() + m * Kp / 2;
        for (int64_t k = 0; k < Kp; k += 2) {
          uint32_t lo, hi;
          std::memcpy(&lo, f + k, 4);
          std::memcpy(&hi, f + k + 1, 4);
          p[k / 2] = lo >> 16 | (hi & 0xffff0000u);
        }
      }
    });
  }
  // The f32 bits of x rounded to bf16 as round_bf16 says. (Not core/fp16.h's: this file is
  // compiled once per ISA, each copy its own.)
  static uint32_t bf16_bits_daz(uint32_t u) {
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) & 0xffff0000u;
    const uint32_t nan = (u | 0x00400000u) & 0xffff0000u;  // (quiet)
    const uint32_t zero = u & 0x80000000u;
    return (u & 0x7f800000u) == 0 ? zero : (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
  }
  // MXCSR's flush-to-zero and denormals-are-zero for a scope where `on` (x86): the f32 FMAs of
  // the ISAs that emulate vdpbf16ps then flush as it does. Held by each thread for a whole GEMM
  // with BF16 weights (gemm: parallel_for_runs_in), epilogues included, on every ISA alike: a
  // change of MXCSR waits for the loads in flight (one per work item made the 5632 x 2048
  // decode GEMV 1.5x slower on the Zen 5).
  struct FlushDenormals {
#if defined(__x86_64__) || defined(__i386__)
    bool on;
    unsigned saved = 0;
    explicit FlushDenormals(bool on_) : on(on_) {
      if (on) saved = __builtin_ia32_stmxcsr(), __builtin_ia32_ldmxcsr(saved | 0x8040u);
    }
    ~FlushDenormals() {
      if (on) __builtin_ia32_ldmxcsr(saved);
    }
#else
    explicit FlushDenormals(bool) {}
#endif
    FlushDenormals(const FlushDenormals&) = delete;
    FlushDenormals& operator=(const FlushDenormals&) = delete;
  };

  static void reserve(int64_t max_rows, int threads) {
    parallel(threads, [&](int, int) {
      Scratch& s = scratch();
      if (s.c.size() < size_t(max_rows) * kItemGroups * kGroup) s.c.resize(size_t(max_rows) * kItemGroups * kGroup);
    });
  }

  // One group of up to kGroup output rows of one segment: packed (panel layout) or GGUF rows.
  struct Source {
    const GemmSeg* seg = nullptr;
    int64_t n0 = 0;  // first row
    int cnt = 0;     // rows (<= kGroup)
    const uint8_t* group() const { return seg->data + uint64_t(n0 / kGroup) * seg->row_bytes; }
  };

  // Wp (len, kGroup) = the f32 weights of src at k in [k0, k0 + len).
  static const float* weights_at(const Source& src, int64_t k0, int64_t len, float* Wp,
                                 float* tmp) {
    const GemmSeg& g = *src.seg;
    if (g.packed) {
      if (g.type == GGMLType::F32) return reinterpret_cast<const float*>(src.group()) + k0 * kGroup;
      Isa::unpack(g.type, src.group(), k0, len, Wp);
      return Wp;
    }
    // (Float types only: quantized ones take the integer path.)
    const uint64_t skip = *row_bytes(g.type, uint64_t(k0));
    for (int r = 0; r < src.cnt; ++r) {
      const uint8_t* row = g.data + uint64_t(src.n0 + r) * g.row_bytes + skip;
      if (g.type == GGMLType::F32)
        std::memcpy(tmp + r * kKC, row, sizeof(float) * size_t(len));
      else
        Isa::dequant(g.type, row, len, tmp + r * kKC);
    }
    for (int64_t k = 0; k < len; ++k)
      for (int r = 0; r < kGroup; ++r) Wp[k * kGroup + r] = r < src.cnt ? tmp[r * kKC + k] : 0.0f;
    return Wp;
  }

  // C (M, ldc)[:, s*kGroup : (s+1)*kGroup] = X (M, K) @ W_s^T for each source s.
  // Numerics: every output is ONE fused multiply-add chain over k = 0..K-1 in order, starting
  // from 0 (the micro-kernel stores and reloads C between K chunks, which is exact), whatever M,
  // the path (fused small-M or unpacked panel) or the ISA. So a row's result does not depend
  // on the batch it is in: chunked prefill == one batch, decode GEMV == prefill GEMM, bitwise.
  static void float_item(const float* X, int64_t M, int64_t K, const Source* src, int ns,
                         Scratch& s, float* C, int64_t ldc) {
    if constexpr (Isa::kFusedMaxM > 0) {
      // Small M (decode; where the Isa says so, small batches): dequantize in registers, all
      // of K, no unpacked copy.
      bool fused = M <= Isa::kFusedMaxM;
      if constexpr (requires { Isa::kFusedMaxMFloat; }) fused = M <= Isa::kFusedMaxMFloat;
      for (int i = 0; i < ns; ++i) fused = fused && src[i].seg->packed;
      if (fused) {
        const uint8_t* groups[kItemGroups];
        for (int i = 0; i < ns; ++i) groups[i] = src[i].group();
        if (ns == 2 && src[0].seg->type == src[1].seg->type) {
          Isa::gemv(src[0].seg->type, groups, 2, K, X, M, C, ldc);
        } else {
          for (int i = 0; i < ns; ++i) Isa::gemv(src[i].seg->type, groups + i, 1, K, X, M, C + i * kGroup, ldc);
        }
        return;
      }
    }
    // Rows in blocks of kMC, so a block's X chunk (kMC, kKC) stays in L2 while every K chunk's
    // weights are unpacked again per block (cheap next to kMC / kMR micro-kernel calls).
    for (int64_t mb = 0; mb < M; mb += kMC) {
      const int64_t me = std::min(M, mb + kMC);
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t len = std::min(kKC, K - k0);
        const float* wp[kItemGroups];
        for (int i = 0; i < ns; ++i) wp[i] = weights_at(src[i], k0, len, s.w[i], s.t);
        // Rows split evenly into tiles of at most kMR (13 -> 5+4+4, not 6+6+1): a tile of
        // fewer than 4 rows has too few independent FMA chains to hide their latency.
        const int64_t rows = me - mb, n_tiles = (rows + kMR - 1) / kMR;
        for (int64_t t = 0, m0 = mb; t < n_tiles; ++t) {
          const int mr = int(rows / n_tiles + (t < rows % n_tiles ? 1 : 0));
          const float* xr[kMR];
          for (int i = 0; i < mr; ++i) xr[i] = X + (m0 + i) * K + k0;
          if constexpr (requires { Isa::mk_rows_n; }) {
            Isa::mk_rows_n(mr, xr, wp, ns, len, C + m0 * ldc, ldc, k0 == 0);
          } else {
            for (int i = 0; i < ns; ++i)
              Isa::mk_rows(mr, xr, wp[i], len, C + m0 * ldc + i * kGroup, ldc, k0 == 0);
          }
          m0 += mr;
        }
      }
    }
  }

  // The integer path's view of one K chunk of src (packed.h): V, S1, S2 for [k0, k0 + len).
  static void int_weights_at(const Source& src, int64_t k0, int64_t len, int16_t* V, float* S1,
                             float* S2, uint8_t* raw, uint8_t* conv) {
    const GemmSeg& g = *src.seg;
    if (g.packed) {
      const int64_t bl = block_len(g.type);
      Isa::unpack_int(g.type, src.group() + uint64_t(k0 / bl) * packed_block_bytes(g.type), k0 % bl,
                      len, V, S1, S2);
      return;
    }
    // GGUF rows (a weight not prepared): pack this chunk of the group's rows first.
    const int64_t bl = block_len(g.type);
    const uint64_t bb = *row_bytes(g.type, uint64_t(bl));
    const uint8_t* rows = g.data + uint64_t(src.n0) * g.row_bytes + uint64_t(k0 / bl) * bb;
    if (g.type == GGMLType::MXFP4) {  // (as Q8_0, its GEMM form: packed.h; a refused block fails)
      const uint64_t rb = uint64_t(len / kQBlock) * 34;  // (Q8_0 rows of len)
      convert_rows(g.type, rows, g.row_bytes, src.cnt, len, conv);
      Isa::pack_rows(GGMLType::Q8_0, conv, rb, src.cnt, len, raw);
      return Isa::unpack_int(GGMLType::Q8_0, raw, 0, len, V, S1, S2);
    }
    Isa::pack_rows(g.type, rows, g.row_bytes, src.cnt, len, raw);
    Isa::unpack_int(g.type, raw, 0, len, V, S1, S2);
  }

  // Integer path (quantized weights; qa = X quantized): C as float_item.
  // (Rows [r0, r0 + M) of qa: a row block of a large GEMM.)
  static void int_item(const QAct& qa, int64_t r0, int64_t M, int64_t K, const Source* src, int ns,
                       Scratch& s, float* C, int64_t ldc) {
    if (ns == 2 && src[0].seg->type != src[1].seg->type) {  // (a mixed gate/up pair: one at a time)
      int_item(qa, r0, M, K, src, 1, s, C, ldc);
      return int_item(qa, r0, M, K, src + 1, 1, s, C + kGroup, ldc);
    }
    const GGMLType type = src[0].seg->type;
    const int64_t nkb = K / kQBlock;
    if constexpr (Isa::kFusedMaxM > 0) {
      // Small M (decode; and, where the Isa says so, small prefill chunks): straight from the
      // packed bytes, all of K, no unpacked copy. (Either path gives the same bits; r0 > 0 here:
      // a LoRA shrink's run of rows, gemm_runs.)
      bool fused = M <= Isa::kFusedMaxM;
      if constexpr (requires { Isa::fused_int(type, M); }) fused = Isa::fused_int(type, M);
      for (int i = 0; i < ns; ++i) fused = fused && src[i].seg->packed;
      if (fused) {
        if constexpr (requires { Isa::gemv_int_n; }) {  // (the item's groups in one pass)
          const uint8_t* groups[kItemGroups];
          for (int i = 0; i < ns; ++i) groups[i] = src[i].group();
          Isa::gemv_int_n(type, groups, ns, K, qa, r0, M, C, ldc);
        } else {
          for (int i = 0; i < ns; ++i)
            Isa::gemv_int(type, src[i].group(), K, qa, r0, M, C + i * kGroup, ldc);
        }
        return;
      }
    }
    for (int64_t mb = 0; mb < M; mb += kMCInt) {
      const int64_t me = std::min(M, mb + kMCInt);
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t len = std::min(kKC, K - k0);
        for (int i = 0; i < ns; ++i) {
          // The next chunk's packed bytes, while this one computes: with few rows (the
          // scheduler's small chunks) the weights stream from memory as in decode.
          if (src[i].seg->packed && k0 + kKC < K) {
            const int64_t bl = block_len(type);
            const uint64_t bb = packed_block_bytes(type);
            Isa::prefetch_bytes(src[i].group() + uint64_t((k0 + kKC) / bl) * bb, int64_t(uint64_t(kKC / bl) * bb));
          }
          int_weights_at(src[i], k0, len, s.v[i], s.s1[i], s.s2[i], s.raw, s.conv);
        }
        const int16_t* V[kItemGroups] = {s.v[0], s.v[1]};
        const float* S1[kItemGroups] = {s.s1[0], s.s1[1]};
        const float* S2[kItemGroups] = {s.s2[0], s.s2[1]};
        int64_t m_tiles = mb;  // (rows before it done by the Isa's matrix tiles, where it has them)
        if constexpr (requires { Isa::mk_int_tiles; }) {
          const int64_t r = r0 + mb;
          m_tiles += Isa::mk_int_tiles(type,  /* (each maps through gemm_type) */ qa.xq8.data() + r * K + k0, K, qa.dx.data() + r * nkb + k0 / kQBlock,
                                       qa.xs.data() + r * nkb + k0 / kQBlock, nkb, me - mb, V, S1, S2, ns, len,
                                       C + mb * ldc, ldc, k0 == 0);
        }
        const int64_t rows = me - m_tiles, n_tiles = (rows + kMRInt - 1) / kMRInt;
        for (int64_t t = 0, m0 = m_tiles; t < n_tiles; ++t) {
          const int mr = int(rows / n_tiles + (t < rows % n_tiles ? 1 : 0));
          IntRows xr;
          for (int j = 0; j < mr; ++j) {
            xr.xq[j] = qa.xq.data() + (r0 + m0 + j) * K + k0;
            xr.xq8[j] = qa.xq8.data() + (r0 + m0 + j) * K + k0;
            xr.dx[j] = qa.dx.data() + (r0 + m0 + j) * nkb + k0 / kQBlock;
            xr.xs[j] = qa.xs.data() + (r0 + m0 + j) * nkb + k0 / kQBlock;
            xr.xs0[j] = qa.xs0.data() + (r0 + m0 + j) * nkb + k0 / kQBlock;
            xr.fx[j] = qa.fx.data() + 2 * ((r0 + m0 + j) * nkb + k0 / kQBlock);
          }
          Isa::mk_int(mr, xr, type, V, S1, S2, ns, len, C + m0 * ldc, ldc, k0 == 0);
          m0 += mr;
        }
      }
    }
  }

  // BF16 weights (qa: X as round_bf16 gives it): C as float_item, on the numerics of vdpbf16ps
  // (see the top of this file), whatever M, chunk or ISA. Every M takes one path: Isa::mk_bf16
  // straight from the packed bytes (a GGUF rows source is packed a chunk at a time first), rows
  // in blocks of kMC, each block over K chunks of kKC (even: no pair is split), tiles of up to
  // Isa::kMRBf16 rows; one tile of packed weights (decode) over all of K at once.
  // Isa::mk_bf16(mr, xf, xp, w, ng, len, C, ldc, first): C (mr, ldc)[:, 16g : 16g + 16] (+)= the
  // chain over k in [0, len) (len even, or odd at K's end) of rows xf[i] / xp[i] (bf16 as f32,
  // as pairs, from the chunk's first k) and groups w[g] (packed.h, from the chunk's first k), for
  // mr <= Isa::kMRBf16 and ng <= kItemGroups (4 at mr = 1: gemv_items).
  static void bf16_item(const QAct& qa, int64_t r0, int64_t M, int64_t K, const Source* src, int ns,
                        Scratch& s, float* C, int64_t ldc) {
    static_assert(kKC % 2 == 0);  // (MXCSR: gemm's FlushDenormals)
    const int64_t Kp = K + (K & 1);
    if constexpr (kBf16Panels) {
      if (M > Isa::kMRBf16) return bf16_panels(qa, r0, M, K, src, ns, s, C, ldc);
    }
    bool whole = M <= Isa::kMRBf16;
    for (int i = 0; i < ns; ++i) whole = whole && src[i].seg->packed;
    const int64_t kc = whole ? Kp : kKC;
    for (int64_t mb = 0; mb < M; mb += kMC) {
      const int64_t me = std::min(M, mb + kMC);
      for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t len = std::min(kc, K - k0);
        const uint8_t* w[kItemGroups];
        for (int i = 0; i < ns; ++i) {
          const GemmSeg& g = *src[i].seg;
          if (g.packed) {
            w[i] = src[i].group() + uint64_t(k0) * packed_block_bytes(GGMLType::BF16);
          } else {  // (a chunk of 16 rows' bf16: kKC * 32 bytes, inside w's f32 scratch)
            uint8_t* out = reinterpret_cast<uint8_t*>(s.w[i]);
            Isa::pack_rows(GGMLType::BF16, g.data + uint64_t(src[i].n0) * g.row_bytes + uint64_t(k0) * 2,
                           g.row_bytes, src[i].cnt, len, out);
            w[i] = out;
          }
        }
        const int64_t rows = me - mb, n_tiles = (rows + Isa::kMRBf16 - 1) / Isa::kMRBf16;
        for (int64_t t = 0, m0 = mb; t < n_tiles; ++t) {
          const int mr = int(rows / n_tiles + (t < rows % n_tiles ? 1 : 0));
          const float* xf[Isa::kMRBf16];
          const uint32_t* xp[Isa::kMRBf16];
          for (int i = 0; i < mr; ++i) {
            xf[i] = qa.xbf.data() + (r0 + m0 + i) * Kp + k0;
            xp[i] = qa.xbp.data() + ((r0 + m0 + i) * Kp + k0) / 2;
          }
          Isa::mk_bf16(mr, xf, xp, w, ns, len, C + m0 * ldc, ldc, k0 == 0);
          m0 += mr;
        }
      }
    }
  }

  // Isa::kBf16Panels (ISAs that emulate vdpbf16ps): more rows than one tile take the f32 GEMM's
  // micro-kernel (mk_rows) instead, over each K chunk unpacked to f32 with each pair's two k
  // swapped (an odd chunk end's pair: its zero first) against qa.xbs: the same chain per output,
  // the emulating kernels' conversions once per chunk rather than once per tile.
  static constexpr bool kBf16Panels = [] {
    if constexpr (requires { Isa::kBf16Panels; }) return Isa::kBf16Panels;
    else return false;
  }();
  // Isa::kBf16Dot: mk_bf16 reads the activations as pairs (qa.xbp: vdpbf16ps), else as f32.
  static constexpr bool kBf16Dot = [] {
    if constexpr (requires { Isa::kBf16Dot; }) return Isa::kBf16Dot;
    else return false;
  }();
  static void bf16_panels(const QAct& qa, int64_t r0, int64_t M, int64_t K, const Source* src, int ns,
                          Scratch& s, float* C, int64_t ldc) {
    const int64_t Kp = K + (K & 1);
    for (int64_t mb = 0; mb < M; mb += kMC) {
      const int64_t me = std::min(M, mb + kMC);
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t len = std::min(kKC, K - k0), lp = len + (len & 1);
        const float* wp[kItemGroups];
        for (int i = 0; i < ns; ++i) {
          float* w = s.w[i];
          bool swapped = false;
          if constexpr (requires { Isa::unpack_swapped; }) {
            if (src[i].seg->packed) Isa::unpack_swapped(GGMLType::BF16, src[i].group(), k0, len, w), swapped = true;
          }
          if (!swapped) {
            const float* u = weights_at(src[i], k0, len, w, s.t);
            if (u != w) std::memcpy(w, u, sizeof(float) * size_t(len * kGroup));
            if (len & 1) std::memcpy(w + len * kGroup, w + (len - 1) * kGroup, sizeof(float) * kGroup);
            for (int64_t k = 0; k + 1 < len; k += 2)
              for (int r = 0; r < kGroup; ++r) std::swap(w[k * kGroup + r], w[(k + 1) * kGroup + r]);
          }
          if (len & 1) std::memset(w + (len - 1) * kGroup, 0, sizeof(float) * kGroup);  // (lp <= kKC: even)
          wp[i] = w;
        }
        const int64_t rows = me - mb, n_tiles = (rows + kMR - 1) / kMR;
        for (int64_t t = 0, m0 = mb; t < n_tiles; ++t) {
          const int mr = int(rows / n_tiles + (t < rows % n_tiles ? 1 : 0));
          const float* xr[kMR];
          for (int i = 0; i < mr; ++i) xr[i] = qa.xbs.data() + (r0 + m0 + i) * Kp + k0;
          if constexpr (requires { Isa::mk_rows_n; }) {
            Isa::mk_rows_n(mr, xr, wp, ns, lp, C + m0 * ldc, ldc, k0 == 0);
          } else {
            for (int i = 0; i < ns; ++i) Isa::mk_rows(mr, xr, wp[i], lp, C + m0 * ldc + i * kGroup, ldc, k0 == 0);
          }
          m0 += mr;
        }
      }
    }
  }

  // Which path a weight type takes.
  enum class Path { Float, Int, Bf16 };
  static Path path_of(GGMLType t) {
    return is_int_type(t) ? Path::Int : t == GGMLType::BF16 ? Path::Bf16 : Path::Float;
  }
  static bool any_bf16(const GemmSeg* segs, int n) {
    for (int i = 0; i < n; ++i)
      if (segs[i].type == GGMLType::BF16) return true;
    return false;
  }

  // Rows [r0, r0 + M) of X (and of qa) against the item's sources, into C (M, ldc).
  static void item(const float* X, const QAct& qa, int64_t r0, int64_t M, int64_t K, const Source* src,
                   int ns, Scratch& s, float* C, int64_t ldc) {
    X += r0 * K;
    const Path path = path_of(src[0].seg->type);
    bool same = true;
    for (int i = 1; i < ns; ++i) same = same && path_of(src[i].seg->type) == path;
    if (!same) {  // (SwiGLU's gate and up on different paths: one at a time)
      for (int i = 0; i < ns; ++i) item(X - r0 * K, qa, r0, M, K, src + i, 1, s, C + i * kGroup, ldc);
      return;
    }
    if (path == Path::Int) return int_item(qa, r0, M, K, src, ns, s, C, ldc);
    if (path == Path::Bf16) return bf16_item(qa, r0, M, K, src, ns, s, C, ldc);
    float_item(X, M, K, src, ns, s, C, ldc);
  }

  // Activation rows per register tile (x kGroup weight rows; mk_rows takes up to kMR).
  static constexpr int kMR = [] {
    if constexpr (requires { Isa::kMR; }) return Isa::kMR;
    else return 6;
  }();
  // The integer tile: 2 int32 accumulators per row plus the broadcasts GCC hoists must fit in
  // the 16 vector registers (6 rows spill).
  static constexpr int kMRInt = [] {
    if constexpr (requires { Isa::kMRInt; }) return Isa::kMRInt;
    else return 4;
  }();
  static_assert(kMRInt <= kMaxIntRows);
  static constexpr int64_t kMC = 120;  // activation rows per L2 block
  // (int16 activations take half the bytes of f32 ones: twice the rows per block, half the unpacks)
  static constexpr int64_t kMCInt = 240;

  // LoRA's expand in a GEMM's epilogue (LoraDelta): C (M, ldc)[:, 0:ng*kGroup], the item's
  // product for output rows [n0, n0 + ng*kGroup) (ng <= kItemGroups consecutive groups of one
  // weight), += ya @ B_group^T for each run's rows: one fma chain over the rank from 0 per
  // output (mk_rows), then one add, so a row's result does not depend on the batch around it.
  // B's groups are read once per item whatever the run's rows.
  static constexpr int kLoraDirectRows = 4;
  // group_bytes of the last (type, K) asked for: a decode's expands and B prefetches ask per
  // item for the same few (group_bytes looks the type up out of line and divides; memoized,
  // the 110m decode step under one adapter measured ~1% faster, BM_DecodeLayersLora).
  struct GroupBytesMemo {
    GGMLType t = GGMLType::F32;
    int64_t K = -1;
    uint64_t gb = 0;
    uint64_t operator()(const WeightView& B) {
      if (B.n_cols != K || B.type != t) t = B.type, K = B.n_cols, gb = group_bytes(t, K);
      return gb;
    }
  };
  // Single-row expands waiting for one Isa::expand_runs call (or gemv_runs and an add): up to
  // kLoraDirectRows, each its own groups of B, its ya row and its C row; one B type, rank and
  // group count per call. The expands that gemm_run's spans (expand_span) do not take queue
  // across the items of a thread's run, so their chains go side by side whatever the adapters
  // per item. A row's delta is the same bits whichever expands share its call.
  struct ExpandQueue {
    GGMLType type = GGMLType::F32;
    int64_t R = 0;
    int ng = 0, n = 0;
    GroupBytesMemo bytes;
    const uint8_t* g[kLoraDirectRows * kItemGroups];
    const float* x[kLoraDirectRows];
    float* c[kLoraDirectRows];
    void push(const WeightView& B, int64_t n0, int ng_, const float* xr, float* cr) {
      if (n > 0 && (B.type != type || B.n_cols != R || ng_ != ng)) flush();
      type = B.type, R = B.n_cols, ng = ng_;
      const uint64_t gb = bytes(B);
      for (int i = 0; i < ng; ++i) g[n * ng + i] = static_cast<const uint8_t*>(B.data) + uint64_t(n0 / kGroup + i) * gb;
      x[n] = xr;
      c[n++] = cr;
      if (n == kLoraDirectRows) flush();
    }
    void flush() {
      if (n == 0) return;
      if constexpr (requires { Isa::expand_runs; }) {
        Isa::expand_runs(type, g, ng, n, R, x, c);
      } else if constexpr (requires { Isa::gemv_runs; }) {
        alignas(64) float dl[kLoraDirectRows * kItemGroups * kGroup];
        Isa::gemv_runs(type, g, ng, n, R, x, dl);
        const int w = ng * kGroup;
        for (int q = 0; q < n; ++q)
          for (int j = 0; j < w; ++j) c[q][j] += dl[q * w + j];
      }
      n = 0;
    }
  };

  // (C holds the batch rows [r0, r0 + M): a row block of a large GEMM. Single-row runs go to
  // q, which the caller flushes.)
  static void add_lora(const LoraDelta& d, int64_t n0, int ng, int64_t r0, int64_t M, float* C, int64_t ldc,
                       Scratch& s, ExpandQueue& q) {
    for (int32_t r = 0; r < d.n; ++r) {
      const LoraRun& run = d.runs[r];
      const int64_t R = run.B.n_cols, lo = std::max<int64_t>(run.m0, r0), hi = std::min(r0 + M, run.m0 + run.n);
      if (hi <= lo) continue;
      if constexpr (requires { Isa::gemv_runs; }) {
        if (run.B.layout == WeightLayout::Packed && hi - lo == 1) {
          q.push(run.B, n0, ng, run.ya + (lo - run.m0) * run.ldya, C + (lo - r0) * ldc);
          continue;
        }
      }
      if constexpr (requires { Isa::gemv_rows; }) {
        // A few rows (decode): B's groups converted in registers, no unpacked copy (the per-group
        // unpack and mk_rows' setup cost more than the rank's FMAs), the groups side by side
        // (independent chains). The same chains as unpack + mk_rows, so a row's delta is the
        // same bits on either path.
        if (run.B.layout == WeightLayout::Packed && hi - lo <= kLoraDirectRows) {
          alignas(64) float dl[kLoraDirectRows * kItemGroups * kGroup];
          const uint64_t gb = group_bytes(run.B.type, R);
          const uint8_t* g[kItemGroups];
          for (int i = 0; i < ng; ++i) g[i] = static_cast<const uint8_t*>(run.B.data) + uint64_t(n0 / kGroup + i) * gb;
          Isa::gemv_rows(run.B.type, g, ng, R, run.ya + (lo - run.m0) * run.ldya, run.ldya, int(hi - lo), dl);
          const int w = ng * kGroup;
          for (int64_t m = lo; m < hi; ++m)
            for (int j = 0; j < w; ++j) C[(m - r0) * ldc + j] += dl[(m - lo) * w + j];
          continue;
        }
      }
      for (int i = 0; i < ng; ++i) add_lora_unpacked(run, n0 + i * kGroup, lo, hi, C + i * kGroup, r0, ldc, s);
    }
  }
  // One run over one group through B's group unpacked to f32 (any rows; GGUF rows too).
  static void add_lora_unpacked(const LoraRun& run, int64_t n0, int64_t lo, int64_t hi, float* C, int64_t r0,
                                int64_t ldc, Scratch& s) {
    const int64_t R = run.B.n_cols;
    // w (R, kGroup): B's rows [n0, n0 + kGroup) side by side (rank <= kKC: the backend checked).
    const float* w = s.t;
    if (run.B.layout == WeightLayout::Packed) {
      const uint8_t* g = static_cast<const uint8_t*>(run.B.data) + uint64_t(n0 / kGroup) * group_bytes(run.B.type, R);
      if (run.B.type == GGMLType::F32) w = reinterpret_cast<const float*>(g);
      else Isa::unpack(run.B.type, g, 0, R, s.t);
    } else {  // (GGUF rows: not prepared)
      const uint64_t rb = *row_bytes(run.B.type, uint64_t(R));
      for (int j = 0; j < kGroup; ++j) {
        float* row = s.w[1];
        if (n0 + j < run.B.n_rows) Isa::dequant(run.B.type, static_cast<const uint8_t*>(run.B.data) + uint64_t(n0 + j) * rb, R, row);
        for (int64_t k = 0; k < R; ++k) s.t[k * kGroup + j] = n0 + j < run.B.n_rows ? row[k] : 0.0f;
      }
    }
    alignas(64) float dl[kMR * kGroup];
    for (int64_t m = lo; m < hi;) {
      const int mr = int(std::min<int64_t>(kMR, hi - m));
      const float* xr[kMR];
      for (int q = 0; q < mr; ++q) xr[q] = run.ya + (m + q - run.m0) * run.ldya;
      Isa::mk_rows(mr, xr, w, R, dl, kGroup, true);
      for (int q = 0; q < mr; ++q)
        for (int j = 0; j < kGroup; ++j) C[(m + q - r0) * ldc + j] += dl[q * kGroup + j];
      m += mr;
    }
  }

  // Backend::matmul_runs. Work items: (target, block of kMC rows, gpi groups of A's rows), so
  // one parallel pass covers every adapter's shrink; each item is a float_item over the
  // target's rows (the same numerics as gemm: one fma chain over K per output, whatever gpi),
  // or for a quantized A (a Q8_0 adapter) an int_item over those rows of qa, then scaled. gpi =
  // kItemGroups (the X rows loaded once serve both) unless that leaves fewer than two items per
  // thread (decode: one adapter's O or down shrink is one group, its gate/up
  // two, one item), then one group per item so no thread idles while another does two.
  struct RunsPlan {
    const float* X;
    const QAct& qa;
    int64_t K;
    const RunTarget* t;
    const GemmSeg* segs;
    int n, threads, gpi;
    int64_t n_items = 0;
    RunsPlan(const float* X_, const QAct& qa_, int64_t K_, const RunTarget* t_, const GemmSeg* s_, int n_,
             int threads_)
        : X(X_), qa(qa_), K(K_), t(t_), segs(s_), n(n_), threads(threads_) {
      int64_t n_pairs = 0;
      for (int i = 0; i < n; ++i)
        n_pairs += (t[i].n + kMC - 1) / kMC * ((n_groups(segs[i].n_rows) + kItemGroups - 1) / kItemGroups);
      gpi = threads > 1 && n_pairs < 2 * int64_t(threads) ? 1 : kItemGroups;
      for (int i = 0; i < n; ++i) n_items += items(i);
    }
    int64_t units(int i) const { return (n_groups(segs[i].n_rows) + gpi - 1) / gpi; }
    int64_t items(int i) const { return (t[i].n + kMC - 1) / kMC * units(i); }
    // Item p's sources (target i, rows [mb, mb + rows)); returns their count.
    int sources(int64_t p, int& i, int64_t& mb, int64_t& rows, Source* src) const {
      i = 0;
      for (int64_t c; p >= (c = items(i)); ++i) p -= c;
      const int64_t gp = units(i);
      mb = p / gp * kMC;
      rows = std::min(kMC, t[i].n - mb);
      int ns = 0;
      for (int j = 0; j < gpi; ++j) {
        const int64_t n0 = (p % gp * gpi + j) * kGroup;
        if (n0 >= segs[i].n_rows) break;
        src[ns++] = {&segs[i], n0, int(std::min<int64_t>(kGroup, segs[i].n_rows - n0))};
      }
      return ns;
    }
    void run(int64_t p) const {
      int i;
      int64_t mb, rows;
      Source src[kItemGroups];
      const int ns = sources(p, i, mb, rows, src);
      // A's groups are streamed once (decode: a few KiB each, cold): the head of this item's
      // groups and of the item this thread likely takes next (p + threads) asked for now, so
      // the GEMV's own prefetch (kPrefetch ahead) does not start from a miss.
      if (segs[i].packed) {
        for (int q = 0; q < ns; ++q)
          Isa::prefetch_bytes(src[q].group(), std::min<int64_t>(int64_t(segs[i].row_bytes), kRunsPrefetch));
        if (p + threads < n_items) {
          int i2;
          int64_t mb2, rows2;
          Source nx[kItemGroups];
          const int ns2 = sources(p + threads, i2, mb2, rows2, nx);
          if (segs[i2].packed)
            for (int q = 0; q < ns2; ++q)
              Isa::prefetch_bytes(nx[q].group(), std::min<int64_t>(int64_t(segs[i2].row_bytes), kRunsPrefetch));
        }
      }
      const int64_t ldc = kItemGroups * kGroup;
      Scratch& s = scratch();
      if (s.c.size() < size_t(rows * ldc)) s.c.resize(size_t(rows * ldc));
      if (is_int_type(segs[i].type)) int_item(qa, t[i].m0 + mb, rows, K, src, ns, s, s.c.data(), ldc);
      else float_item(X + (t[i].m0 + mb) * K, rows, K, src, ns, s, s.c.data(), ldc);
      for (int64_t m = 0; m < rows; ++m)
        for (int q = 0; q < ns; ++q) {
          const float* c = s.c.data() + m * ldc + q * kGroup;
          float* y = t[i].Y + (mb + m) * t[i].ldy + src[q].n0;
          for (int j = 0; j < src[q].cnt; ++j) y[j] = t[i].scale * c[j];
        }
    }
  };
  // (quantized: qa holds X's rows the targets read, where an A is quantized; else they are
  // quantized into it first.)
  static void gemm_runs(const float* X, int64_t K, const RunTarget* t, const GemmSeg* segs, int n,
                        int threads, QAct& qa, bool quantized) {
    if (!quantized && any_int_run(segs, n)) {
      int64_t rows = 0;
      for (int i = 0; i < n; ++i) rows = std::max(rows, t[i].m0 + t[i].n);
      quantize(X, rows, K, qa, threads);
    }
    if constexpr (requires { Isa::gemv_runs; }) {
      DecodeShrink d;
      if (d.init({X, K, t, segs, n}, threads, qa)) {
        parallel_for(d.calls, threads, 1, [&](int64_t c) { d.run(c); });
        return;
      }
    }
    const RunsPlan plan(X, qa, K, t, segs, n, threads);
    parallel_for(plan.n_items, threads, 1, [&](int64_t p) { plan.run(p); });
  }
  static bool any_int_run(const GemmSeg* segs, int n) {
    for (int i = 0; i < n; ++i)
      if (is_int_type(segs[i].type)) return true;
    return false;
  }
  // Decode (every target one row; every A packed, of one type): for a float type the shrink's
  // (target, group) pairs in calls of up to kLoraDirectRows pairs to Isa::gemv_runs, their fma
  // chains side by side (the same chain per output as float_item's GEMV: the same bits). One
  // adapter's shrink (1-3 groups per input) is then one call; as RunsPlan's items, each group
  // was a lone latency-bound chain over K, two of QKV's three on one thread. More pairs
  // (adapters mixed): calls of equal size, a multiple of `threads`. A quantized type: one call
  // per target and two groups, the integer GEMV over the target's row of qa (int_item's fused
  // path, as RunsPlan's items: the same bits).
  struct DecodeShrink {
    ShrinkJob j{};
    const QAct* qa = nullptr;  // X quantized (gemm_runs, gemm: always there)
    bool quant = false;
    int64_t np = 0, calls = 0;
    static int64_t pairs_of(const GemmSeg& g, bool quant) {
      const int64_t G = n_groups(g.n_rows);
      return quant ? (G + kItemGroups - 1) / kItemGroups : G;
    }
    // False where this does not apply. (q: X quantized, read for a quantized A.)
    bool init(const ShrinkJob& job, int threads, const QAct& q) {
      j = job;
      qa = &q;
      np = 0;
      quant = j.n > 0 && is_int_type(j.segs[0].type);
      for (int i = 0; i < j.n; ++i) {
        if (j.t[i].n != 1 || !j.segs[i].packed || j.segs[i].type != j.segs[0].type) return false;
        np += pairs_of(j.segs[i], quant);
      }
      calls = quant ? np : (np + kLoraDirectRows - 1) / kLoraDirectRows;
      if (!quant && calls > 1 && threads > 1) calls = std::min(np, (calls + threads - 1) / threads * threads);
      return np > 0;
    }
    void run(int64_t c) const {
      if (quant) return run_int(c);
      const int64_t q0 = np * c / calls, q1 = np * (c + 1) / calls;
      const uint8_t* g[kLoraDirectRows];
      const float* x[kLoraDirectRows];
      int ti[kLoraDirectRows];
      int64_t n0[kLoraDirectRows];
      int i = 0;
      int64_t base = 0;  // pairs before target i
      for (int64_t q = q0; q < q1; ++q) {
        while (q - base >= n_groups(j.segs[i].n_rows)) base += n_groups(j.segs[i].n_rows), ++i;
        const int k = int(q - q0);
        ti[k] = i;
        n0[k] = (q - base) * kGroup;
        g[k] = j.segs[i].data + uint64_t(q - base) * j.segs[i].row_bytes;
        x[k] = j.X + j.t[i].m0 * j.K;
        Isa::prefetch_bytes(g[k], std::min<int64_t>(int64_t(j.segs[i].row_bytes), kRunsPrefetch));
      }
      alignas(64) float out[kLoraDirectRows * kGroup];
      if constexpr (requires { Isa::gemv_runs; }) Isa::gemv_runs(j.segs[0].type, g, 1, int(q1 - q0), j.K, x, out);
      for (int k = 0; k < int(q1 - q0); ++k) {
        const RunTarget& r = j.t[ti[k]];
        const int cnt = int(std::min<int64_t>(kGroup, j.segs[ti[k]].n_rows - n0[k]));
        for (int e = 0; e < cnt; ++e) r.Y[n0[k] + e] = r.scale * out[k * kGroup + e];
      }
    }
    // Call c of a quantized A: target i's groups [u kItemGroups, (u + 1) kItemGroups).
    void run_int(int64_t c) const {
      int i = 0;
      int64_t u = c;
      while (u >= pairs_of(j.segs[i], true)) u -= pairs_of(j.segs[i], true), ++i;
      const GemmSeg& g = j.segs[i];
      Source src[kItemGroups];
      int ns = 0;
      for (int k = 0; k < kItemGroups; ++k) {
        const int64_t n0 = (u * kItemGroups + k) * kGroup;
        if (n0 >= g.n_rows) break;
        src[ns] = {&g, n0, int(std::min<int64_t>(kGroup, g.n_rows - n0))};
        Isa::prefetch_bytes(src[ns++].group(), std::min<int64_t>(int64_t(g.row_bytes), kRunsPrefetch));
      }
      alignas(64) float out[kItemGroups * kGroup];
      const RunTarget& r = j.t[i];
      int_item(*qa, r.m0, 1, j.K, src, ns, scratch(), out, kItemGroups * kGroup);
      for (int k = 0; k < ns; ++k)
        for (int e = 0; e < src[k].cnt; ++e) r.Y[src[k].n0 + e] = r.scale * out[k * kGroup + e];
    }
  };
  static constexpr int64_t kRunsPrefetch = 2048;  // bytes of each A group's head (gemm_runs)
  // Weight bytes a deferred LoRA GEMV's run streams at least (gemm): measured on Zen 5 (Q4_0,
  // K = 2048, alternated, before split runs): 2 runs per thread against 8 made 1.2-2.4 MB
  // weights 14-21% faster and left 4-9 MB ones within noise.
  static constexpr uint64_t kRunBytes = 512 << 10;

  // The expand's B groups for an item's output rows [n0, n0 + ng*kGroup), every run's, asked
  // for before the item's base GEMV so that add_lora finds them in cache (a rank-16 group is
  // 512 bytes in F16: a few misses in a row, each a full memory latency, otherwise).
  static void prefetch_lora(const LoraDelta& d, int64_t n0, int ng, GroupBytesMemo& bytes) {
    for (int32_t r = 0; r < d.n; ++r) {
      const WeightView& B = d.runs[r].B;
      if (B.layout != WeightLayout::Packed) continue;
      const uint64_t gb = bytes(B);
      Isa::prefetch_bytes(static_cast<const uint8_t*>(B.data) + uint64_t(n0 / kGroup) * gb, int64_t(gb) * ng);
    }
  }

  // What a GEMM's work items share: the segments, how the items map onto them (first[i]: the
  // first item of segment i), and the epilogue.
  struct ItemSpec {
    const GemmSeg* segs;
    bool swiglu;
    GateAct act;
    int ns;
    const int64_t* first;
    Epilogue e;
    // A plain weight's item pairs group q with group q + ceil(G/2) (G groups) instead of q + 1:
    // a thread's run of items then streams two ascending ranges half the weight apart, as
    // SwiGLU's gate and up do, where one stream left the prefetchers short (decode, `--ab`:
    // TinyLlama Q4_0's Wo items 0.92x the time, the 32,000-row output's 0.88x, Q/K/V's 0.96x;
    // decode steps 0.946-0.985x over Q4_0, Q8_0, Q4_K_M and 110m Q8_0, 7 of 7). The same
    // sums per row, so the same bits. Set for the GEMVs of <= 16 rows that gemv_items does not
    // take (gemm); adapted weights keep consecutive pairs (LoRA's expands take an item's groups
    // side by side). (gemv_items' four groups need no spread: four streams; spread, 1.00-1.05x.)
    bool spread = false;
  };
  static void gemm(const float* X, int64_t M, int64_t K, const GemmSeg* segs, int n_segs,
                   Epilogue e, QAct& qa, int threads, const ShrinkJob* shrink) {
    // Work items: SwiGLU pairs gate group j with up group j; otherwise kItemGroups consecutive
    // groups of one segment (the X rows loaded once serve both).
    const bool swiglu = e == Epilogue::SwiGLU || e == Epilogue::GeGLU;  // (either gated form)
    const GateAct act = e == Epilogue::GeGLU ? GateAct::GeluTanh : GateAct::SiLU;
    const int ns = swiglu ? 1 : n_segs;
    int64_t n_items = 0;
    int64_t first[4] = {0, 0, 0, 0};
    for (int i = 0; i < ns; ++i) {
      first[i] = n_items;
      const int64_t G = n_groups(segs[i].n_rows);
      n_items += swiglu ? G : (G + kItemGroups - 1) / kItemGroups;
    }
    const int64_t ldc = kItemGroups * kGroup;
    // A shrink of quantized A's (Q8_0 adapters) reads X's rows quantized: this call's qa where
    // its X is this call's (LoRA: the projection's input), else its own pass first, before qa
    // becomes this call's.
    bool shrink_int = false;
    if (shrink && any_int_run(shrink->segs, shrink->n)) {
      bool shares = shrink->X == X && shrink->K == K;
      for (int i = 0; i < shrink->n; ++i) shares = shares && shrink->t[i].m0 + shrink->t[i].n <= M;
      if (!shares) {
        gemm_runs(shrink->X, shrink->K, shrink->t, shrink->segs, shrink->n, threads, qa, false);
        shrink = nullptr;
      }
      shrink_int = shrink != nullptr;
    }
    if (shrink_int || any_int_run(segs, n_segs)) quantize(X, M, K, qa, threads);
    const bool bf16 = any_bf16(segs, n_segs);  // (each thread in FlushDenormals(bf16) below)
    if (bf16) round_bf16(X, M, K, qa, threads);
    // Small M (decode, speculative verification, small chunks) streams weights from memory:
    // each thread takes its own contiguous share of the items as one ascending stream (what
    // the prefetchers follow; a run's start pays a memory latency and the prefetchers' ramp),
    // and the threads that finish first take what is left from the others' backs in runs that
    // shrink to one item, so that the threads end together (SplitRuns).
    // Large M: one item at a time, the rows in blocks (row_blocks), each block's items before the next block's, so
    // the threads work through one block at a time and its activations stay in their caches.
    const int64_t n_blocks = row_blocks(M, K);
    const ItemSpec is{segs, swiglu, act, ns, first, e};
    bool lora = false;
    for (int i = 0; i < n_segs; ++i) lora = lora || segs[i].lora.n > 0;
    const bool deferred = lora && M <= kLoraDeferRows && n_blocks == 1;
    // A deferred run's items are revisited after it (expands, stores; their B groups prefetched
    // before its base products): runs of ~kRunBytes of base weights each, 2-8 a thread. One
    // row revisits only the pairs done before the shrink was (gemm_run): uncapped split runs,
    // on pairs (granule 2, as the base's GEMVs), so that no run ends on a lone item.
    const int64_t lora_granule = M == 1 ? 2 : 1;
    int64_t lora_run = n_items;
    if (deferred && M > 1) {
      uint64_t bytes = 0;
      for (int i = 0; i < n_segs; ++i)
        bytes += segs[i].packed ? uint64_t(n_groups(segs[i].n_rows)) * segs[i].row_bytes
                                : uint64_t(segs[i].n_rows) * segs[i].row_bytes;
      const int64_t nt = std::max(1, threads);
      const int64_t per_thread = std::clamp<int64_t>(int64_t(bytes / (uint64_t(nt) * kRunBytes)), 2, 8);
      lora_run = std::max<int64_t>(1, (n_items + nt * per_thread - 1) / (nt * per_thread));
    }
    if (shrink) {
      // A decode shrink runs in this pass: its calls first, each on whichever thread takes it,
      // while the other threads already stream their base products; a run's expands wait for
      // the last call (by then long done: a run streams >= kRunBytes). Saves the shrink's own
      // parallel region, whose one-call latency-bound chains left the other threads idle.
      DecodeShrink d;
      bool fused = false;
      if constexpr (requires { Isa::gemv_runs; }) fused = deferred && SplitRuns::fits(n_items) && d.init(*shrink, 1, qa);
      if (fused) {
        std::atomic<int64_t> next_call{0}, done{0};
        SplitRuns runs(n_items, threads, lora_granule, lora_run);
        parallel(threads, [&](int t, int) {
          for (int64_t c; (c = next_call.fetch_add(1, std::memory_order_relaxed)) < d.calls;) {
            struct Done {  // (counted even if the call throws: no thread waits forever)
              std::atomic<int64_t>& n;
              ~Done() { n.fetch_add(1, std::memory_order_release); }
            } counted{done};
            d.run(c);
          }
          auto ready = [&](bool wait) {
            while (done.load(std::memory_order_acquire) < d.calls)
              if (wait) spin_pause();
              else return false;
            return true;
          };
          const FlushDenormals flush(bf16);  // (the base's runs only: the shrink is gemm_runs' numerics)
          runs.take(t, [&](int64_t b, int64_t end) { gemm_run(X, M, K, is, qa, ldc, b, end, ready); });
        });
        return;
      }
      gemm_runs(shrink->X, shrink->K, shrink->t, shrink->segs, shrink->n, threads, qa, true);
    }
    if (deferred) {
      parallel_for_split_runs_in<FlushDenormals>(
          bf16, n_items, threads, lora_granule,
          [&](int64_t b, int64_t end) { gemm_run(X, M, K, is, qa, ldc, b, end, [](bool) { return true; }); },
          lora_run);
      return;
    }
    if constexpr (requires { Isa::kGemvFloatGroups; }) {
      bool float_packed = false;
      for (int i = 0; i < n_segs; ++i) float_packed = float_packed || (segs[i].packed && !is_int_type(segs[i].type));
      bool int_packed = kGemvIntPairs;
      for (int i = 0; i < n_segs; ++i) int_packed = int_packed && segs[i].packed && is_int_type(segs[i].type);
      if (M == 1 && !lora && (float_packed || int_packed)) {  // (runs of an even number of items, so that every item pairs)
        parallel_for_split_runs_in<FlushDenormals>(bf16, n_items, threads, 2, [&](int64_t b, int64_t end) {
          for (int64_t p = b; p < end;) p += gemv_items(X, K, is, qa, ldc, p, end);
        });
        return;
      }
    }
    if (M <= 16 && n_blocks == 1) {
      // (Guided runs capped at kRunBytes -> uncapped guided runs: 0.987x the decode step time;
      // -> split runs: see SplitRuns.)
      ItemSpec spread = is;
      spread.spread = true;
      parallel_for_split_runs_in<FlushDenormals>(bf16, n_items, threads, 1, [&](int64_t b, int64_t end) {
        for (int64_t p = b; p < end; ++p) gemm_item(X, 0, M, K, spread, qa, ldc, p);
      });
      return;
    }
    parallel_for_in<FlushDenormals>(bf16, n_items * n_blocks, threads, 1, [&](int64_t pb) {
      const int64_t blk = pb / n_items, p = pb % n_items;
      const int64_t r0 = M * blk / n_blocks, rows = M * (blk + 1) / n_blocks - r0;
      gemm_item(X, r0, rows, K, is, qa, ldc, p);
    });
  }

  // Rows up to which a GEMM with LoRA deltas takes a thread's run of items in three passes
  // (gemm_run): every item's base product, then every item's expand, then every item's store.
  // Decode streams the base weights; an expand after each item (a short latency-bound chain
  // on B's groups) stalled that stream at every item, where after the run the expands of all
  // its items overlap each other from cache (by spans of items, expand_span; the rest through
  // one ExpandQueue per run). The same operations per item, so the same bits. One row (pairs
  // of items, pair_pass) is the exception: see gemm_run.
  static constexpr int64_t kLoraDeferRows = 16;
  // ready(true) returns once the shrink the expands read is complete; ready(false) says
  // whether it is. At one row, once it is, each pair's expands and stores follow its products
  // (B prefetched before them), and only the pairs done before it wait for the end of the
  // run: the third pass over a run's items cost ~1.3% of the 110m decode step, the three
  // passes together 11.2-11.7% of it against 11.8-12.7% (one F16 adapter, `bench lora`
  // medians, 2 threads, Zen 5).
  template <class Ready>
  static void gemm_run(const float* X, int64_t M, int64_t K, const ItemSpec& is, const QAct& qa, int64_t ldc,
                       int64_t b, int64_t end, Ready&& ready) {
    Scratch& s = scratch();
    const size_t per = size_t(M * ldc);
    if (s.run_c.size() < per * size_t(end - b)) s.run_c.resize(per * size_t(end - b));
    Source src[2 * kItemGroups];
    ExpandQueue q;
    auto finish = [&](int64_t f, int64_t e) {  // items [f, e): expands, then stores
      for (int64_t p = f; p < e;) p = expand_span(is, p, e, M, ldc, s.run_c.data() + size_t(p - b) * per, per, s, q);
      q.flush();
      Source fs[kItemGroups];
      for (int64_t p = f; p < e; ++p) store_item(is, fs, item_sources(is, p, fs), 0, M, s.run_c.data() + size_t(p - b) * per, ldc);
    };
    int64_t pending = b;  // items [pending, p) wait for their expands and stores
    for (int64_t p = b; p < end;) {
      float* c = s.run_c.data() + size_t(p - b) * per;
      if constexpr (requires { Isa::kGemvFloatGroups; }) {
        if (M == 1 && pair_sources(is, p, end, src)) {  // (one row: items p and p + 1's C side by side)
          prefetch_lora(src, kItemGroups, q.bytes);
          prefetch_lora(src + kItemGroups, kItemGroups, q.bytes);
          pair_pass(X, K, src, qa, c);
          p += 2;
          if (ready(false)) {
            if (pending + 2 != p || !pair_finish(is, src, c, ldc, q)) finish(pending, p);
            pending = p;
          }
          continue;
        }
      }
      const int nsrc = item_sources(is, p, src);
      prefetch_lora(src, nsrc, q.bytes);
      item(X, qa, 0, M, K, src, nsrc, s, c, ldc);
      ++p;
    }
    ready(true);
    finish(pending, end);
  }

  // One row, the pair of items just computed (pair_sources' src, pair_pass' c) when nothing
  // before it waits (gemm_run): each group's one-row run expanded through q (the four chains
  // side by side in one call), then both items stored. finish's bits (the same chain per
  // output, then one add) at a fraction of its bookkeeping per pair (expand_span's spans are
  // one pair long here): one F16 adapter's decode 0.864-0.904 of the base against 0.856-0.903,
  // 6 of 6 alternated rounds (`bench lora` medians, Zen 5; Q8_0 A's: within noise). Not
  // add_lora per item (the same pushes, two groups each): 0.873-0.875 against 0.880-0.911, 5 of
  // 5 rounds. False, nothing done, where a group's delta is not one packed run.
  static bool pair_finish(const ItemSpec& is, const Source* src, float* c, int64_t ldc, ExpandQueue& q) {
    if constexpr (!requires { Isa::gemv_runs; }) return false;  // (q expands through it: add_lora's rule)
    for (int i = 0; i < 2 * kItemGroups; ++i) {
      const LoraDelta& d = src[i].seg->lora;
      if (d.n > 1 || (d.n == 1 && d.runs[0].B.layout != WeightLayout::Packed)) return false;
    }
    for (int i = 0; i < 2 * kItemGroups; ++i) {
      const LoraDelta& d = src[i].seg->lora;
      if (d.n == 0 || d.runs[0].m0 > 0 || d.runs[0].m0 + d.runs[0].n <= 0) continue;  // (row 0 not in it)
      q.push(d.runs[0].B, src[i].n0, 1, d.runs[0].ya - d.runs[0].m0 * d.runs[0].ldya, c + i * kGroup);
    }
    q.flush();
    store_item(is, src, kItemGroups, 0, 1, c, ldc);
    store_item(is, src + kItemGroups, kItemGroups, 0, 1, c + kItemGroups * kGroup, ldc);
    return true;
  }

  // gemm_run's expands from item p (C at c, items per floats apart): with Isa::expand_items,
  // the items from p on whose sources are the same segments, each run of their deltas one row
  // of B's packed groups, in one call per source and run (one row's expands over consecutive
  // groups of one B: on AVX-512 one broadcast of ya per k for 4 items' chains; the per-item
  // bookkeeping once per span; the same chain per output as add_lora's, so the same bits);
  // otherwise item p's add_lora. Returns the first item not done.
  static int64_t expand_span(const ItemSpec& is, int64_t p, int64_t end, int64_t M, int64_t ldc, float* c,
                             size_t per, Scratch& s, ExpandQueue& q) {
    Source src[kItemGroups];
    const int nsrc = item_sources(is, p, src);
    if constexpr (requires { Isa::expand_items; }) {
      // Units: (source, groups, column): SwiGLU's gate and up one group each; else one unit
      // of the item's nsrc consecutive groups of one segment.
      const int units = is.swiglu ? nsrc : 1, ng = is.swiglu ? 1 : nsrc;
      bool direct = true;
      for (int u = 0; u < units && direct; ++u) {
        const LoraDelta& d = src[u].seg->lora;
        for (int32_t r = 0; r < d.n && direct; ++r) {
          const LoraRun& run = d.runs[r];
          const int64_t lo = std::max<int64_t>(run.m0, 0), hi = std::min(M, run.m0 + run.n);
          direct = hi <= lo || (hi - lo == 1 && run.B.layout == WeightLayout::Packed);
        }
      }
      if (direct) {
        int64_t e = p + 1;
        for (Source nx[kItemGroups]; e < end; ++e) {
          const int n2 = item_sources(is, e, nx);
          bool same = n2 == nsrc;
          for (int i = 0; i < n2 && same; ++i) same = nx[i].seg == src[i].seg;
          if (!same) break;
        }
        for (int u = 0; u < units; ++u) {
          const LoraDelta& d = src[u].seg->lora;
          for (int32_t r = 0; r < d.n; ++r) {
            const LoraRun& run = d.runs[r];
            const int64_t lo = std::max<int64_t>(run.m0, 0);
            if (std::min(M, run.m0 + run.n) <= lo) continue;
            const uint64_t gb = q.bytes(run.B);
            Isa::expand_items(run.B.type, static_cast<const uint8_t*>(run.B.data) + uint64_t(src[u].n0 / kGroup) * gb, gb,
                              ng, e - p, run.B.n_cols, run.ya + (lo - run.m0) * run.ldya, c + lo * ldc + u * kGroup,
                              int64_t(per));
          }
        }
        return e;
      }
    }
    add_lora(src, nsrc, 0, M, c, ldc, s, q);
    return p + 1;
  }

  // Activation rows per block of a large GEMM. Each work item (32 output rows) reads every row
  // of X (or its quantized form) over all of K: with M = 2048 rows of K = 2048 that is 4 MiB of
  // int8 activations per item, for each of the N / 32 items, where a chunk of 128-256 rows stays
  // in a core's L2. Blocks of ~kRowBlockBytes of int8 activations, at least kMinRowBlock rows
  // (the weights are read once per block: smaller blocks re-read them more often than the
  // activations save; measured on Zen 5 under memory pressure from another core, 128-row blocks
  // made the 768x2048 GEMM at M = 2048 ~20% slower, 256-row ones ~10% faster). Each row's
  // result is the same bits whatever block it is in (the contract: tested).
  static constexpr int64_t kRowBlockBytes = 512 << 10;
  static constexpr int64_t kMinRowBlock = 256;
  static int64_t row_blocks(int64_t M, int64_t K) {
    static const int64_t forced = [] {  // FT_GEMM_ROW_BLOCK=N: rows per block (0: one block), to measure
      const char* e = std::getenv("FT_GEMM_ROW_BLOCK");
      return e ? int64_t(std::atoll(e)) : int64_t(-1);
    }();
    int64_t rows = std::max<int64_t>(kMinRowBlock, kRowBlockBytes / std::max<int64_t>(1, K));
    if (forced == 0) return 1;
    if (forced > 0) rows = forced;
    return std::max<int64_t>(1, (M + rows / 2) / rows);  // (blocks of rows / 2 .. 1.5 rows)
  }

  // Work item p's groups: SwiGLU's gate group j with up group j, else up to kItemGroups
  // consecutive groups of one segment. Returns their count.
  static int item_sources(const ItemSpec& is, int64_t p, Source* src) {
    if (is.swiglu) {
      const int64_t n0 = (p - is.first[0]) * kGroup;
      const int cnt = int(std::min<int64_t>(kGroup, is.segs[0].n_rows - n0));
      src[0] = {&is.segs[0], n0, cnt};
      src[1] = {&is.segs[1], n0, cnt};
      return 2;
    }
    int si = 0;
    while (si + 1 < is.ns && p >= is.first[si + 1]) ++si;
    const GemmSeg& g = is.segs[si];
    int nsrc = 0;
    if (is.spread && g.lora.n == 0) {
      const int64_t G = n_groups(g.n_rows), half = (G + kItemGroups - 1) / kItemGroups;
      for (int64_t j = 0, gi = p - is.first[si]; j < kItemGroups && gi < G; ++j, gi += half)
        src[nsrc++] = {&g, gi * kGroup, int(std::min<int64_t>(kGroup, g.n_rows - gi * kGroup))};
      return nsrc;
    }
    for (int j = 0; j < kItemGroups; ++j) {
      const int64_t n0 = ((p - is.first[si]) * kItemGroups + j) * kGroup;
      if (n0 >= g.n_rows) break;
      src[nsrc++] = {&g, n0, int(std::min<int64_t>(kGroup, g.n_rows - n0))};
    }
    return nsrc;
  }
  static void prefetch_lora(const Source* src, int nsrc, GroupBytesMemo& bytes) {
    if (nsrc == 2 && src[0].seg == src[1].seg) {
      if (src[0].seg->lora.n > 0) prefetch_lora(src[0].seg->lora, src[0].n0, 2, bytes);
    } else {
      for (int i = 0; i < nsrc; ++i)
        if (src[i].seg->lora.n > 0) prefetch_lora(src[i].seg->lora, src[i].n0, 1, bytes);
    }
  }
  // The item's LoRA deltas into C (M, ldc), its product over the batch rows [r0, r0 + M).
  static void add_lora(const Source* src, int nsrc, int64_t r0, int64_t M, float* C, int64_t ldc, Scratch& s,
                       ExpandQueue& q) {
    if (nsrc == 2 && src[0].seg == src[1].seg) {  // (two groups of one weight: expanded side by side)
      if (src[0].seg->lora.n > 0) add_lora(src[0].seg->lora, src[0].n0, 2, r0, M, C, ldc, s, q);
    } else {
      for (int i = 0; i < nsrc; ++i)
        if (src[i].seg->lora.n > 0) add_lora(src[i].seg->lora, src[i].n0, 1, r0, M, C + i * kGroup, ldc, s, q);
    }
  }
  // The epilogue: the item's product C (M, ldc) over the batch rows [r0, r0 + M) into its
  // outputs (SwiGLU, residual add, bias, RoPE).
  static void store_item(const ItemSpec& is, const Source* src, int nsrc, int64_t r0, int64_t M, const float* C,
                         int64_t ldc) {
    for (int64_t m = 0; m < M; ++m) {
      const float* c = C + m * ldc;
      if (is.swiglu) {
        float* y = is.segs[0].Y + (r0 + m) * is.segs[0].ldy + src[0].n0;
        if constexpr (requires { Isa::silu_mul; }) {
          if (is.act == GateAct::SiLU) {
            Isa::silu_mul(c, c + kGroup, y, src[0].cnt);
            continue;
          }
        }
        for (int j = 0; j < src[0].cnt; ++j) y[j] = rowwise::gate_act(is.act, c[j]) * c[kGroup + j];
        continue;
      }
      for (int i = 0; i < nsrc; ++i) {
        const GemmSeg& g = *src[i].seg;
        const float* ci = c + i * kGroup;
        float* y = g.Y + (r0 + m) * g.ldy + src[i].n0;
        const int cnt = src[i].cnt;
        if (is.e == Epilogue::Add) {
          for (int j = 0; j < cnt; ++j) y[j] += ci[j];
        } else if (g.bias) {
          for (int j = 0; j < cnt; ++j) y[j] = ci[j] + g.bias[src[i].n0 + j];
        } else {
          for (int j = 0; j < cnt; ++j) y[j] = ci[j];
        }
        if (is.e == Epilogue::Store && g.rope_cs)
          rowwise::rope_rotate(g.Y + (r0 + m) * g.ldy, src[i].n0, cnt, g.rope_head_dim, g.rope_n_rot,
                               g.rope_cs + (r0 + m) * g.rope_n_rot);
      }
    }
  }
  // Isa::gemv_int_n takes two items' groups at one row (Isa::kGemvIntGroups).
  static constexpr bool kGemvIntPairs = [] {
    if constexpr (requires { Isa::kGemvIntGroups; }) return Isa::kGemvIntGroups == 2 * kItemGroups;
    else return false;
  }();
  // Decode (M = 1): items p and p + 1 (< end) as one pass's groups (pair_pass) where both are
  // two packed groups of one type, float (Isa::kGemvFloatGroups: their four fma chains side by
  // side, each output's chain unchanged, so the same bits; BF16 through bf16_item's kernel,
  // mk_bf16) or integer (kGemvIntPairs: int_item's fused GEMV over four groups, each output's
  // sums unchanged). False: item p alone.
  static bool pair_sources(const ItemSpec& is, int64_t p, int64_t end, Source* src) {
    static_assert(Isa::kGemvFloatGroups == 2 * kItemGroups);
    bool pair = p + 1 < end && item_sources(is, p, src) == kItemGroups &&
                item_sources(is, p + 1, src + kItemGroups) == kItemGroups;
    for (int i = 0; pair && i < 2 * kItemGroups; ++i)
      pair = src[i].seg->packed && src[i].seg->type == src[0].seg->type &&
             (kGemvIntPairs || path_of(src[i].seg->type) != Path::Int);
    return pair;
  }
  // C (1, 2 kItemGroups kGroup) = X's row times pair_sources' groups: item p's C, then p + 1's.
  static void pair_pass(const float* X, int64_t K, const Source* src, const QAct& qa, float* c) {
    constexpr int n = 2 * kItemGroups;
    const uint8_t* groups[n];
    for (int i = 0; i < n; ++i) groups[i] = src[i].group();
    if (path_of(src[0].seg->type) == Path::Int) {
      if constexpr (kGemvIntPairs) Isa::gemv_int_n(src[0].seg->type, groups, n, K, qa, 0, 1, c, n * kGroup);
    } else if (path_of(src[0].seg->type) == Path::Bf16) {
      const float* xf = qa.xbf.data();
      const uint32_t* xp = qa.xbp.data();
      Isa::mk_bf16(1, &xf, &xp, groups, n, K, c, n * kGroup, true);
    } else {
      Isa::gemv(src[0].seg->type, groups, n, K, X, 1, c, n * kGroup);
    }
  }
  // Decode without LoRA: items p and p + 1 in one pass where they pair, else item p. Returns
  // the items done.
  static int64_t gemv_items(const float* X, int64_t K, const ItemSpec& is, const QAct& qa, int64_t ldc, int64_t p,
                            int64_t end) {
    Source src[2 * kItemGroups];
    if (!pair_sources(is, p, end, src)) {
      gemm_item(X, 0, 1, K, is, qa, ldc, p);
      return 1;
    }
    alignas(64) float c[2 * kItemGroups * kGroup];
    pair_pass(X, K, src, qa, c);
    store_item(is, src, kItemGroups, 0, 1, c, ldc);
    store_item(is, src + kItemGroups, kItemGroups, 0, 1, c + kItemGroups * kGroup, ldc);
    return 2;
  }
  // Work item p over the batch rows [r0, r0 + M) (a row block of a large GEMM, or all of them).
  static void gemm_item(const float* X, int64_t r0, int64_t M, int64_t K, const ItemSpec& is, const QAct& qa,
                        int64_t ldc, int64_t p) {
    Scratch& s = scratch();
    if (s.c.size() < size_t(M * ldc)) s.c.resize(size_t(M * ldc));  // only if reserve() was short
    Source src[kItemGroups];
    const int nsrc = item_sources(is, p, src);
    ExpandQueue q;
    prefetch_lora(src, nsrc, q.bytes);
    item(X, qa, r0, M, K, src, nsrc, s, s.c.data(), ldc);
    add_lora(src, nsrc, r0, M, s.c.data(), ldc, s, q);
    q.flush();
    store_item(is, src, nsrc, r0, M, s.c.data(), ldc);
  }
};

template <class Isa>
const IsaKernels& make_table(const char* name) {
  static const IsaKernels k{name, &Isa::pack_rows, &Drivers<Isa>::gemm,
                            &Drivers<Isa>::reserve, &Drivers<Isa>::gemm_runs};
  return k;
}

}  // namespace ft::cpu
