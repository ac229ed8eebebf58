// AVX-512 + AMX-INT8 instantiation of the fast-kernel drivers (Sapphire Rapids and later): the
// avx512 kernels, with the quantized GEMM's 16-row tiles on the tile unit. Compiled for those
// extensions whatever the build flags; only called after cpu_supports(Amx), which has asked Linux
// for the tile state (arch_prctl ARCH_REQ_XCOMP_PERM).
//
// One tdpbssd multiplies a 16-row tile of int8 activations (A: 16 rows x 32 k, the quantized rows
// as they are, K bytes apart) by one 32-block of a group's unpacked quads (B: 8 quads x 16 weight
// rows x 4 k: packed.h's quad layout as unpack_int gives it, here as signed v = u - bias): C (16 x
// 16 int32) holds each (row, weight row)'s exact sum I of v xq over the block, the integer every
// other path forms. The block's epilogue is the avx512 GEMM's (mk_q_t) without its bias term:
// y = fma(float(I), s1 * dx, y) [y = fma(float(sum xq), s2 * dx, y)], so every output has the
// bits of every other path (tested against the scalar ISA like the rest). C goes through memory
// (a tile store, then vector loads): per 32-block and 16 x 16 outputs, one tile product against
// 16 rows of convert, multiply and fma, which bound the kernel (README: "AMX tiles").
// Standard headers come first so their inline functions are not compiled for AVX-512 here.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/cpu/rowwise.h"
#include "kernels/cpu/cpu_kernels.h"  // (before the target pragma, as below: its inline functions stay baseline)
#include "kernels/cpu/thread_pool.h"  // (before the target pragma: its std headers stay baseline)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,amx-tile,amx-int8")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports falsely (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"
#include "kernels/cpu/isa_avx512.h"
#include "kernels/cpu/isa_avx512_bf16.h"

namespace ft::cpu {
namespace {

struct AmxIsa : Avx512Bf16Isa {  // (BF16 weights on vdpbf16ps: every AMX CPU has AVX512_BF16)
  static constexpr int kTileRows = 16;

  // The rows from which gemv_int_n (the driver's fused path, M <= 32 for the quad types) runs
  // on the tiles (direct_tiles). Measured on the 1.1B files (`run -b`, alternated pairs):
  // Q8_0 from its packed bytes at 32 rows 1.065x the vector GEMV's prefill rate; at 16 and 24
  // rows 0.9-0.97x (its weights, 34 bytes per 32, stream from memory at every step, and the
  // vector GEMV streams them better); unpacked as the nibble types are, 0.9-1.0x at 32 rows.
  // Q4_0 and Q4_K (unpacked to signed quads a chunk ahead): Q4_0 1.12x at 16 rows and 1.16x at
  // 32, Q4_K 1.0x at 16 and 1.12x at 32 (3 rounds; README "Small chunks, third pass").
  // Tried and not kept: the row blocks' tiles (mk_int_tiles, unpacked per call) at 16-32 rows,
  // Q4_0 0.88x at 24 rows; the tiles from 8 rows (the last tile's rows padded) 0.85x at 8 rows;
  // Q8_0 from 16 rows with its last tile on tiles 6 and 7: 0.97x at 16 and 24 rows, 1.04x at 28.
  static int64_t direct_min_rows(GGMLType t) {
    return t == GGMLType::Q8_0 ? 32 : t == GGMLType::Q4_0 || t == GGMLType::Q4_K ? 16 : kNever;
  }
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  // The fused path (gemv_int_n) takes every M from direct_min_rows(t) on, where the GEMM path's
  // row blocks (mk_int_tiles, unpacked per call with the bias in the epilogue) were slower at
  // every size measured (`run -b` on the 1.1B files, 2 alternated rounds): Q4_0 1.2-1.3x at 40
  // rows, 1.1x at 64 and 96, 1.0-1.2x at 128, 1.05-1.16x at 480; Q4_K 1.15x at 40, 1.1x at
  // 64-128, 1.04x at 480; Q8_0 (unpacked) 1.15-1.2x at 40-64, 1.1x at 96-128, 0.97-1.02x at 480.
  static bool fused_int(GGMLType t, int64_t M) { return Avx512Isa::fused_int(t, M) || M >= direct_min_rows(t); }
  // Q8_0 runs from its packed bytes (tdpbsud, bias in the epilogue) up to this many rows, unpacked
  // to signed quads as the nibble types beyond: at 40-128 rows unpacked 1.0-1.2x (2 rounds).
  static constexpr int64_t kQ8RawMaxRows = 32;
  // How far past the block being read direct_tiles asks for a group's weights: Q8_0 8 blocks
  // ahead of its products (4.3 KB; at 16 and 32 rows 1.04-1.14x faster than 4, 16 or 24); the
  // nibble types 4 past the block being unpacked, itself a chunk ahead (8 and 16 were 4-12% slower).
  template <bool kRaw>
  static constexpr int64_t kPrefetchBlocks = kRaw ? 0 : 4;

