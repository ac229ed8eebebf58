// Repacking GGUF rows into the panel layout (packed.h), and its portable unpacker.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/cpu/packed.h"
#include "kernels/quant.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_iq.h"

namespace ft::cpu {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
float f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

// Element e (< block_len) of a Q4_K block: its 4-bit q and 32-wide sub-block.
int q4k_q(const blocks::Q4_K& b, int e) {
  const uint8_t byte = b.qs[(e / 64) * 32 + e % 32];
  return (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
}
// Element e (< 32) of the 16 bytes of nibbles of a 32-block in ggml's Q4_0 order (Q4_0, MXFP4,
// IQ4_NL, each 32-block of IQ4_XS): elements 0-15 in the low nibbles, 16-31 in the high ones.
int nib32(const uint8_t* qs, int e) { return e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4); }
// Element e of a Q6_K block: its unsigned 6-bit q (ggml's layout, see dequant_q6_k).
int q6k_q(const blocks::Q6_K& b, int e) {
  const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
  const uint8_t lo = b.ql[half * 64 + (quarter & 1) * 32 + l];
  const int nib = quarter < 2 ? (lo & 0xF) : (lo >> 4);
  const int hi = (b.qh[half * 32 + l] >> (2 * quarter)) & 3;
  return nib | (hi << 4);
}

}  // namespace

uint16_t mxfp4_f16_scale(uint8_t e) {
  const float d = blocks::e8m0_to_fp32_half(e);  // 2^(e - 128)
  const uint16_t h = f32_to_f16(d);
  return f16_to_f32(h) == d ? h : 0;  // an f16 for e - 128 in [-24, 15]
}

namespace {
// The f16 scale MXFP4 block b is multiplied with, in its own packed layout and in its Q8_0
// conversion: 2^(e - 128) where that is an f16 (e in [104, 143]); +0 below (e < 104: 2^(e - 128)
// under f16's least subnormal 2^-24, every |value| <= 12 * 2^-25, which Q8_0's f16 d rounds to 0
// too) and for an all-zero block with any other e; fails on the blocks refused at load
// (blocks::mxfp4_refused: e = 255, or e >= 144 with a nonzero value).
uint16_t mxfp4_packed_scale(const blocks::MXFP4& b) {
  if (blocks::mxfp4_refused(b))
    fail("MXFP4: a block with scale exponent e = ", int(b.e),
         b.e == 255 ? " (NaN in the MX format)" : cat(" (2^", int(b.e) - 128, ": beyond f16, which ends at 2^15)"),
         " and nonzero values: refused (the model loader names its tensor)");
  return mxfp4_f16_scale(b.e);  // (0 for e < 104 and the all-zero rest)
}
}  // namespace

void check_packable(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K) {
  if (t != GGMLType::MXFP4) return;
  for (int64_t n = 0; n < n_rows; ++n) {
    const auto* b = reinterpret_cast<const blocks::MXFP4*>(rows + uint64_t(n) * row_bytes);
    for (int64_t i = 0; i < K / 32; ++i) mxfp4_packed_scale(b[i]);  // (fails on a refused block)
  }
}

int64_t convert_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
                     uint8_t* out) {
  if (t != GGMLType::MXFP4) fail("convert_rows: ", type_traits(t).name, " has a panel layout of its own");
  if (K % 32 != 0) fail("convert_rows: K = ", K, " is not a multiple of MXFP4's block size 32");
  int64_t exact = 0;
  for (int64_t n = 0; n < n_rows; ++n) {
    const auto* b = reinterpret_cast<const blocks::MXFP4*>(rows + uint64_t(n) * row_bytes);
    auto* q8 = reinterpret_cast<blocks::Q8_0*>(out + uint64_t(n) * uint64_t(K / 32) * sizeof(blocks::Q8_0));
    for (int64_t ib = 0; ib < K / 32; ++ib) {
      const uint16_t h = mxfp4_packed_scale(b[ib]);  // (fails on a refused block)
      blocks::Q8_0& o = q8[ib];
      o = blocks::Q8_0{};  // (h = 0: +0 and q = 0, as packed natively; exact only for an all-zero block)
      if (h == 0) {
        exact += blocks::mxfp4_is_zero(b[ib]);
        continue;
      }
      std::memcpy(o.d, &h, 2);
      for (int j = 0; j < 32; ++j) o.qs[j] = blocks::kValuesMXFP4[nib32(b[ib].qs, j)];
      ++exact;
    }
  }
  return exact;
}

