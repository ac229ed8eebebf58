// Byte images of the ggml block formats (all members byte arrays: no padding, any alignment).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"

namespace ft::blocks {

constexpr int QK8_0 = 32;
constexpr int QK4_0 = 32;
constexpr int QK_K = 256;

struct Q8_0 {
  uint8_t d[2];  // f16
  int8_t qs[QK8_0];
};
struct Q4_0 {
  uint8_t d[2];           // f16
  uint8_t qs[QK4_0 / 2];  // elem j in the low nibble of qs[j], elem j+16 in the high nibble
};
struct Q4_K {
  uint8_t d[2];          // f16 super-block scale of the 6-bit scales
  uint8_t dmin[2];       // f16 super-block scale of the 6-bit mins
  uint8_t scales[12];    // 8 scales + 8 mins, 6 bits each (see scale_min_k4)
  uint8_t qs[QK_K / 2];  // per 64 elems: 32 bytes, low nibbles = first 32, high = next 32
};
struct Q6_K {
  uint8_t ql[QK_K / 2];      // low 4 bits
  uint8_t qh[QK_K / 4];      // high 2 bits
  int8_t scales[QK_K / 16];  // one per 16 elems
  uint8_t d[2];              // f16
};
struct Q4_1 {
  uint8_t d[2];           // f16 scale
  uint8_t m[2];           // f16 min (added)
  uint8_t qs[QK4_0 / 2];  // as Q4_0; x = d*q + m
};
struct Q5_0 {
  uint8_t d[2];           // f16
  uint8_t qh[4];          // bit j (little-endian u32) = 5th bit of elem j
  uint8_t qs[QK4_0 / 2];  // low 4 bits as Q4_0; x = d*(q-16)
};
struct Q5_1 {
  uint8_t d[2];           // f16
  uint8_t m[2];           // f16 min
  uint8_t qh[4];          // as Q5_0
  uint8_t qs[QK4_0 / 2];  // x = d*q + m
};
struct Q2_K {
  uint8_t scales[QK_K / 16];  // per 16 elems: low nibble scale, high nibble min
  uint8_t qs[QK_K / 4];       // per 128 elems: 32 bytes, 2-bit fields at shifts 0,2,4,6 = 4 rows of 32
  uint8_t d[2];               // f16 scale of the scales
  uint8_t dmin[2];            // f16 scale of the mins; x = d*sc*q - dmin*m
};
struct Q3_K {
  uint8_t hmask[QK_K / 8];  // high bit: elem 32j + l at bit j of hmask[l]
  uint8_t qs[QK_K / 4];     // low 2 bits, as Q2_K
  uint8_t scales[12];       // 16 scales of 6 bits (see scale_k3), biased by 32
  uint8_t d[2];             // f16; x = d*(sc-32)*(q-4), q 3-bit (high bit clear subtracts 4)
};
struct Q5_K {
  uint8_t d[2];
  uint8_t dmin[2];
  uint8_t scales[12];     // as Q4_K (scale_min_k4)
  uint8_t qh[QK_K / 8];   // 5th bit: elem 32j + l at bit j of qh[l]
  uint8_t qs[QK_K / 2];   // low 4 bits as Q4_K; x = d*sc*q - dmin*m
};
struct IQ4_NL {
  uint8_t d[2];           // f16
  uint8_t qs[QK4_0 / 2];  // nibble indices as Q4_0; x = d*kvalues_iq4nl[q]
};
struct IQ4_XS {
  uint8_t d[2];               // f16
  uint8_t scales_h[2];        // u16: bits 2j..2j+1 = high 2 bits of sub-block j's scale
  uint8_t scales_l[QK_K / 64];  // low 4 bits of sub-block j's scale at nibble j%2 of [j/2]
  uint8_t qs[QK_K / 2];       // per 32 elems: 16 bytes as IQ4_NL; x = d*(ls-32)*kvalues_iq4nl[q]
};
// MXFP4 (gpt-oss's experts): an E8M0 shared exponent and 32 FP4 (E2M1) values as 4-bit indices.
struct MXFP4 {
  uint8_t e;              // E8M0 scale exponent: the block's scale is 2^(e - 128) (e8m0_to_fp32_half)
  uint8_t qs[QK4_0 / 2];  // nibble indices as Q4_0; x = kValuesMXFP4[q] * 2^(e - 128)
};
// The i-quants on grids (iq_grids.h), 256 elements a block: each group of 8 elements (IQ3's: 4)
// is one grid entry, under a scale per 32 (or 16) elements and an f16 d per block. Signs per 8
// elements: 7 bits whose 8th is their parity (an even count of minus signs: ggml's ksigns_iq2xs)
// or 8 bits. IQ1's grid is signed, its values shifted by +-1/8 (kIQ1Delta).
struct IQ2_XXS {
  uint8_t d[2];
  uint8_t qs[64];  // per 32 elems 8 bytes: 4 grid indices (a byte per 8 elems), then a u32 with
                   // the 7 sign bits of group l at bits 7l and the scale s at bits 28-31:
                   // x = d * (0.5 + s) / 4 * grid * sign
};
struct IQ2_XS {
  uint8_t d[2];
  uint8_t qs[64];     // per 8 elems a u16: grid index (9 bits) | 7 sign bits << 9
  uint8_t scales[8];  // per 32 elems: the first 16's scale in the low nibble, the second 16's in
                      // the high one; x = d * (0.5 + s) / 4 * grid * sign
};
struct IQ2_S {
  uint8_t d[2];
  uint8_t qs[32];     // per 8 elems the low 8 bits of the grid index (10 bits)
  uint8_t signs[32];  // per 8 elems 8 sign bits
  uint8_t qh[8];      // per 32 elems: index bits 8-9 of group l at bits 2l, 2l + 1
  uint8_t scales[8];  // as IQ2_XS
};
struct IQ3_XXS {
  uint8_t d[2];
  uint8_t qs[64];            // per 4 elems a grid index (a byte)
  uint8_t scales_signs[32];  // per 32 elems a u32 as IQ2_XXS's: x = d * (0.5 + s) / 2 * grid * sign
};
struct IQ3_S {
  uint8_t d[2];
  uint8_t qs[64];     // per 4 elems the low 8 bits of the grid index (9 bits)
  uint8_t qh[8];      // per 32 elems: bit k = index bit 8 of its 4-group k
  uint8_t signs[32];  // per 8 elems 8 sign bits
  uint8_t scales[4];  // per 64 elems: the first 32's scale in the low nibble, the second's in the
                      // high one; x = d * (1 + 2s) * grid * sign
};
struct IQ1_S {
  uint8_t d[2];
  uint8_t qs[32];  // per 8 elems the low 8 bits of the grid index (11 bits)
  uint8_t qh[16];  // per 32 elems a u16: index bits 8-10 of group l at bits 3l, the scale s at
                   // bits 12-14, bit 15 the delta's sign: x = d * (2s + 1) * (grid + delta)
};
struct IQ1_M {
  uint8_t qs[32];     // as IQ1_S
  uint8_t qh[16];     // per 32 elems 2 bytes, a nibble per 8 elems: index bits 8-10, then the
                      // sign of its delta (bit 3)
  uint8_t scales[8];  // 4 u16: the 3-bit scale of 16 elems k (of the block's 16) at bits
                      // 3 (k % 4) of u16 k / 4; bits 12-15 of u16 i = bits 4i .. 4i + 3 of the
                      // f16 d: x = d * (2s + 1) * (grid + delta)
};
// The ternary types (BitNet b1.58, TriLM): values in {-d, 0, d}, trit t in {0, 1, 2} -> (t - 1) d.
struct TQ1_0 {
  uint8_t qs[48];  // 5 trits a byte, as a base-3 fraction of 256 (trit n: (byte * 3^n mod 256) * 3 >> 8):
                   // bytes 0-31 elems 32n + m, bytes 32-47 elems 160 + 16n + m (m the byte)
  uint8_t qh[4];   // 4 trits a byte (n < 4): elems 240 + 4n + m
  uint8_t d[2];    // f16
};
struct TQ2_0 {
  uint8_t qs[64];  // 2 bits a trit: per 32 bytes j, elem 128 (j / 32) + 32 l + m at bits 2l of byte m
  uint8_t d[2];    // f16
};
inline constexpr float kIQ1Delta = 0.125f;  // ggml's IQ1S_DELTA
// ggml's ksigns_iq2xs[i]: 7 sign bits and their parity as the 8th.
constexpr uint8_t iq_signs7(unsigned i) { return uint8_t(i | ((std::popcount(i & 127u) & 1u) << 7)); }
// IQ1_M's f16 d, from the top nibbles of its 4 scale words.
inline uint16_t iq1m_d_bits(const IQ1_M& b) {
  uint16_t sc[4];
  std::memcpy(sc, b.scales, 8);
  return uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}
// ggml's kvalues_mxfp4: the E2M1 values doubled (so they are integers; the scale is halved).
inline constexpr int8_t kValuesMXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// ggml_e8m0_to_fp32_half: 2^(e - 128), exact in f32 (e < 2: the subnormals 2^-128, 2^-127).
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : uint32_t(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// An MXFP4 block whose every value is 0 (each index 0 or 8, +0 or -0 under any scale).
inline bool mxfp4_is_zero(const MXFP4& b) {
  for (uint8_t q : b.qs)
    if ((q & 0x77) != 0) return false;
  return true;
}
// An MXFP4 block the engine refuses (a model that holds one fails to load, naming the tensor):
// e = 255 (NaN in the OCP MX spec; ggml's row validation rejects it), and a scale 2^(e - 128) of
// 2^16 or more (e >= 144) on a block that is not all zeros (beyond f16, in which the CPU kernels
// hold the scale: its values would be inf or wrong, not the file's). Scales below f16's least
// subnormal (e < 104: every |value| <= 12 * 2^-25) are computed as 0 (packed.h).
inline bool mxfp4_refused(const MXFP4& b) { return b.e == 255 || (b.e >= 144 && !mxfp4_is_zero(b)); }
// The 16 levels of the non-linear 4-bit types (ggml's kvalues_iq4nl).
inline constexpr int8_t kValuesIQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
// The values of the ternary types over d (q - 1): TQ1_0's trits give the first three, TQ2_0's
// 2-bit q all four (ggml writes q <= 2, but a file's q = 3 means +2).
inline constexpr int8_t kValuesTernary[16] = {-1, 0, 1, 2};
// Q3_K's values over -d (sc - 32) by index 3 - q (q3k_q in [-4, 3]): i - 3 = -q. Negated so
// that a value times its scale (sc - 32 in [-32, 31]) lies in [-128, 124], an int8 (packed.h).
inline constexpr int8_t kValuesQ3KNeg[16] = {-3, -2, -1, 0, 1, 2, 3, 4};

// Activation format for K-quant dot products: float scale, int8 values, sums of 16.
struct Q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};
static_assert(sizeof(Q8_0) == 34 && sizeof(Q4_0) == 18);
static_assert(sizeof(Q4_K) == 144 && sizeof(Q6_K) == 210 && sizeof(Q8_K) == 292);
static_assert(sizeof(Q4_1) == 20 && sizeof(Q5_0) == 22 && sizeof(Q5_1) == 24 && sizeof(IQ4_NL) == 18);
static_assert(sizeof(MXFP4) == 17);
static_assert(sizeof(IQ2_XXS) == 66 && sizeof(IQ2_XS) == 74 && sizeof(IQ2_S) == 82 && sizeof(IQ3_XXS) == 98);
static_assert(sizeof(IQ3_S) == 110 && sizeof(IQ1_S) == 50 && sizeof(IQ1_M) == 56);
static_assert(sizeof(TQ1_0) == 54 && sizeof(TQ2_0) == 66);
static_assert(sizeof(Q2_K) == 84 && sizeof(Q3_K) == 110 && sizeof(Q5_K) == 176 && sizeof(IQ4_XS) == 136);

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Scale j (0..7) and min of a Q4_K block from its 12 packed bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Element e (< 256) of a Q5_K block: its unsigned 5-bit q, sub-block s = e / 32 at nibble s % 2
// of qs[32 (s / 2) + l] and bit s of qh[l] (l = e % 32).
inline int q5k_q(const Q5_K& b, int e) {
  const int s = e / 32, l = e % 32;
  return ((b.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF) | (((b.qh[l] >> s) & 1) << 4);
}

// Scale j (0..15) of a Q3_K block from its 12 packed bytes, unsigned (subtract 32 for the signed
// value): low 4 bits at nibble j/8 of byte j%8, high 2 bits at bits 2*(j/4) of byte 8 + j%4.
inline int scale_k3(int j, const uint8_t* s) {
  const int lo = (s[j % 8] >> (4 * (j / 8))) & 0xF;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | (hi << 4);
}

// Element e (< 256) of Q2_K's and Q3_K's 64 bytes of 2-bit fields: bits 2j of qs[32h + l] for
// e = 128h + 32j + l.
inline int low2_k(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; }
// Element e (< 256) of a Q2_K block: q in [0, 3] under scale scales[e / 16] & 0xF and min
// scales[e / 16] >> 4 (x = d sc q - dmin m).
inline int q2k_q(const Q2_K& b, int e) { return low2_k(b.qs, e); }
// Element e (< 256) of a Q3_K block: its signed 3-bit q in [-4, 3] (low 2 bits as Q2_K's, the
// high bit of hmask[l] at bit 4h + j clear subtracting 4: e = 128h + 32j + l), under scale
// scale_k3(e / 16) - 32.
inline int q3k_q(const Q3_K& b, int e) {
  const int h = e / 128, j = (e % 128) / 32, l = e % 32;
  return low2_k(b.qs, e) - (((b.hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
}

// IQ4_XS sub-block j's (0..7) 6-bit scale, unsigned (the value is ls - 32).
inline int scale_iq4xs(const IQ4_XS& b, int j) {
  const int sh = b.scales_h[0] | (b.scales_h[1] << 8);
  return ((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
}

// The 5th bit of Q5_0/Q5_1 element j (0..31).
inline int q5_high(const uint8_t* qh, int j) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return int((h >> j) & 1);
}

}  // namespace ft::blocks
