// The "panel" layout the fast CPU kernels repack weights into at load (Backend::prepare), so that
// a micro-kernel reads 16 output rows' weights at one k (or one pair of k) as whole vectors, and
// decode streams each group of rows front to back. Quantized types stay quantized (same bytes per
// weight, give or take the unpacked 6-bit Q4_K scales), so decode reads as many bytes as before.
//
// W (N, K) -> ceil(N/16) groups of kGroup = 16 rows (the last padded with zero rows); group g is
// contiguous, group_bytes(type, K) bytes; inside it K is cut into blocks of block_len(type)
// elements (F32/F16/BF16: one element, so K is arbitrary), each block laid out as:
//   F32        float  w[16]                          (row r at k)
//   F16, BF16  uint16 w[16]
//   Q8_0 (32)  f16 d[16]; int8 q[16 pairs][16 rows][2]      w = q * d
//   Q4_0 (32)  f16 d[16]; uint8 q[16 pairs][8][2]: byte (p, j, e) holds k = 2p + e of row j in
//              the low nibble and of row j + 8 in the high one (ggml's 0..15); w = (q - 8) * d
//   MXFP4 (32) as Q4_0, d the f16 scale 2^(e - 128) for e in [104, 143], else +0 with q = 0 (e <
//              104, tiny: every |value| <= 12 * 2^-25; or an all-zero block); w = kvalues[q] * d
//   IQ4_NL (32) as Q4_0 (its own d)                 w = kvalues_iq4nl[q] * d, levels in [-127, 113]
//   Q5_0 (32)  as Q4_0, then the 5th bits uint8 [16 rows][4] as Q5_K's plane (one 32-block's)
//                                                    w = (q + 16 h - 16) * d
//   Q4_1 (32)  f16 d[16], m[16]; q as Q4_0           w = d * q + m
//   Q5_1 (32)  as Q4_1, then the 5th bits as Q5_0's  w = d * (q + 16 h) + m
//   Q4_K (256) f16 d[16], dmin[16]; uint8 sc[8][16], m[8][16]; q[128 pairs][8][2] as Q4_0
//                                                    w = (d*sc) * q - dmin*m, sub-block = k/32
//   Q5_K (256) as Q4_K, then the 5th bits uint8 [8 32-blocks][16 rows][4]: byte (s, r, e) holds
//              at bit j the 5th bit of k = 32s + 4j + e (both variants: its quads' bits)
//                                                    w = (d*sc) * (q + 16 h) - dmin*m
//   Q6_K (256) f16 d[16]; int8 sc[16][16]; low 4 bits [128 pairs][8][2] as Q4_0; high 2 bits
//              uint16 [32 quads of pairs][16 lanes]: lane 2j + e, pair p of the quad at bits
//              4p (row j) and 4p + 2 (row j + 8), so a shift and an and put them at bits 4-5
//                                                    w = (d*sc) * (q - 32), sub-block = k/16
//   levels (256: IQ4_XS, the ternary TQ1_0 and TQ2_0, and the grid types with one scale per
//              32-block, IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S: iq::has_level_form) f16 d[16]; int8
//              sc[8][16]; q[128 pairs][8][2]
//              as Q4_0, an index into the type's 16 levels (level_values)
//                                                    w = (d*sc*unit) * levels[q], sub-block = k/32
//              IQ4_XS sc = ls - 32, unit 1, ggml's kvalues_iq4nl; TQ1_0 and TQ2_0 sc = 1, unit
//              1, levels q - 1 (blocks::kValuesTernary: 1.69 and 2.06 bits in their files,
//              Q8_0 8.5); the grid types sc = 2s + 1
//              (their step), levels = grid x sign (IQ1_S: 8 (grid +- 1/8)), unit iq::level_unit
//              (quant_iq.h): the same values, exactly, in 4.31 bits a weight (their files 1.56-3.44,
//              Q8_0 8.5). The types with at most 8 levels (IQ2_XXS, IQ1_S, TQ1_0, TQ2_0) take
//              the levels3 layout instead; IQ4_XS, IQ3_XXS and IQ3_S keep the nibbles.
//   levels3 (256: the levels layout's types with at most 8 levels, is_levels3_layout: IQ2_XXS,
//              IQ1_S, TQ1_0, TQ2_0) d and sc as the levels layout's, then per 32-block a 3-bit
//              index per k as the levels16 layout's (below): the same values in 3.31 bits a
//              weight (the nibbles' 4.31 until 2026-12-06); one layout for every ISA
//   levels16 (256: Q3_K and the grid types with a scale per 16 k, IQ2_XS, IQ2_S, IQ1_M:
//              iq::has_level16_form) f16 d[16]; int8 sc[16][16] (the scale of each 16 k); per
//              32-block s (kFields3Per32 bytes) a 3-bit index i into the type's levels
//              (level_values, at most 8) of each k: its low fields [2 halves][16 rows][4] (byte
//              (h, r, e) holds at bits 2t, 2t + 1 the low 2 bits of k = 32s + 16h + 4t + e's i,
//              as Q2_K's fields), then its high bits [16 rows][4] (byte (r, e) holds at bit 4h + t
//              the high bit of that k's i)          w = (d*unit) * sc * levels[i], sub-block = k/16
//              the grid types: sc = 2s + 1, levels and unit as the per-32 grid types' (IQ2:
//              IQ2_XXS's, IQ1_M: IQ1_S's); Q3_K: d = -d, sc = its 6-bit scale - 32, i = 3 - q
//              (q in [-4, 3], ggml's value), levels blocks::kValuesQ3KNeg = i - 3 = -q, unit 1.
//              Exact in 3.56 bits a weight (their files 2.31, 2.56, 1.75 and 3.44; Q8_0 8.5),
//              one layout for every ISA (a nibble per weight, 4.56 bits, until 2026-12-06)
//   Q2_K (256) f16 d[16], dmin[16]; uint8 sm[16 halves][16 rows] (the file's byte: scale sc in
//              the low nibble, min m in the high one, of each 16 k); q [16 halves][16 rows][4]:
//              byte (h, r, e) holds at bits 2t, 2t + 1 the q (0..3) of k = 16h + 4t + e of row r
//                                                    w = d * (sc q) - dmin * m, sub-block = k/16
//              (2.625 bits a weight, as the file; one layout for every ISA: a 64-byte load gives
//              a half block's 4 quads of 16 rows)
// Pairs of k side by side match vpmaddwd, which multiplies int16 pairs and adds each pair.
//
// The "quad" variant (pack_rows_quad; the avx2 and avx512 kernels' layout for Q8_0, Q4_0, Q5_0,
// Q4_1, Q5_1, the level types but the levels3 layout's, Q4_K and Q5_K; the scalar kernels keep
// the pair layout) puts 4 consecutive k of a row side by side
// instead, as unsigned bytes u = v + B, for vpdpbusd / vpmaddubsw (u8 x s8 products, four
// summed per 32-bit lane: 16 rows x 4 k in one 512-bit register, 8 rows in a 256-bit one).
// Scales and Q4_K's header stay as above; per 32-block of k:
//   Q8_0  uint8 u[8 quads][16 rows][4]: k = 4 quad + e; u = q + 128 (B = 128)
//   Q4_0, Q5_0, Q4_1, Q5_1, the level types, Q4_K, Q5_K  uint8 [4 quad pairs][16 rows][4]: byte (P, r, e)
//         holds k = 8P + e of row r in the low nibble and k = 8P + 4 + e in the high one; u = q
//         (Q4_0 B = 8, Q4_K B = 0; Q5_K u = q + 16 h in [0, 31], its 5th bit h from the plane
//         above, B = 0; Q5_0 the same u, B = 16; Q4_1 and Q5_1 as Q4_K and Q5_K); the level types' nibble q (MXFP4, IQ4_NL, the levels layout) is an
//         index (the levels3 layout's 3-bit i too, quad pairs from its fields: one layout for every ISA),
//         index, mapped by a byte shuffle (vpshufb) on vpdpbusd to u = levels[q] + B (MXFP4 B =
//         12: u in [0, 24]; the others B = 128: u in [1, 255]), on plain AVX2 to v = levels[q]
//         itself (|v| x sign(xq, v) as Q8_0: u x xq pair sums would pass int16)
// so the integer sum is I = sum u xq - B * sum xq, the same exact integer. Both variants have
// the same bytes per block. The levels16 layout (one layout for every ISA) gives a half block h
// (16 k) as 4 quads of indices, and I = sc_0 I_0 + sc_1 I_1 as Q6_K's below (u = levels[i] + 128 on vpdpbusd, v = levels[i] on plain AVX2; Q3_K: u = i
// itself, B = 3, on both). Q3_K's products levels[i] sc = -q sc lie in [-128, 124], an int8, so
// its GEMM chunk is Q8_0's form (gemm_type: v = levels[i] sc, s1 = d): the same exact I, Q8_0's
// micro-kernels.
// Q6_K's quad variant (pack_rows_q6k_quad; the avx2 and avx512 kernels' layout, the scalar ones
// keep the pair layout) keeps d and sc where the pair layout has them, then per 32-block of k in order
// (kQuadPer32 bytes each, so a GEMV reads the block front to back):
//   low 4 bits  uint8 [4 quad pairs][16 rows][4] as Q4_0's quads
//   high 2 bits uint8 [2 halves][16 rows][4]: byte (h, r, e) holds at bits 2t, 2t + 1 the high
//               bits of k = 16h + 4t + e (quad 4h + t) of row r
// so a half block's 4 quads come from one 64-byte load of each (a shift and an and put a
// field at bits 4-5), as u = q in [0, 63]: per half h, I_h = sum u xq - 32 X_h (X_h = sum of
// the half's xq), and I = sc_0 I_0 + sc_1 I_1, the pair layout's exact integer.
//
// Quantized weights multiply int8-quantized activations (the integer path, as llama.cpp does):
// x is cut into blocks of kQBlock = 32 along K, each x ~= dx * xq with dx = max|x| / 127 and xq
// in [-127, 127] (quantize_activations in kernels.h). A weight block splits into an integer
// part v and float scales per row and 32-block: w = v * s1 + s2 (s2 only for the min types: has_min_term):
//   Q8_0 v = q, s1 = d;  Q4_0 v = q - 8, s1 = d;  Q5_0 v = q + 16 h - 16, s1 = d;
//   MXFP4, IQ4_NL v = kvalues[q], s1 = d;
//   the levels layout v = levels[q], s1 = d*sc*unit (exact in f32: 11 + 6 bits times a power of
//   two, as ggml's d (ls - 32), d (0.5 + s) / 4, ...);
//   Q4_K v = q, s1 = d*sc, s2 = -(dmin*m);  Q5_K v = q + 16 h, s1 and s2 as Q4_K;
//   Q4_1 v = q, s1 = d, s2 = m;  Q5_1 v = q + 16 h, s1 = d, s2 = m;
//   Q6_K v = (q - 32) * sc, s1 = d;  the levels16 layout v = levels[i] * sc, s1 = d*unit (Q3_K:
//   -d);  Q2_K v = sc * q (in [0, 45]), s1 = d, and a min scale per half block h, b_h =
//   -(dmin * m_h) (exact in f32)
// so x.w over a 32-block = dx * (s1 * I + s2 * X) with I = sum v xq and X = sum xq, exact
// integers (Q2_K: dx * s1 * I + b_0 f_0 + b_1 f_1, f_h = dx * float(X_h), X_h the sum of half h's
// xq: QAct::fx). Every output is y = 0, then for each 32-block in k order
//   y = fma(float(I), s1 * dx, y)  [then y = fma(float(X), s2 * dx, y) for Q4_K, Q5_K, Q4_1, Q5_1;
//                                   y = fma(b_0, f_0, y), y = fma(b_1, f_1, y) for Q2_K]
// whatever M, path or ISA: the integer sums are exact, so a row's result is bit-identical in
// decode GEMV and prefill GEMM of any batch.
// The level types', Q5_0's and Q3_K's GEMM (a K chunk unpacked, unpack_int) takes its chunk in
// Q8_0's form (v and s1: the same integers and scales; gemm_type) and runs Q8_0's micro-kernels,
// Q4_1's and Q5_1's in Q4_K's and Q5_K's (u, s1, s2), Q2_K's as Q4_K's (u = v = sc q, s1) with
// its min scales b_h as float [len / 32][2 halves][16 rows] after the values, at
// q2k_min_scales(V, len) (S2 unused);
// MXFP4's GGUF rows (a weight not prepared) are converted to Q8_0 a chunk at a time
// (convert_rows: exact where the scale is an f16), so a row's bits are the same packed or not.
#pragma once
#include <cstdint>