int64_t block_len(GGMLType t) {
  if (!is_supported_weight_type(t)) fail("panel layout: unsupported weight type ", int(t));
  return int64_t(type_traits(t).block_size);
}

uint64_t packed_block_bytes(GGMLType t) {
  switch (t) {
    case GGMLType::F32: return 16 * 4;
    case GGMLType::F16: case GGMLType::BF16: return 16 * 2;
    case GGMLType::Q8_0: return 32 + 32 * 16;
    case GGMLType::Q4_0: case GGMLType::MXFP4: case GGMLType::IQ4_NL: return 32 + 32 * 8;
    case GGMLType::Q5_0: return Q50Block::kBytes;
    case GGMLType::Q4_1: return Q41Block::kBytes;
    case GGMLType::Q5_1: return Q51Block::kBytes;
    case GGMLType::IQ4_XS: case GGMLType::IQ2_XXS: case GGMLType::IQ3_XXS: case GGMLType::IQ3_S:
    case GGMLType::IQ1_S: case GGMLType::TQ1_0: case GGMLType::TQ2_0:
      return is_levels3_layout(t) ? Levels3Block::kBytes : LevelsBlock::kBytes;
    case GGMLType::IQ2_XS: case GGMLType::IQ2_S: case GGMLType::IQ1_M: case GGMLType::Q3_K: return Levels16Block::kBytes;
    case GGMLType::Q4_K: return Q4KBlock::kBytes;
    case GGMLType::Q5_K: return Q5KBlock::kBytes;
    case GGMLType::Q6_K: return Q6KBlock::kBytes;
    case GGMLType::Q2_K: return Q2KBlock::kBytes;
    default: fail("panel layout: unsupported weight type ", int(t));
  }
}