  // Tiles 0 and 3: A (16 rows x 32 bytes); 1 and 4: B (8 quads x 64 bytes); 2 and 5: C (16 x 16
  // int32). Consecutive blocks alternate between the two sets, so the tile unit overlaps them.
  // Loaded once per thread (nothing else in this process configures tiles but bench peak's
  // probe, which puts this one back).
  // Tiles 6 and 7: A and C of a last tile of tail_rows (< 16) rows (direct_tiles; 0: any).
  static void configure_tiles(int tail_rows = 0) {
    thread_local int configured_tail = 0;  // (0: not configured yet)
    if (configured_tail && (tail_rows == 0 || tail_rows == configured_tail)) return;
    const int tail = tail_rows ? tail_rows : kTileRows;
    TileConfig c;
    for (int t : {0, 3}) c.rows[t] = kTileRows, c.colsb[t] = kQBlock;
    for (int t : {1, 4}) c.rows[t] = kQBlock / 4, c.colsb[t] = 4 * kGroup;
    for (int t : {2, 5}) c.rows[t] = kTileRows, c.colsb[t] = 4 * kGroup;
    c.rows[6] = uint8_t(tail), c.colsb[6] = kQBlock;
    c.rows[7] = uint8_t(tail), c.colsb[7] = 4 * kGroup;
    _tile_loadconfig(&c);
    configured_tail = tail;
  }

  // The GEMM's chunk as Avx512Isa unpacks it, with the quad types' bytes as signed v = u - bias
  // (Q8_0 and its forms q, Q4_0 q - 8, Q4_K and Q4_1 q, Q5_K and Q5_1 q + 16 h, the level types
  // levels[q], Q5_0 q + 16 h - 16): tdpbssd's C is then the block's exact sum of
  // v xq, I itself. (The level types' fused path below 33 rows stays on the vector GEMV: direct_min_rows.)
  // (The sub16 types, Q6_K and the levels16 layout: Avx512Isa's unpack_sub16, for the vector
  // tiles; Q3_K's chunk is Q8_0's form, unpack_sub16<true>, for these.)
  static void unpack_int(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, int16_t* V, float* S1,
                         float* S2) {
    Avx512Isa::unpack_int(t, group, k0, len, V, S1, S2);
    const GGMLType gt = gemm_type(t);  // (the level types' and Q3_K's chunk is Q8_0's form)
    if (!is_quad_type(gt)) return;
    const __m512i bias = _mm512_set1_epi8(char(gt == GGMLType::Q8_0 ? QDecQ8_0::kBias : gt == GGMLType::Q4_0 ? QDecQ4_0::kBias : 0));
    uint8_t* v = reinterpret_cast<uint8_t*>(V);
    for (int64_t i = 0; i < len / kQBlock * kQBlock * kGroup; i += 64)
      _mm512_storeu_si512(v + i, _mm512_sub_epi8(_mm512_loadu_si512(v + i), bias));
  }

