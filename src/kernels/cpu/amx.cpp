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
#include "kernels/cpu/rowwise.h"
#include "kernels/cpu/thread_pool.h"  // (before the target pragma: its std headers stay baseline)

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports falsely (GCC PR 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/kernels_impl.h"
#include "kernels/cpu/isa_avx2.h"
#include "kernels/cpu/isa_avx512.h"

namespace ft::cpu {
namespace {

struct AmxIsa : Avx512Isa {
  static constexpr int kTileRows = 16;

  // The rows from which gemv_int_n (the driver's fused path, M <= 32 for the quad types) runs
  // Q8_0 on the tiles straight from the packed bytes. Measured on a 1.1B Q8_0 model (`run -b`,
  // 5 alternated pairs): 32-row chunks 1.065x the vector GEMV's prefill rate; 16 and 24 rows
  // 0.97x (weights from memory at every step; in cache, BM_GemmPct, the tiles were 1.3-1.5x
  // at 16-32 rows). The row blocks' tiles (unpacked chunks, mk_int_tiles) at 16-32 rows: Q4_0
  // 0.88x at 24 rows, Q8_0 no faster in cache; Q4_0 straight from its nibbles (split per block
  // and tile) no faster than the vector GEMV in cache. Once neither path burst-prefetched its
  // next chunk (below; Avx512Isa::gemv_int_n), the tiles from 8 rows (the last tile's rows
  // padded) ran 0.85x the vector GEMV at 8 rows, even at 16, 0.96x at 24, 1.0-1.03x at 32.
  static constexpr int64_t kDirectMinRows = 32;
  // How far ahead gemv_int_n's tiles ask for a group's blocks (8: 4.3 KB of Q8_0; at 16 and 32
  // rows 1.04-1.14x faster than 4, 16 or 24).
  static constexpr int64_t kPrefetchBlocks = 8;

  // Tiles 0 and 3: A (16 rows x 32 bytes); 1 and 4: B (8 quads x 64 bytes); 2 and 5: C (16 x 16
  // int32). Consecutive blocks alternate between the two sets, so the tile unit overlaps them.
  // Loaded once per thread (nothing else in this process configures tiles but bench peak's
  // probe, which puts this one back).
  static void configure_tiles() {
    thread_local bool configured = false;
    if (configured) return;
    TileConfig c;
    for (int t : {0, 3}) c.rows[t] = kTileRows, c.colsb[t] = kQBlock;
    for (int t : {1, 4}) c.rows[t] = kQBlock / 4, c.colsb[t] = 4 * kGroup;
    for (int t : {2, 5}) c.rows[t] = kTileRows, c.colsb[t] = 4 * kGroup;
    _tile_loadconfig(&c);
    configured = true;
  }

  // The GEMM's chunk as Avx512Isa unpacks it, with the quad types' bytes as signed v = u - bias
  // (Q8_0 q, Q4_0 q - 8, Q4_K q): tdpbssd's C is then the block's exact sum of v xq, I itself.
  // (Q6_K keeps its int16 pairs for the vector tiles.)
  static void unpack_int(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, int16_t* V, float* S1,
                         float* S2) {
    Avx512Isa::unpack_int(t, group, k0, len, V, S1, S2);
    if (!is_quad_type(t)) return;
    const __m512i bias = _mm512_set1_epi8(char(t == GGMLType::Q8_0 ? QDecQ8_0::kBias : t == GGMLType::Q4_0 ? QDecQ4_0::kBias : 0));
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
  // Q8_0 straight from a packed group: per 32-block f16 d[16], then u[8 quads][16 rows][4] with u
  // = q + 128 (packed.h), which is B's layout: tdpbsud (signed A, unsigned B) gives C = sum u xq,
  // and I = C - 128 X (X = the block's sum of xq, qa.xs), the exact integer.
  static void block_products_q8(int64_t kb, const int8_t* x, int64_t ldx, const uint8_t* blocks, int32_t* c32) {
    x += kb * kQBlock, c32 += kb * kTileRows * kGroup;
    const uint8_t* b = blocks + kb * QDecQ8_0::kBytesPer32 + 2 * kGroup;
    if (kb % 2 == 0) FT_BLOCK_PRODUCTS(_tile_dpbsud, 0, 1, 2, x, ldx, b, c32);
    else FT_BLOCK_PRODUCTS(_tile_dpbsud, 3, 4, 5, x, ldx, b, c32);
  }
#undef FT_BLOCK_PRODUCTS

  // gemv_int_n (the driver's fused path): full tiles of 16 rows of Q8_0 as above, the rest of
  // the rows and other types as Avx512Isa. Units of 16 rows x one group over chunks of
  // kKC / 32 blocks, pipelined as mk_int_tiles' (the next unit's product of each block issued
  // before this unit's epilogue of it); the epilogue is mk_q_t's: y = fma(float(I), d * dx, y).
  // At these sizes a step streams every weight from memory: the first row tile's units ask for
  // their group's block kPrefetchBlocks ahead as they reach each block, spread through the
  // compute (the next chunks asked for at once at each chunk's start kept the tiles waiting:
  // 1.15-1.2x slower at 32 rows on a 1.1B Q8_0 model).
  static void gemv_int_n(GGMLType t, const uint8_t* const* groups, int ng, int64_t K, const QAct& qa, int64_t r0,
                         int64_t M, float* c, int64_t ldc) {
    const int64_t full = t == GGMLType::Q8_0 && M >= kDirectMinRows ? M / kTileRows * kTileRows : 0;
    if (full < M) Avx512Isa::gemv_int_n(t, groups, ng, K, qa, r0 + full, M - full, c + full * ldc, ldc);
    if (full == 0) return;
    configure_tiles();
    const int64_t nkb = K / kQBlock, n_units = full / kTileRows * ng;
    constexpr int64_t kChunk = kKC / kQBlock;
    alignas(64) int32_t c32[2][kChunk * kTileRows * kGroup];
    struct U {
      const int8_t* x = nullptr;  // the tile's rows of xq8 from the chunk
      const uint8_t* b = nullptr;  // the group's packed blocks from the chunk
    };
    for (int64_t kb0 = 0; kb0 < nkb; kb0 += kChunk) {
      const int64_t nb = std::min(kChunk, nkb - kb0);
      if (kb0 == 0)
        for (int g = 0; g < ng; ++g) prefetch_bytes(groups[g], std::min(kPrefetchBlocks, nkb) * QDecQ8_0::kBytesPer32);
      auto unit_of = [&](int64_t u) {
        return U{qa.xq8.data() + (r0 + u / ng * kTileRows) * K + kb0 * kQBlock,
                 groups[u % ng] + kb0 * QDecQ8_0::kBytesPer32};
      };
      U cur = unit_of(0);
      for (int64_t kb = 0; kb < nb; ++kb) block_products_q8(kb, cur.x, K, cur.b, c32[0]);
      for (int64_t u = 0; u < n_units; ++u) {
        const U next = u + 1 < n_units ? unit_of(u + 1) : U{};
        const int64_t m0 = u / ng * kTileRows;
        const float* dx = qa.dx.data() + (r0 + m0) * nkb + kb0;
        const int32_t* xs = qa.xs.data() + (r0 + m0) * nkb + kb0;
        float* cu = c + m0 * ldc + kGroup * (u % ng);
        __m512 y[kTileRows];
#pragma GCC unroll 16
        for (int i = 0; i < kTileRows; ++i) y[i] = kb0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(cu + i * ldc);
        // (the first row tile's units: their group's block kb0 + kb + kPrefetchBlocks at block kb)
        const int64_t n_ahead = u < ng ? std::clamp<int64_t>(nkb - kb0 - kPrefetchBlocks, 0, nb) : 0;
        for (int64_t kb = 0; kb < nb; ++kb) {
          if (kb < n_ahead)
            prefetch_bytes(groups[u] + (kb0 + kb + kPrefetchBlocks) * QDecQ8_0::kBytesPer32, QDecQ8_0::kBytesPer32);
          if (next.x) block_products_q8(kb, next.x, K, next.b, c32[(u + 1) % 2]);
          const __m512 s1v = h16(cur.b + kb * QDecQ8_0::kBytesPer32);
          const int32_t* ck = c32[u % 2] + kb * kTileRows * kGroup;
#pragma GCC unroll 16
          for (int i = 0; i < kTileRows; ++i) {
            const __m512 d = _mm512_set1_ps(dx[i * nkb + kb]);
            const __m512i I = _mm512_sub_epi32(_mm512_load_si512(ck + i * kGroup),
                                               _mm512_set1_epi32(QDecQ8_0::kBias * xs[i * nkb + kb]));
            y[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(s1v, d), y[i]);
          }
        }
#pragma GCC unroll 16
        for (int i = 0; i < kTileRows; ++i) _mm512_storeu_ps(cu + i * ldc, y[i]);
        cur = next;
      }
    }
  }

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
  // from block k0 / 32. Returns the rows it did: all, or 0 for a type off the quad layout (Q6_K),
  // which the vector tiles take. Units of 16 rows (the last one's rows copied into a zero-padded
  // tile) x one group, software-pipelined (unit).
  static int64_t mk_int_tiles(GGMLType t, const int8_t* xq8, int64_t ldx, const float* dx, const int32_t* xs,
                              int64_t ldb, int64_t rows, const int16_t* const* V, const float* const* S1,
                              const float* const* S2, int ng, int64_t len, float* c, int64_t ldc, bool first) {
    if (!is_quad_type(t)) return 0;
    configure_tiles();
    const bool with_s2 = t == GGMLType::Q4_K;
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