// Byte offsets inside a quantized block of a group (packed.h): element e (< block_len) of row r.
namespace {
// Q8_0 q: pairs of k side by side per row.
inline int q8_at(int e, int r) { return (e / 2) * 32 + r * 2 + e % 2; }
// 4-bit q (Q4_0, Q4_K, Q6_K low bits): byte of the pair-interleaved nibbles, and the shift.
inline int nib_at(int e, int r) { return (e / 2) * 16 + (r % 8) * 2 + e % 2; }
inline int nib_shift(int r) { return r < 8 ? 0 : 4; }
// Q5_K's 5th bit of element e (< 256), row r (both variants): byte and bit in its plane (Q5_0's
// the same plane after its 32-block's nibbles).
inline int q5h_at(int e, int r) { return Q5KBlock::kQh + (e / 32) * Q5KBlock::kQhPer32 + r * 4 + e % 4; }
inline int q50h_at(int e, int r) { return Q50Block::kQh + r * 4 + e % 4; }
inline int q51h_at(int e, int r) { return Q51Block::kQh + r * 4 + e % 4; }
inline int q5h_bit(int e) { return (e % 32) / 4; }
// Row r's d, dmin and unpacked 6-bit scales and mins of a Q4_K or Q5_K block b (Q4KBlock offsets).
template <class B>
void pack_k_header(const B& b, int r, uint8_t* blk) {
  std::memcpy(blk + Q4KBlock::kD + 2 * r, b.d, 2);
  std::memcpy(blk + Q4KBlock::kDmin + 2 * r, b.dmin, 2);
  for (int s = 0; s < 8; ++s) {
    uint8_t sc, m;
    blocks::scale_min_k4(s, b.scales, sc, m);
    blk[Q4KBlock::kSc + s * 16 + r] = sc;
    blk[Q4KBlock::kM + s * 16 + r] = m;
  }
}
// A 256-block of a type in the levels layout (packed.h) as it packs: its f16 d, the scale sc of
// each 32-block and each element's level index.
struct Levels256 {
  uint8_t d[2];
  int8_t sc[8];
  uint8_t idx[256];
};
// The 256 values of block blk of a levels-layout type (not IQ4_XS) or a levels16 one under
// d = 1 (exact; the grid types' d as iq::with_unit_d sets it).
void unit_d_values(GGMLType t, const uint8_t* blk, float* w) {
  uint8_t one[sizeof(blocks::IQ3_S)];
  const uint64_t bb = type_traits(t).type_size;
  if (bb > sizeof one) fail("levels layout: ", type_traits(t).name, " blocks are larger than ", sizeof one, " bytes");
  if (is_ternary(t)) {
    std::memcpy(one, blk, bb);
    const uint16_t f16_one = f32_to_f16(1.0f);
    std::memcpy(one + bb - 2, &f16_one, 2);  // (d last)
  } else {
    iq::with_unit_d(t, blk, one);
  }
  dequantize_row(t, one, w, 256);
}
// The index into level_values(t) of value v (under d = 1) of a sub-block of step `step`; fails
// if v is off the levels.
uint8_t level_index(GGMLType t, float v, int step) {
  const float l = v / (float(step) * level_unit(t));
  const int8_t* levels = level_values(t);
  for (int i = 0; i < 16; ++i)
    if (float(levels[i]) == l) return uint8_t(i);
  fail("levels layout: ", type_traits(t).name, " value ", l, " is not among its levels");
}
Levels256 levels256(GGMLType t, const uint8_t* blk) {
  Levels256 o{};
  const bool ternary = is_ternary(t);
  std::memcpy(o.d, blk + (ternary ? type_traits(t).type_size - 2 : 0), 2);  // (the ternary types' d last, the others' first)
  if (t == GGMLType::IQ4_XS) {
    const auto& b = *reinterpret_cast<const blocks::IQ4_XS*>(blk);
    for (int s = 0; s < 8; ++s) o.sc[s] = int8_t(blocks::scale_iq4xs(b, s) - 32);
    for (int e = 0; e < 256; ++e) o.idx[e] = uint8_t(nib32(b.qs + 16 * (e / 32), e % 32));
    return o;
  }
  // The grid types: the block's values under d = 1 (exact: (2s + 1) unit v), over each 32-block's
  // step (2s + 1) unit, are its integer levels v; the ternary types' values under d = 1 are
  // their levels, step 1.
  float w[256];
  unit_d_values(t, blk, w);
  for (int s = 0; s < 8; ++s) {
    const int step = ternary ? 1 : iq::step32(t, blk, s);
    o.sc[s] = int8_t(step);
    for (int e = 32 * s; e < 32 * s + 32; ++e) o.idx[e] = level_index(t, w[e], step);
  }
  return o;
}
// A 256-block of a type in the levels16 layout (packed.h) as it packs: its f16 d, the scale
// of each 16 elements (the grid types' step 2s + 1), each element's index into level_values(t).
struct Levels16 {
  uint8_t d[2];
  int8_t sc[16];
  uint8_t idx[256];
};
// (level_index gives the first index of a level: every levels16 and levels3 type's are 3-bit,
// and is_levels3_layout takes every levels-layout type that fits.)
static_assert(levels_fit_3_bits(GGMLType::Q3_K) && levels_fit_3_bits(GGMLType::IQ2_XS) &&
              levels_fit_3_bits(GGMLType::IQ2_S) && levels_fit_3_bits(GGMLType::IQ1_M));
static_assert([] {
  for (GGMLType t : {GGMLType::IQ4_XS, GGMLType::IQ2_XXS, GGMLType::IQ3_XXS, GGMLType::IQ3_S, GGMLType::IQ1_S,
                     GGMLType::TQ1_0, GGMLType::TQ2_0})
    if (is_levels3_layout(t) != levels_fit_3_bits(t)) return false;
  return true;
}());
Levels16 levels16(GGMLType t, const uint8_t* blk) {
  Levels16 o{};
  if (t == GGMLType::Q3_K) {  // (-d, sc - 32, i = 3 - q: blocks::kValuesQ3KNeg)
    const auto& b = *reinterpret_cast<const blocks::Q3_K*>(blk);
    const uint16_t neg_d = uint16_t(load_u16(b.d) ^ 0x8000);
    std::memcpy(o.d, &neg_d, 2);
    for (int h = 0; h < 16; ++h) o.sc[h] = int8_t(blocks::scale_k3(h, b.scales) - 32);
    for (int e = 0; e < 256; ++e) o.idx[e] = uint8_t(3 - blocks::q3k_q(b, e));
    return o;
  }
  const uint16_t d = t == GGMLType::IQ1_M ? blocks::iq1m_d_bits(*reinterpret_cast<const blocks::IQ1_M*>(blk)) : load_u16(blk);
  std::memcpy(o.d, &d, 2);
  float w[256];
  unit_d_values(t, blk, w);
  for (int h = 0; h < 16; ++h) {
    const int step = iq::step16(t, blk, h);
    o.sc[h] = int8_t(step);
    for (int e = 16 * h; e < 16 * h + 16; ++e) o.idx[e] = level_index(t, w[e], step);
  }
  return o;
}
// Q6_K high 2 bits h: one uint16 lane L = (r % 8) * 2 + e % 2 per 4 pairs of k (32 bytes),
// pair p % 4 at bits 4 (p % 4) (row r % 8) and 4 (p % 4) + 2 (row r % 8 + 8).
inline int qh_lane(int e, int r) { return (e / 8) * 16 + (r % 8) * 2 + e % 2; }
inline int qh_shift(int e, int r) { return 4 * ((e / 2) % 4) + (r < 8 ? 0 : 2); }
inline int q6k_high(const uint8_t* qh, int e, int r) {
  uint16_t lane;
  std::memcpy(&lane, qh + 2 * qh_lane(e, r), 2);
  return (lane >> qh_shift(e, r)) & 3;
}
// Q2_K's q of element e (< 256), row r: byte and shift (packed.h: k = 16h + 4t + e').
inline int q2k_at(int e, int r) { return Q2KBlock::kQ + (e / 16) * 64 + r * 4 + e % 4; }
inline int q2k_shift(int e) { return 2 * ((e % 16) / 4); }
// The 3-bit index of element e (< 256), row r of a block B (the levels16 and levels3 layouts,
// packed.h): its low field's byte (shift q2k_shift(e), as Q2_K's), its high bit's byte and bit.
template <class B>
int f3_low_at(int e, int r) { return B::kQ + (e / 32) * kFields3Per32 + ((e % 32) / 16) * 64 + r * 4 + e % 4; }
template <class B>
int f3_high_at(int e, int r) { return B::kQ + (e / 32) * kFields3Per32 + kFields3Low + r * 4 + e % 4; }
inline int f3_high_bit(int e) { return (e % 32) / 4; }  // (4h + t)
template <class B>
int f3_index(const uint8_t* blk, int e, int r) {
  return ((blk[f3_low_at<B>(e, r)] >> q2k_shift(e)) & 3) | ((blk[f3_high_at<B>(e, r)] >> f3_high_bit(e)) & 1) << 2;
}
template <class B>
void set_f3_index(uint8_t* blk, int e, int r, int i) {  // (i < kFields3Levels; blk's bits start clear)
  blk[f3_low_at<B>(e, r)] |= uint8_t((i & 3) << q2k_shift(e));
  blk[f3_high_at<B>(e, r)] |= uint8_t((i >> 2) << f3_high_bit(e));
}
// The unsigned 6-bit q of element e, row r of a Q6_K block in the pair layout.
inline int q6k_pair_q(const uint8_t* blk, int e, int r) {
  return ((blk[Q6KBlock::kQl + nib_at(e, r)] >> nib_shift(r)) & 0xF) | (q6k_high(blk + Q6KBlock::kQh, e, r) << 4);
}
}  // namespace