  // One 32-block's products: C (tile TC, stored to c32: 16 x 16 int32) = A (TA: 16 rows of xq8,
  // ldx apart) x B (TB: 512 bytes of quads at v), by DP: tdpbssd for signed quads, tdpbsud for
  // unsigned ones. (A macro: GCC's tile intrinsics paste the tile number into the instruction's
  // text, so it must be a literal.)
#define FT_BLOCK_PRODUCTS(DP, TA, TB, TC, xq8, ldx, v, c32) \
  do {                                                      \
    _tile_loadd(TA, xq8, ldx);                              \
    _tile_loadd(TB, v, 4 * kGroup);                         \
    _tile_zero(TC);                                         \
    DP(TC, TA, TB);                                         \
    _tile_stored(TC, c32, 4 * kGroup);                      \
  } while (0)
  static void block_products(int64_t kb, const int8_t* x, int64_t ldx, const uint8_t* v, int32_t* c32) {
    x += kb * kQBlock, v += kb * kQBlock * kGroup, c32 += kb * kTileRows * kGroup;
    if (kb % 2 == 0) FT_BLOCK_PRODUCTS(_tile_dpbssd, 0, 1, 2, x, ldx, v, c32);
    else FT_BLOCK_PRODUCTS(_tile_dpbssd, 3, 4, 5, x, ldx, v, c32);
  }

  // gemv_int_n (the driver's fused path): tiles of 16 rows from direct_min_rows(t) on
  // (direct_tiles; a last tile of kMinTailRows or more too), the rest of the rows and other
  // types as Avx512Isa.
  static void gemv_int_n(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const QAct& qa, int64_t r0,
                         int64_t M, float* c, int64_t ldc) {
    const bool tiles = M >= direct_min_rows(t) && ng <= kMaxGroups;
    const int64_t on_tiles = !tiles ? 0 : M % kTileRows >= kMinTailRows ? M : M / kTileRows * kTileRows;
    if (on_tiles < M) Avx512Isa::gemv_int_n(t, groups, ng, K, qa, r0 + on_tiles, M - on_tiles, c + on_tiles * ldc, ldc);
    if (on_tiles == 0) return;
    with_qdecoder(t, groups[0], [&](auto dec0) {
      using D = decltype(dec0);
      if constexpr (std::is_same_v<D, QDecQ8_0>) {
        if (on_tiles <= kQ8RawMaxRows) return direct_tiles<D, true>(groups, ng, K, qa, r0, on_tiles, c, ldc);
      }
      if constexpr (!D::kSub16) direct_tiles<D, false>(groups, ng, K, qa, r0, on_tiles, c, ldc);
    });
  }
  static constexpr int kMaxGroups = 2;  // (the driver's kItemGroups)
  // A last tile of fewer than 16 rows runs on the tiles (6 and 7, configured to its rows) from
  // this many rows, the vector GEMV below: Q4_0 at 24 rows 1.11x, 28 rows 1.03x, 20 rows 1.0x;
  // Q4_K 1.01x at 24 and 28, 0.95x at 20 (`run -b` on the 1.1B files, 5 alternated rounds).
  static constexpr int64_t kMinTailRows = 8;