#include "gguf/ggml_types.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_iq.h"

namespace ft::cpu {

constexpr int kGroup = 16;
constexpr int kQBlock = 32;  // activation quantization block along K (integer path)

// Byte offsets inside one packed Q4_K block (256 k of a group; layout above).
struct Q4KBlock {
  static constexpr int kD = 0, kDmin = 32, kSc = 64, kM = 64 + 128, kQ = 64 + 256;
  static constexpr int kBytes = kQ + 256 * kGroup / 2;  // 2368
};
// Byte offsets inside one packed Q5_0 block (32 k of a group): d, q as Q4_0's, the 5th bits.
struct Q50Block {
  static constexpr int kD = 0, kQ = 32, kQh = kQ + 32 * kGroup / 2;
  static constexpr int kBytes = kQh + 4 * kGroup;  // 352
};
// Byte offsets inside one packed Q4_1 block (32 k of a group): d, m, q as Q4_0's; Q5_1's: then
// the 5th bits as Q5_0's.
struct Q41Block {
  static constexpr int kD = 0, kM = 32, kQ = 64;
  static constexpr int kBytes = kQ + 32 * kGroup / 2;  // 320
};
struct Q51Block : Q41Block {
  static constexpr int kQh = Q41Block::kBytes, kBytes = kQh + 4 * kGroup;  // 384
};
// Byte offsets inside one packed block of the levels layout (256 k of a group): d, sc, then q as
// Q4_K's.
struct LevelsBlock {
  static constexpr int kD = 0, kSc = 32, kQ = 32 + 8 * kGroup;
  static constexpr int kBytes = kQ + 256 * kGroup / 2;  // 2208
};
// A cursor over one packed group of 256-blocks B whose nibbles lie as Q4_K's (the SIMD
// decoders' common part): begin(kb) moves to 32-block kb: its 256-block blk, sb (< 8) inside
// it, and its quads q.
template <class B>
struct NibbleCursor256 {
  const uint8_t* g;
  const uint8_t* blk = nullptr;
  const uint8_t* q = nullptr;
  int sb = 0;
  [[gnu::always_inline]] void begin(int64_t kb) {
    blk = g + (kb / 8) * B::kBytes;
    sb = int(kb % 8);
    q = blk + B::kQ + 256 * sb;
  }
};
using Q4KCursor = NibbleCursor256<Q4KBlock>;
using LevelsCursor = NibbleCursor256<LevelsBlock>;
// 3-bit indices (the levels16 layout's, the levels3 layout's; layout above): per 32-block of a
// group kFields3Per32 bytes, the low fields' kFields3Low, then the high bits.
constexpr int kFields3Levels = 8, kFields3Low = 32 * kGroup / 4, kFields3Per32 = kFields3Low + 32 * kGroup / 8;
// Byte offsets inside one packed block of the levels16 layout (256 k of a group): d, sc[16
// halves][16 rows], then the 8 32-blocks' 3-bit indices.
struct Levels16Block {
  static constexpr int kD = 0, kSc = 32, kQ = 32 + 16 * kGroup;
  static constexpr int kBytes = kQ + 8 * kFields3Per32;  // 1824
};
// Byte offsets inside one packed block of the levels3 layout (256 k of a group): d and sc as the
// levels layout's, then the 8 32-blocks' 3-bit indices.
struct Levels3Block {
  static constexpr int kD = LevelsBlock::kD, kSc = LevelsBlock::kSc, kQ = LevelsBlock::kQ;
  static constexpr int kBytes = kQ + 8 * kFields3Per32;  // 1696
};
// A cursor over one packed group of 256-blocks B with 3-bit indices: begin(kb) moves to 32-block
// kb: its 256-block blk, sb (< 8) inside it, its indices' low fields q and high bits qh.
template <class B>
struct Fields3Cursor {
  const uint8_t* g;
  const uint8_t* blk = nullptr;
  const uint8_t* q = nullptr;
  const uint8_t* qh = nullptr;
  int sb = 0;
  [[gnu::always_inline]] void begin(int64_t kb) {
    blk = g + (kb / 8) * B::kBytes;
    sb = int(kb % 8);
    q = blk + B::kQ + kFields3Per32 * sb;
    qh = q + kFields3Low;
  }
};
using Levels16Cursor = Fields3Cursor<Levels16Block>;
using Levels3Cursor = Fields3Cursor<Levels3Block>;
// Byte offsets inside one packed Q2_K block (256 k of a group; layout above).
struct Q2KBlock {
  static constexpr int kD = 0, kDmin = 32, kSm = 64, kQ = 64 + 16 * kGroup, kQPer32 = 32 * kGroup / 4;
  static constexpr int kBytes = kQ + 8 * kQPer32;  // 1344
};
// A cursor over one packed Q2_K group: begin(kb) moves to 32-block kb: its 256-block blk, sb
// (< 8) inside it, its two halves' scale/min bytes sm and 2-bit fields q.
struct Q2KCursor {
  const uint8_t* g;
  const uint8_t* blk = nullptr;
  const uint8_t* sm = nullptr;
  const uint8_t* q = nullptr;
  int sb = 0;
  [[gnu::always_inline]] void begin(int64_t kb) {
    blk = g + (kb / 8) * Q2KBlock::kBytes;
    sb = int(kb % 8);
    sm = blk + Q2KBlock::kSm + 2 * kGroup * sb;
    q = blk + Q2KBlock::kQ + Q2KBlock::kQPer32 * sb;
  }
};
// Q5_K's packed block: Q4_K's, then the 5th bits of its 8 32-blocks (kQhPer32 bytes each).
struct Q5KBlock : Q4KBlock {
  static constexpr int kQh = Q4KBlock::kBytes, kQhPer32 = 4 * kGroup;
  static constexpr int kBytes = kQh + 8 * kQhPer32;  // 2880
};
// A cursor over one packed Q5_K group: Q4KCursor's fields over Q5_K's blocks, and qh, the 5th
// bits of 32-block kb.
struct Q5KCursor {
  const uint8_t* g;
  const uint8_t* blk = nullptr;
  const uint8_t* q = nullptr;
  const uint8_t* qh = nullptr;
  int sb = 0;
  [[gnu::always_inline]] void begin(int64_t kb) {
    blk = g + (kb / 8) * Q5KBlock::kBytes;
    sb = int(kb % 8);
    q = blk + Q5KBlock::kQ + 256 * sb;
    qh = blk + Q5KBlock::kQh + Q5KBlock::kQhPer32 * sb;
  }
};
// Byte offsets inside one packed Q6_K block (256 k of a group; both variants): d, sc, then the
// 8 32-blocks' low bits (kQlPer32 each) and their high bits (kQhPer32 each).
struct Q6KBlock {
  static constexpr int kD = 0, kSc = 32, kQl = 32 + 16 * kGroup, kQlPer32 = 32 * kGroup / 2;
  static constexpr int kQh = kQl + 8 * kQlPer32, kQhPer32 = 32 * kGroup / 4;
  static constexpr int kBytes = kQh + 8 * kQhPer32;  // 3360
  static constexpr int kQuadPer32 = kQlPer32 + kQhPer32;  // (the quad variant: low, then high bits)
};
// A cursor over one group in Q6_K's quad variant (the SIMD decoders' common part): begin(kb)
// moves to 32-block kb: its 256-block blk, j (< 8) inside it, its low bits ql and high bits qh.
struct Q6KQuadCursor {
  const uint8_t* g;
  const uint8_t* blk = nullptr;
  const uint8_t* ql = nullptr;
  const uint8_t* qh = nullptr;
  int j = 0;
  [[gnu::always_inline]] void begin(int64_t kb) {
    blk = g + (kb / 8) * Q6KBlock::kBytes;
    j = int(kb % 8);
    ql = blk + Q6KBlock::kQl + Q6KBlock::kQuadPer32 * j;
    qh = ql + Q6KBlock::kQlPer32;
  }
};

// Every supported quantized type has a panel layout of its own. (Q2_K and Q3_K were converted
// to Q8_0 at load until 2026-12-06: Q3_K exactly, Q2_K requantized, its min per 16 k, at 3.2x
// its bytes. Q3_K as Q6_K, the same values in 210 bytes per 256, measured prefill 0.88-0.90x,
// decode 1.03-1.08x: not kept.)
// MXFP4's GGUF rows (a weight not prepared) run in their GEMM form: rows (n_rows, K) of MXFP4
// (row_bytes apart) -> out: the same rows in Q8_0, GGUF rows (row_bytes(Q8_0, K) apart), exact
// where the block scale 2^(e - 128) is an f16 (e - 128 in [-24, 15]: (2^(e - 128), kvalues[q]));
// (+0, 0) for e < 104 (tiny scales: their values, |w| <= 12 * 2^-25, become 0) and all-zero
// blocks, as they pack natively; a block the loader refuses (blocks::mxfp4_refused: e = 255, or
// e >= 144 and not all zeros) fails. Returns how many 32-blocks hold exactly the source values.
int64_t convert_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
                     uint8_t* out);