void pack_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
               uint8_t* out) {
  const int64_t bl = block_len(t);
  if (K % bl != 0) fail("panel layout: K = ", K, " is not a multiple of the block length ", bl);
  const uint64_t bb = packed_block_bytes(t), gb = group_bytes(t, K);
  const int64_t G = n_groups(n_rows), nb = K / bl;
  std::memset(out, 0, size_t(gb * uint64_t(G)));
  for (int64_t g = 0; g < G; ++g) {
    for (int r = 0; r < kGroup; ++r) {
      const int64_t n = g * kGroup + r;
      if (n >= n_rows) break;  // padding rows stay zero (their outputs are never stored)
      const uint8_t* row = rows + uint64_t(n) * row_bytes;
      for (int64_t ib = 0; ib < nb; ++ib) {
        uint8_t* blk = out + uint64_t(g) * gb + uint64_t(ib) * bb;
        switch (t) {
          case GGMLType::F32:
            std::memcpy(blk + 4 * r, row + 4 * ib, 4);
            break;
          case GGMLType::F16: case GGMLType::BF16:
            std::memcpy(blk + 2 * r, row + 2 * ib, 2);
            break;
          case GGMLType::Q8_0: {
            const auto& b = reinterpret_cast<const blocks::Q8_0*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            for (int e = 0; e < 32; ++e) blk[32 + q8_at(e, r)] = uint8_t(b.qs[e]);
            break;
          }
          case GGMLType::Q4_0: {
            const auto& b = reinterpret_cast<const blocks::Q4_0*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            for (int e = 0; e < 32; ++e) blk[32 + nib_at(e, r)] |= uint8_t(nib32(b.qs, e) << nib_shift(r));
            break;
          }
          case GGMLType::Q5_0: {  // (as Q4_0, then the 5th bits)
            const auto& b = reinterpret_cast<const blocks::Q5_0*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            for (int e = 0; e < 32; ++e) {
              blk[Q50Block::kQ + nib_at(e, r)] |= uint8_t(nib32(b.qs, e) << nib_shift(r));
              blk[q50h_at(e, r)] |= uint8_t(blocks::q5_high(b.qh, e) << q5h_bit(e));
            }
            break;
          }
          case GGMLType::Q4_1: case GGMLType::Q5_1: {  // (d, m, q as Q4_0's; Q5_1's 5th bits as Q5_0's)
            const bool five = t == GGMLType::Q5_1;
            const uint8_t* d = five ? reinterpret_cast<const blocks::Q5_1*>(row)[ib].d : reinterpret_cast<const blocks::Q4_1*>(row)[ib].d;
            const uint8_t* m = five ? reinterpret_cast<const blocks::Q5_1*>(row)[ib].m : reinterpret_cast<const blocks::Q4_1*>(row)[ib].m;
            const uint8_t* qs = five ? reinterpret_cast<const blocks::Q5_1*>(row)[ib].qs : reinterpret_cast<const blocks::Q4_1*>(row)[ib].qs;
            std::memcpy(blk + Q41Block::kD + 2 * r, d, 2);
            std::memcpy(blk + Q41Block::kM + 2 * r, m, 2);
            for (int e = 0; e < 32; ++e) {
              blk[Q41Block::kQ + nib_at(e, r)] |= uint8_t(nib32(qs, e) << nib_shift(r));
              if (five) blk[q51h_at(e, r)] |= uint8_t(blocks::q5_high(reinterpret_cast<const blocks::Q5_1*>(row)[ib].qh, e) << q5h_bit(e));
            }
            break;
          }
          case GGMLType::IQ4_NL: {  // (as Q4_0)
            const auto& b = reinterpret_cast<const blocks::IQ4_NL*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            for (int e = 0; e < 32; ++e) blk[32 + nib_at(e, r)] |= uint8_t(nib32(b.qs, e) << nib_shift(r));
            break;
          }
          case GGMLType::IQ4_XS: case GGMLType::IQ2_XXS: case GGMLType::IQ3_XXS: case GGMLType::IQ3_S:
          case GGMLType::IQ1_S: case GGMLType::TQ1_0: case GGMLType::TQ2_0: {
            const Levels256 L = levels256(t, row + uint64_t(ib) * type_traits(t).type_size);
            std::memcpy(blk + LevelsBlock::kD + 2 * r, L.d, 2);
            for (int s = 0; s < 8; ++s) blk[LevelsBlock::kSc + s * 16 + r] = uint8_t(L.sc[s]);
            for (int e = 0; e < 256; ++e)  // (levels3: L.idx[e] < 8, levels_fit_3_bits)
              if (is_levels3_layout(t)) set_f3_index<Levels3Block>(blk, e, r, L.idx[e]);
              else blk[LevelsBlock::kQ + nib_at(e, r)] |= uint8_t(L.idx[e] << nib_shift(r));
            break;
          }
          case GGMLType::IQ2_XS: case GGMLType::IQ2_S: case GGMLType::IQ1_M: case GGMLType::Q3_K: {
            const Levels16 L = levels16(t, row + uint64_t(ib) * type_traits(t).type_size);
            std::memcpy(blk + Levels16Block::kD + 2 * r, L.d, 2);
            for (int h = 0; h < 16; ++h) blk[Levels16Block::kSc + h * 16 + r] = uint8_t(L.sc[h]);
            for (int e = 0; e < 256; ++e) set_f3_index<Levels16Block>(blk, e, r, L.idx[e]);
            break;
          }
          case GGMLType::MXFP4: {  // (as Q4_0, its f16 scale in d)
            const auto& b = reinterpret_cast<const blocks::MXFP4*>(row)[ib];
            const uint16_t h = mxfp4_packed_scale(b);
            std::memcpy(blk + 2 * r, &h, 2);
            for (int e = 0; h != 0 && e < 32; ++e)  // (a +0 scale's block packed as zeros)
              blk[32 + nib_at(e, r)] |= uint8_t(nib32(b.qs, e) << nib_shift(r));
            break;
          }
          case GGMLType::Q4_K: {
            const auto& b = reinterpret_cast<const blocks::Q4_K*>(row)[ib];
            pack_k_header(b, r, blk);
            for (int e = 0; e < 256; ++e) blk[Q4KBlock::kQ + nib_at(e, r)] |= uint8_t(q4k_q(b, e) << nib_shift(r));
            break;
          }
          case GGMLType::Q5_K: {
            const auto& b = reinterpret_cast<const blocks::Q5_K*>(row)[ib];
            pack_k_header(b, r, blk);
            for (int e = 0; e < 256; ++e) {
              const int v = blocks::q5k_q(b, e);
              blk[Q5KBlock::kQ + nib_at(e, r)] |= uint8_t((v & 0xF) << nib_shift(r));
              blk[q5h_at(e, r)] |= uint8_t((v >> 4) << q5h_bit(e));
            }
            break;
          }
          case GGMLType::Q6_K: {
            const auto& b = reinterpret_cast<const blocks::Q6_K*>(row)[ib];
            std::memcpy(blk + Q6KBlock::kD + 2 * r, b.d, 2);
            for (int s = 0; s < 16; ++s) blk[Q6KBlock::kSc + s * 16 + r] = uint8_t(b.scales[s]);
            uint8_t* ql = blk + Q6KBlock::kQl;
            uint8_t* qh = blk + Q6KBlock::kQh;
            for (int e = 0; e < 256; ++e) {
              const int q = q6k_q(b, e);
              ql[nib_at(e, r)] |= uint8_t((q & 0xF) << nib_shift(r));
              uint16_t lane;
              std::memcpy(&lane, qh + 2 * qh_lane(e, r), 2);
              lane = uint16_t(lane | (q >> 4) << qh_shift(e, r));
              std::memcpy(qh + 2 * qh_lane(e, r), &lane, 2);
            }
            break;
          }
          case GGMLType::Q2_K: {
            const auto& b = reinterpret_cast<const blocks::Q2_K*>(row)[ib];
            std::memcpy(blk + Q2KBlock::kD + 2 * r, b.d, 2);
            std::memcpy(blk + Q2KBlock::kDmin + 2 * r, b.dmin, 2);
            for (int h = 0; h < 16; ++h) blk[Q2KBlock::kSm + h * kGroup + r] = b.scales[h];
            for (int e = 0; e < 256; ++e) blk[q2k_at(e, r)] |= uint8_t(blocks::q2k_q(b, e) << q2k_shift(e));
            break;
          }
          default:
            fail("panel layout: unsupported weight type ", int(t));
        }
      }
    }
  }
}