  // Rows [r0, r0 + rows) of qa against ng (<= 2) packed groups of one quad type D, straight
  // from the packed bytes: C (rows, ldc)[:, 16g : 16g + 16] = y. A last tile of fewer than 16
  // rows runs on tiles 6 and 7, configured to its rows (no padded copy).
  // Units of 16 rows x one group over chunks of kKC / 32 blocks, pipelined as mk_int_tiles'
  // (the next unit's product of each block issued before this unit's epilogue of it).
  // - Q8_0: B is the packed quads themselves (u = q + 128; tdpbsud: signed A, unsigned B), and
  //   I = C - 128 X (X = the block's sum of xq, qa.xs);
  // - Q4_0, Q4_K: the first row tile's units unpack their group's next chunk as they go, block by
  //   block, into signed quads v = u - B (vb; tdpbssd), so C is I itself and the epilogue has no
  //   bias term (it bounds the tiles: 1.3x faster in cache without it).
  // The epilogue is mk_q_t's: y = fma(float(I), s1 * dx, y) [then y = fma(float(X), s2 * dx, y)].
  // At these sizes a step streams every weight from memory: the first row tile's units ask for
  // their group's blocks ahead (kPrefetchBlocks) as they reach each block, spread through the
  // compute (the next chunks asked for at once at each chunk's start kept the tiles waiting:
  // 1.15-1.2x slower at 32 rows on a 1.1B Q8_0 model; running the streams on into the next
  // item's groups, as the vector GEMV's do, made no difference).
  template <class D, bool kRaw>
  static void direct_tiles(const uint8_t* const* groups, int ng, int64_t K, const QAct& qa, int64_t r0,
                           int64_t rows, float* c, int64_t ldc) {
    static_assert(!kRaw || std::is_same_v<D, QDecQ8_0>);
    static_assert(!min16_of<D>(), "Q2_K's min term has no tiles");
    const int64_t n_tiles = (rows + kTileRows - 1) / kTileRows, tail = rows - (n_tiles - 1) * kTileRows;
    configure_tiles(tail < kTileRows ? int(tail) : 0);  // (0: full tiles only, any tail config will do)
    const int64_t nkb = K / kQBlock, n_units = n_tiles * ng, gbytes = nkb * D::kBytesPer32;
    constexpr int64_t kChunk = kKC / kQBlock;
    const __m512i bias = _mm512_set1_epi8(char(D::kBias));
    alignas(64) int32_t c32[2][kChunk * kTileRows * kGroup];
    // The unpacked types' chunks, per parity of the chunk and group: signed quads and scales.
    constexpr int64_t kVb = kRaw ? 1 : kChunk * kQBlock * kGroup, kSb = kRaw ? 1 : kChunk * kGroup;
    alignas(64) int8_t vb[2][kMaxGroups][kVb];
    alignas(64) float s1b[2][kMaxGroups][kSb], s2b[2][kMaxGroups][D::kS2 ? kSb : 1];
    auto unpack = [&](int p, int g, int64_t kb) {  // block kb (of K) into its chunk's slot
      if constexpr (!kRaw) {
        D d{groups[g]};
        d.begin(kb);
        const int64_t j = kb % kChunk;
        __m512 s1, s2 = _mm512_setzero_ps();
        d.scales(s1, s2);
        _mm512_store_ps(s1b[p][g] + kGroup * j, s1);
        if constexpr (D::kS2) _mm512_store_ps(s2b[p][g] + kGroup * j, s2);
        for (int P = 0; P < 4; ++P) {
          __m512i w0, w1;
          d.quads(P, w0, w1);
          _mm512_store_si512(vb[p][g] + j * kQBlock * kGroup + 128 * P, _mm512_sub_epi8(w0, bias));
          _mm512_store_si512(vb[p][g] + j * kQBlock * kGroup + 128 * P + 64, _mm512_sub_epi8(w1, bias));
        }
      }
    };
    struct U {
      const int8_t* x = nullptr;  // the unit's rows of xq8 from the chunk
      bool tail = false;          // a last tile of fewer than 16 rows (tiles 6 and 7)
      const int8_t* v = nullptr;  // its group's quads from the chunk (block kb at v + kb * kVStride)
    };
    constexpr int64_t kVStride = kRaw ? D::kBytesPer32 : kQBlock * kGroup;
    auto unit_of = [&](int64_t kb0, int p, int64_t u) {
      const int g = int(u % ng);
      return U{qa.xq8.data() + (r0 + u / ng * kTileRows) * K + kb0 * kQBlock, u / ng == n_tiles - 1 && tail < kTileRows,
               kRaw ? reinterpret_cast<const int8_t*>(groups[g] + kb0 * D::kBytesPer32 + 2 * kGroup) : vb[p][g]};
    };
    // Block kb of unit u's products into c32u.
    auto products = [&](const U& u, int64_t kb, int32_t* c32u) {
      const int8_t* x = u.x + kb * kQBlock;
      const int8_t* v = u.v + kb * kVStride;
      int32_t* ck = c32u + kb * kTileRows * kGroup;
      if (u.tail) {  // (one A and C pair: the B tiles still alternate)
        if (kb % 2 == 0) {
          if constexpr (kRaw) FT_BLOCK_PRODUCTS(_tile_dpbsud, 6, 1, 7, x, K, v, ck);
          else FT_BLOCK_PRODUCTS(_tile_dpbssd, 6, 1, 7, x, K, v, ck);
        } else {
          if constexpr (kRaw) FT_BLOCK_PRODUCTS(_tile_dpbsud, 6, 4, 7, x, K, v, ck);
          else FT_BLOCK_PRODUCTS(_tile_dpbssd, 6, 4, 7, x, K, v, ck);
        }
      } else if (kb % 2 == 0) {
        if constexpr (kRaw) FT_BLOCK_PRODUCTS(_tile_dpbsud, 0, 1, 2, x, K, v, ck);
        else FT_BLOCK_PRODUCTS(_tile_dpbssd, 0, 1, 2, x, K, v, ck);
      } else {
        if constexpr (kRaw) FT_BLOCK_PRODUCTS(_tile_dpbsud, 3, 4, 5, x, K, v, ck);
        else FT_BLOCK_PRODUCTS(_tile_dpbssd, 3, 4, 5, x, K, v, ck);
      }
    };
    for (int g = 0; g < ng; ++g) {
      prefetch_bytes(groups[g], std::min(kChunk + kPrefetchBlocks<kRaw>, nkb) * D::kBytesPer32);
      for (int64_t kb = 0; kb < std::min(kChunk, nkb); ++kb) unpack(0, g, kb);
    }
    for (int64_t kb0 = 0; kb0 < nkb; kb0 += kChunk) {
      const int p = int(kb0 / kChunk % 2);
      const int64_t nb = std::min(kChunk, nkb - kb0), nb_next = std::clamp<int64_t>(nkb - kb0 - kChunk, 0, kChunk);
      const U first = unit_of(kb0, p, 0);
      for (int64_t kb = 0; kb < nb; ++kb) products(first, kb, c32[0]);
      // Unit u's epilogue over the chunk (NR rows; 0: nr), the next unit's products under it.
      auto epilogue = [&]<int NR>(int64_t u, int nr) {
        const int n = NR ? NR : nr;
        const U next = u + 1 < n_units ? unit_of(kb0, p, u + 1) : U{};
        const int64_t m0 = u / ng * kTileRows;
        const int g = int(u % ng);
        const float* dx = qa.dx.data() + (r0 + m0) * nkb + kb0;
        const int32_t* xs = qa.xs.data() + (r0 + m0) * nkb + kb0;
        float* cu = c + m0 * ldc + kGroup * g;
        __m512 y[kTileRows];
#pragma GCC unroll 16
        for (int i = 0; i < kTileRows; ++i)
          if (i < n) y[i] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(cu + i * ldc);
        for (int64_t kb = 0; kb < nb; ++kb) {
          if (u < ng) {
            const int64_t kn = kb0 + kChunk + kb;
            const int64_t off = (kn + kPrefetchBlocks<kRaw>) * D::kBytesPer32;
            if (off < gbytes) prefetch_bytes(groups[g] + off, D::kBytesPer32);
            if (kb < nb_next) unpack(p ^ 1, g, kn);
          }
          if (next.x) products(next, kb, c32[(u + 1) % 2]);
          const __m512 s1v = kRaw ? h16(groups[g] + (kb0 + kb) * D::kBytesPer32) : _mm512_load_ps(s1b[p][g] + kGroup * kb);
          const int32_t* ck = c32[u % 2] + kb * kTileRows * kGroup;
#pragma GCC unroll 16
          for (int i = 0; i < kTileRows; ++i) {
            if (i >= n) break;
            const __m512 d = _mm512_set1_ps(dx[i * nkb + kb]);
            __m512i I = _mm512_load_si512(ck + i * kGroup);
            if constexpr (kRaw) I = _mm512_sub_epi32(I, _mm512_set1_epi32(D::kBias * xs[i * nkb + kb]));
            y[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(s1v, d), y[i]);
            if constexpr (D::kS2)
              y[i] = _mm512_fmadd_ps(_mm512_set1_ps(float(xs[i * nkb + kb])),
                                     _mm512_mul_ps(_mm512_load_ps(s2b[p][g] + kGroup * kb), d), y[i]);
          }
        }
#pragma GCC unroll 16
        for (int i = 0; i < kTileRows; ++i)
          if (i < n) _mm512_storeu_ps(cu + i * ldc, y[i]);
      };
      for (int64_t u = 0; u < n_units; ++u) {
        if (u / ng < n_tiles - 1 || tail == kTileRows) epilogue.template operator()<kTileRows>(u, kTileRows);
        else epilogue.template operator()<0>(u, int(tail));
      }
    }
  }

#undef FT_BLOCK_PRODUCTS