// The f16 bits of MXFP4's block scale 2^(e - 128) where it is an f16 (normal or subnormal:
// e - 128 in [-24, 15]), else 0.
uint16_t mxfp4_f16_scale(uint8_t e);
// Fails if rows (n_rows, K) of type t hold a block the panel layout cannot take: MXFP4's refused
// blocks (e = 255; e >= 144, 2^16 and up, with a nonzero value: beyond f16), rather than
// computing inf or wrong values. (A block scale below f16, e < 104, 2^(e - 128) < 2^-24, packs
// as +0: its values, |w| <= 12 * 2^-25, as 0, what Q8_0's f16 d would round them to.)
void check_packable(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K);

// Weight types multiplied on the integer path.
inline bool is_level_type(GGMLType t);
inline bool is_levels16_layout(GGMLType t) { return t == GGMLType::Q3_K || iq::has_level16_form(t); }
inline bool is_int_type(GGMLType t) {
  return t == GGMLType::Q8_0 || t == GGMLType::Q4_0 || t == GGMLType::Q5_0 || t == GGMLType::Q4_1 ||
         t == GGMLType::Q5_1 || t == GGMLType::Q4_K || t == GGMLType::Q5_K || t == GGMLType::Q6_K ||
         t == GGMLType::Q2_K || is_level_type(t) || is_levels16_layout(t);
}
// Integer-path types with a scale per 16 k (the two halves of each 32-block: I = sc_0 I_0 +
// sc_1 I_1): Q6_K and the levels16 layout. Their decoders give a half block's 4 quads at once
// (kSub16 decoders) and their GEMM chunks are their own (unpack_sub16, mk_sub16), but Q3_K's
// (gemm_type: Q8_0's form, unpack_sub16<true>). (Q2_K's GEMV decodes half blocks too, kSub16,
// but it is not one of these: its min term (kMin16) has no place in their chunks, so its chunk
// is Q4_K's form; the sub16 chunk code static_asserts !kMin16.)
inline bool is_sub16_type(GGMLType t) { return t == GGMLType::Q6_K || is_levels16_layout(t); }
// Integer-path types whose nibble is an index into a table of int8 levels (above): MXFP4 and
// IQ4_NL (Q4_0's layout), and the levels layout's.
// The ternary types (values (q - 1) d, d the block's last 2 bytes), in the levels layout.
constexpr bool is_ternary(GGMLType t) { return t == GGMLType::TQ1_0 || t == GGMLType::TQ2_0; }
inline bool is_levels_layout(GGMLType t) { return t == GGMLType::IQ4_XS || is_ternary(t) || iq::has_level_form(t); }
inline bool is_level_type(GGMLType t) {
  return t == GGMLType::MXFP4 || t == GGMLType::IQ4_NL || is_levels_layout(t);
}
// A level type's (or a levels16 type's) 16 levels, their largest magnitude, and the unit of the
// levels layouts' scales (w = d sc unit levels[q]).
constexpr const int8_t* level_values(GGMLType t) {
  return t == GGMLType::MXFP4                             ? blocks::kValuesMXFP4
         : t == GGMLType::IQ4_NL || t == GGMLType::IQ4_XS ? blocks::kValuesIQ4NL
         : is_ternary(t)                                  ? blocks::kValuesTernary
         : t == GGMLType::Q3_K                            ? blocks::kValuesQ3KNeg
                                                          : iq::level_values(t);
}
constexpr int max_abs_level(GGMLType t) {
  int m = 0;
  for (int i = 0; i < 16; ++i) {
    const int v = level_values(t)[i] < 0 ? -level_values(t)[i] : level_values(t)[i];
    if (v > m) m = v;
  }
  return m;
}
// Whether a type's levels are all among its first kFields3Levels (level_index gives the first
// index of a level): a 3-bit index suffices.
constexpr bool levels_fit_3_bits(GGMLType t) {
  for (int i = kFields3Levels; i < 16; ++i) {
    bool seen = false;
    for (int j = 0; j < kFields3Levels; ++j) seen = seen || level_values(t)[j] == level_values(t)[i];
    if (!seen) return false;
  }
  return true;
}
// The levels layout's types with 3-bit indices (the levels3 layout): those with at most 8 levels
// (levels_fit_3_bits: static_asserts in pack.cpp and the decoders).
constexpr bool is_levels3_layout(GGMLType t) { return t == GGMLType::IQ2_XXS || t == GGMLType::IQ1_S || is_ternary(t); }
// B where a levels16 type's levels are its indices minus B (Q3_K's: i - 3), so that its
// decoders take the index itself as u = v + B, with no table; else -1.
constexpr int levels16_index_bias(GGMLType t) {
  const int b = -level_values(t)[0];
  for (int i = 0; i < kFields3Levels; ++i)
    if (level_values(t)[i] != i - b) return -1;
  return b;
}
constexpr float level_unit(GGMLType t) {
  return t == GGMLType::IQ4_XS || is_ternary(t) || t == GGMLType::Q3_K ? 1.0f : iq::level_unit(t);
}
// Integer-path types with a min term per 32-block (s2: w = v * s1 + s2).
inline bool has_min_term(GGMLType t) {
  return t == GGMLType::Q4_K || t == GGMLType::Q5_K || t == GGMLType::Q4_1 || t == GGMLType::Q5_1;
}
// Q2_K's min term, one min per 16 k: b_0 f_0 + b_1 f_1 (above). Its GEMM chunk (unpack_int)
// holds the min scales (float b_h, [len / 32][2][16 rows]: q2k_min_scales_int16s(len) int16s)
// after its values, at V + len * kGroup int16s (past the largest chunk form, the scalar pair
// layout's). (SIMD code stores and loads them as vectors; scalar code copies them, memcpy.)
inline bool has_min16(GGMLType t) { return t == GGMLType::Q2_K; }
constexpr int64_t q2k_min_scales_int16s(int64_t len) { return len / kQBlock * 2 * kGroup * 2; }
inline float* q2k_min_scales(int16_t* V, int64_t len) { return reinterpret_cast<float*>(V + len * kGroup); }
inline const float* q2k_min_scales(const int16_t* V, int64_t len) { return reinterpret_cast<const float*>(V + len * kGroup); }
// The type whose unpacked GEMM chunk (unpack_int) and micro-kernels (mk_int) t uses: the level
// types', Q5_0's and Q3_K's chunk is Q8_0's, Q4_1's Q4_K's, Q5_1's Q5_K's (above), every other
// type its own.
inline GGMLType gemm_type(GGMLType t) {
  return is_level_type(t) || t == GGMLType::Q5_0 || t == GGMLType::Q3_K ? GGMLType::Q8_0
         : t == GGMLType::Q4_1                   ? GGMLType::Q4_K
         : t == GGMLType::Q5_1                   ? GGMLType::Q5_K
                                                 : t;
}