bool is_quad_type(GGMLType t) {
  return t == GGMLType::Q8_0 || t == GGMLType::Q4_0 || t == GGMLType::Q5_0 || t == GGMLType::Q4_1 ||
         t == GGMLType::Q5_1 || t == GGMLType::Q4_K || t == GGMLType::Q5_K || is_level_type(t);
}

namespace {
// The quad variant (packed.h): element e of a 32-block of row r. Q8_0: its byte; nibble types:
// its byte and shift.
inline int quad_at(int e, int r) { return (e / 4) * 64 + r * 4 + e % 4; }
inline int qnib_at(int e, int r) { return (e / 8) * 64 + r * 4 + e % 4; }
inline int qnib_shift(int e) { return e % 8 < 4 ? 0 : 4; }
}  // namespace

void pack_rows_quad(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
                    uint8_t* out) {
  if (!is_quad_type(t) || is_levels3_layout(t)) return pack_rows(t, rows, row_bytes, n_rows, K, out);
  // The scales (and the 256-blocks' headers, Q5_K's 5th bits) are where the pair layout has
  // them; only q (the low 4 bits) moves.
  pack_rows(t, rows, row_bytes, n_rows, K, out);
  const int64_t bl = block_len(t);
  const uint64_t bb = packed_block_bytes(t), gb = group_bytes(t, K);
  const int64_t G = n_groups(n_rows), nb = K / bl;
  const uint64_t q_off = t == GGMLType::Q4_K || t == GGMLType::Q5_K ? Q4KBlock::kQ  // q bytes inside a block
                         : is_levels_layout(t)                       ? LevelsBlock::kQ
                         : t == GGMLType::Q4_1 || t == GGMLType::Q5_1 ? Q41Block::kQ
                                                                     : 32;
  const uint64_t q_bytes = uint64_t(bl) * kGroup / (t == GGMLType::Q8_0 ? 1 : 2);
  std::vector<uint8_t> q(q_bytes);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t ib = 0; ib < nb; ++ib) {
      uint8_t* blk = out + uint64_t(g) * gb + uint64_t(ib) * bb;
      std::memset(q.data(), 0, q.size());
      for (int r = 0; r < kGroup; ++r)
        for (int e = 0; e < bl; ++e) {
          const int s = e / 32, k = e % 32;  // 32-block s of the block, k inside it
          uint8_t* qs = q.data() + s * (t == GGMLType::Q8_0 ? 512 : 256);
          if (t == GGMLType::Q8_0)
            qs[quad_at(k, r)] = uint8_t(blk[32 + q8_at(e, r)] ^ 0x80);  // q + 128
          else
            qs[qnib_at(k, r)] |= uint8_t(((blk[q_off + nib_at(e, r)] >> nib_shift(r)) & 0xF) << qnib_shift(k));
        }
      std::memcpy(blk + q_off, q.data(), q.size());
    }
}