  // A unit: NR (<= 16; nr when 0) rows x one group over the chunk's nb blocks.
  struct Unit {
    const int8_t* x;  // its rows' int8 activations from the chunk's k0, ldx apart
    int64_t ldx;
    const uint8_t* v;  // its group's signed quads (unpack_int)
    int nr;
  };
  // Unit's outputs (mk_q_t's epilogue per block, in k order): c (nr rows, ldc) (+)= y, y =
  // fma(float(I), s1 * dx, y) [then y = fma(float(xs), s2 * dx, y)], I from its blocks' C in c32.
  // Before each block's epilogue the next unit's product of that block is issued (when next.x)
  // into c32_next: the tile unit computes it while the vector units run this epilogue (whole
  // units one after the other leave each side idle in turn: a tile store holds retirement until
  // its product is done).
  template <int NR>
  static void unit(const Unit& u, const int32_t* c32, int64_t nb, const float* dx, const int32_t* xs, int64_t ldb,
                   const float* s1, const float* s2, float* c, int64_t ldc, bool first, const Unit& next,
                   int32_t* c32_next) {
    const int nr = NR ? NR : u.nr;
    __m512 y[kTileRows];
#pragma GCC unroll 16
    for (int i = 0; i < kTileRows; ++i)
      if (i < nr) y[i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc);
    for (int64_t kb = 0; kb < nb; ++kb) {
      if (next.x) block_products(kb, next.x, next.ldx, next.v, c32_next);
      const __m512 s1v = _mm512_loadu_ps(s1 + kGroup * kb);
      const __m512 s2v = s2 ? _mm512_loadu_ps(s2 + kGroup * kb) : _mm512_setzero_ps();
      const int32_t* ck = c32 + kb * kTileRows * kGroup;
#pragma GCC unroll 16
      for (int i = 0; i < kTileRows; ++i) {
        if (i >= nr) break;
        const __m512 d = _mm512_set1_ps(dx[i * ldb + kb]);
        y[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(ck + i * kGroup)), _mm512_mul_ps(s1v, d), y[i]);
        if (s2) y[i] = _mm512_fmadd_ps(_mm512_set1_ps(float(xs[i * ldb + kb])), _mm512_mul_ps(s2v, d), y[i]);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < kTileRows; ++i)
      if (i < nr) _mm512_storeu_ps(c + i * ldc, y[i]);
  }