int64_t block_len(GGMLType t);           // elements per block along K (type_traits)
uint64_t packed_block_bytes(GGMLType t);  // bytes of one block of a group (16 rows)
inline uint64_t group_bytes(GGMLType t, int64_t K) { return uint64_t(K / block_len(t)) * packed_block_bytes(t); }
inline int64_t n_groups(int64_t n_rows) { return (n_rows + kGroup - 1) / kGroup; }

// rows (n_rows, K) in GGUF row layout (row_bytes apart) -> out (n_groups * group_bytes).
void pack_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
               uint8_t* out);
// The quad types: Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, the level types, Q4_K and Q5_K (their kernels
// read whole 32-blocks of quads). pack_rows_quad gives their quad variant (the levels3 layout's
// types: their one layout), pack_rows every other type.
bool is_quad_type(GGMLType t);
void pack_rows_quad(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
                    uint8_t* out);
// Q6_K rows in its quad variant (t must be Q6_K).
void pack_rows_q6k_quad(const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K, uint8_t* out);
// Wp (len, 16) = the f32 weights of one group of a float type (F32/F16/BF16) at k in
// [k0, k0 + len). Portable; the reference for the AVX2 version.
void unpack_group(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, float* Wp);
// The integer path's view of one group of a quantized type at k in [k0, k0 + len) (k0, len
// multiples of kQBlock): V (len / 32, 16 pairs, 16 rows, 2) int16, S1 and S2 (len / 32, 16);
// Q2_K's min scales after V (q2k_min_scales).
void unpack_group_int(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, int16_t* V,
                      float* S1, float* S2);

}  // namespace ft::cpu