void pack_rows_q6k_quad(const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K, uint8_t* out) {
  constexpr GGMLType t = GGMLType::Q6_K;
  pack_rows(t, rows, row_bytes, n_rows, K, out);  // (d and sc stay; the bits move)
  const uint64_t gb = group_bytes(t, K);
  const int64_t G = n_groups(n_rows), nb = K / block_len(t);
  constexpr int kBits = Q6KBlock::kBytes - Q6KBlock::kQl;
  uint8_t q[kBits];
  for (int64_t g = 0; g < G; ++g)
    for (int64_t ib = 0; ib < nb; ++ib) {
      uint8_t* blk = out + uint64_t(g) * gb + uint64_t(ib) * Q6KBlock::kBytes;
      std::memset(q, 0, sizeof q);
      for (int r = 0; r < kGroup; ++r)
        for (int e = 0; e < 256; ++e) {
          const int v = q6k_pair_q(blk, e, r);
          const int s = e / 32, k = e % 32;  // 32-block s, k inside it
          uint8_t* qs = q + s * Q6KBlock::kQuadPer32;
          qs[qnib_at(k, r)] |= uint8_t((v & 0xF) << qnib_shift(k));
          qs[Q6KBlock::kQlPer32 + (k / 16) * 64 + r * 4 + k % 4] |=
              uint8_t((v >> 4) << (2 * ((k / 4) % 4)));
        }
      std::memcpy(blk + Q6KBlock::kQl, q, sizeof q);
    }
}