  // The driver's tile hook (kernels_impl.h, int_item): C (rows, ldc)[:, 16g : 16g + 16] (+)= rows
  // of quantized activations x ng groups over one K chunk as unpack_int gives it (V, S1, S2; y
  // starts at 0 when first, else from C). xq8 (rows, ldx) from the chunk's k0; dx, xs (rows, ldb)
  // from block k0 / 32. Returns the rows it did: all, or 0 for a type whose chunk is off the
  // quad layout (gemm_type: the sub16 types but Q3_K), which the vector tiles take. Units of 16
  // rows (the last one's rows copied into a zero-padded tile) x one group, software-pipelined
  // (unit).
  static int64_t mk_int_tiles(GGMLType t, const int8_t* xq8, int64_t ldx, const float* dx, const int32_t* xs,
                              int64_t ldb, int64_t rows, const int16_t* const* V, const float* const* S1,
                              const float* const* S2, int ng, int64_t len, float* c, int64_t ldc, bool first) {
    t = gemm_type(t);  // (the unpacked chunk's form: the level types' is Q8_0's)
    if (!is_quad_type(t)) return 0;
    configure_tiles();
    const bool with_s2 = has_min_term(t);
    const int64_t nb = len / kQBlock, n_tiles = (rows + kTileRows - 1) / kTileRows, n_units = n_tiles * ng;
    alignas(64) int32_t c32[2][kKC / kQBlock * kTileRows * kGroup];
    alignas(64) int8_t pad[kTileRows * kKC];  // the last tile's rows when fewer than 16
    const int tail = int(rows - (n_tiles - 1) * kTileRows);
    if (tail < kTileRows) {  // (vector copies, not memcpy: TSan intercepts libc calls even here)
      for (int i = 0; i < kTileRows; ++i)
        for (int64_t k = 0; k < kKC; k += kQBlock) {
          const __m256i v = i < tail && k < len
                                ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq8 + ((n_tiles - 1) * kTileRows + i) * ldx + k))
                                : _mm256_setzero_si256();
          _mm256_store_si256(reinterpret_cast<__m256i*>(pad + i * kKC + k), v);
        }
    }
    auto unit_of = [&](int64_t u) {
      const int64_t tile = u / ng;
      const uint8_t* v = reinterpret_cast<const uint8_t*>(V[u % ng]);
      if (tile == n_tiles - 1 && tail < kTileRows) return Unit{pad, kKC, v, tail};
      return Unit{xq8 + tile * kTileRows * ldx, ldx, v, kTileRows};
    };
    // Unit 0's products alone, then each unit's epilogue with the next one's products.
    Unit cur = unit_of(0);
    for (int64_t kb = 0; kb < nb; ++kb) block_products(kb, cur.x, cur.ldx, cur.v, c32[0]);
    for (int64_t u = 0; u < n_units; ++u) {
      const Unit next = u + 1 < n_units ? unit_of(u + 1) : Unit{nullptr, 0, nullptr, 0};
      const int64_t m0 = u / ng * kTileRows;
      const int g = int(u % ng);
      const float* s2 = with_s2 ? S2[g] : nullptr;
      float* cu = c + m0 * ldc + kGroup * g;
      if (cur.nr == kTileRows)
        unit<kTileRows>(cur, c32[u % 2], nb, dx + m0 * ldb, xs + m0 * ldb, ldb, S1[g], s2, cu, ldc, first, next, c32[(u + 1) % 2]);
      else
        unit<0>(cur, c32[u % 2], nb, dx + m0 * ldb, xs + m0 * ldb, ldb, S1[g], s2, cu, ldc, first, next, c32[(u + 1) % 2]);
      cur = next;
    }
    return rows;
  }
};

}  // namespace

const IsaKernels& amx_kernels() { return make_table<AmxIsa>("amx"); }

}  // namespace ft::cpu