namespace {
// Row r, element e of a quantized block: the integer weight v and the float scales of the
// integer path (packed.h): w = v * s1 (+ s2 for the min types, has_min_term: it multiplies sum x;
// Q2_K's: the min scale b_h of e's half block, which multiplies the half's sum).
struct IntWeight {
  int v;
  float s1, s2;
};
IntWeight int_weight(GGMLType t, const uint8_t* blk, int e, int r) {
  const auto nib = [&](const uint8_t* q) { return (q[nib_at(e, r)] >> nib_shift(r)) & 0xF; };
  switch (t) {
    case GGMLType::Q8_0: return {int(int8_t(blk[32 + q8_at(e, r)])), f16(blk + 2 * r), 0.0f};
    case GGMLType::Q4_0: return {nib(blk + 32) - 8, f16(blk + 2 * r), 0.0f};
    case GGMLType::Q5_0: return {nib(blk + Q50Block::kQ) + 16 * ((blk[q50h_at(e, r)] >> q5h_bit(e)) & 1) - 16, f16(blk + 2 * r), 0.0f};
    case GGMLType::Q4_1: case GGMLType::Q5_1: {
      const int h = t == GGMLType::Q5_1 ? (blk[q51h_at(e, r)] >> q5h_bit(e)) & 1 : 0;
      return {nib(blk + Q41Block::kQ) + 16 * h, f16(blk + Q41Block::kD + 2 * r), f16(blk + Q41Block::kM + 2 * r)};
    }
    case GGMLType::MXFP4: case GGMLType::IQ4_NL: return {int(level_values(t)[nib(blk + 32)]), f16(blk + 2 * r), 0.0f};
    case GGMLType::IQ4_XS: case GGMLType::IQ2_XXS: case GGMLType::IQ3_XXS: case GGMLType::IQ3_S:
    case GGMLType::IQ1_S: case GGMLType::TQ1_0: case GGMLType::TQ2_0:
      return {int(level_values(t)[is_levels3_layout(t) ? f3_index<Levels3Block>(blk, e, r) : nib(blk + LevelsBlock::kQ)]),
              f16(blk + LevelsBlock::kD + 2 * r) * float(int8_t(blk[LevelsBlock::kSc + (e / 32) * 16 + r])) * level_unit(t),
              0.0f};
    case GGMLType::IQ2_XS: case GGMLType::IQ2_S: case GGMLType::IQ1_M: case GGMLType::Q3_K:
      return {int(level_values(t)[f3_index<Levels16Block>(blk, e, r)]) * int(int8_t(blk[Levels16Block::kSc + (e / 16) * 16 + r])),
              f16(blk + Levels16Block::kD + 2 * r) * level_unit(t), 0.0f};
    case GGMLType::Q4_K: case GGMLType::Q5_K: {
      const int s = e / 32;
      const int h = t == GGMLType::Q5_K ? (blk[q5h_at(e, r)] >> q5h_bit(e)) & 1 : 0;
      return {nib(blk + Q4KBlock::kQ) + 16 * h, f16(blk + Q4KBlock::kD + 2 * r) * float(blk[Q4KBlock::kSc + s * 16 + r]),
              -(f16(blk + Q4KBlock::kDmin + 2 * r) * float(blk[Q4KBlock::kM + s * 16 + r]))};
    }
    case GGMLType::Q6_K: {
      return {(q6k_pair_q(blk, e, r) - 32) * int(int8_t(blk[Q6KBlock::kSc + (e / 16) * 16 + r])),
              f16(blk + Q6KBlock::kD + 2 * r), 0.0f};
    }
    case GGMLType::Q2_K: {
      const uint8_t sm = blk[Q2KBlock::kSm + (e / 16) * kGroup + r];
      return {(sm & 0xF) * ((blk[q2k_at(e, r)] >> q2k_shift(e)) & 3), f16(blk + Q2KBlock::kD + 2 * r),
              -(f16(blk + Q2KBlock::kDmin + 2 * r) * float(sm >> 4))};
    }
    default: fail("panel layout: ", int(t), " is not an integer-path type");
  }
}
}  // namespace

void unpack_group(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, float* Wp) {
  for (int64_t k = k0; k < k0 + len; ++k) {
    float* w = Wp + (k - k0) * kGroup;
    for (int r = 0; r < kGroup; ++r) {
      switch (t) {
        case GGMLType::F32: std::memcpy(&w[r], group + 64 * k + 4 * r, 4); break;
        case GGMLType::F16: w[r] = f16(group + 32 * k + 2 * r); break;
        case GGMLType::BF16: w[r] = bf16_to_f32(load_u16(group + 32 * k + 2 * r)); break;
        default: fail("panel layout: ", int(t), " is not a float type (quantized types: unpack_group_int)");
      }
    }
  }
}

void unpack_group_int(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, int16_t* V,
                      float* S1, float* S2) {
  const int64_t bl = block_len(t);
  const uint64_t bb = packed_block_bytes(t);
  for (int64_t k = k0; k < k0 + len; ++k) {
    const uint8_t* blk = group + uint64_t(k / bl) * bb;
    const int e = int(k % bl);
    const int64_t kb = (k - k0) / kQBlock, kk = (k - k0) % kQBlock;
    for (int r = 0; r < kGroup; ++r) {
      const IntWeight iw = int_weight(t, blk, e, r);
      V[kb * kQBlock * kGroup + (kk / 2) * 2 * kGroup + r * 2 + kk % 2] = int16_t(iw.v);
      if (kk == 0) {
        S1[kb * kGroup + r] = iw.s1;
        S2[kb * kGroup + r] = has_min16(t) ? 0.0f : iw.s2;
      }
      if (has_min16(t) && kk % 16 == 0)
        std::memcpy(q2k_min_scales(V, len) + (2 * kb + kk / 16) * kGroup + r, &iw.s2, 4);
    }
  }
}

}  // namespace ft::cpu
