// Block formats of the supported weight types, exactly as ggml lays them out in GGUF, with scalar
// dequantization (the reference every fast kernel is tested against) and quantization (used by
// make-model and tests).
//   Q8_0: 32 elems/block  { f16 d; int8 qs[32]; }                       x = d*q
//   Q4_0: 32 elems/block  { f16 d; uint8 qs[16]; }  lo nibbles = elems 0..15, hi = 16..31, x = d*(q-8)
//   Q4_K: 256 elems/block { f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]; }  8 sub-blocks of 32,
//         6-bit scale/min per sub-block, x = d*sc*q - dmin*m
//   Q6_K: 256 elems/block { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }  x = d*sc*(q-32)
//   Q4_1: 32 elems/block  { f16 d; f16 m; uint8 qs[16]; }  nibbles as Q4_0, x = d*q + m
//   Q5_0: 32 elems/block  { f16 d; uint8 qh[4]; uint8 qs[16]; }  5th bit of elem j = bit j of qh,
//         x = d*(q-16);  Q5_1: { f16 d; f16 m; uint8 qh[4]; uint8 qs[16]; }  x = d*q + m
//   IQ4_NL: 32 elems/block { f16 d; uint8 qs[16]; }  nibbles as Q4_0 index 16 non-linear levels,
//         x = d*kvalues[q]
//   Q2_K: 256 elems/block { uint8 scales[16]; uint8 qs[64]; f16 d; f16 dmin; }  16 sub-blocks of
//         16, 4-bit scale/min, 2-bit q, x = d*sc*q - dmin*m
//   Q3_K: 256 elems/block { uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; f16 d; }  6-bit
//         signed scales per 16, 3-bit q, x = d*(sc-32)*(q-4)
//   Q5_K: 256 elems/block { f16 d; f16 dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; }
//         as Q4_K with a 5th bit per elem
//   IQ4_XS: 256 elems/block { f16 d; u16 scales_h; uint8 scales_l[4]; uint8 qs[128]; }  6-bit
//         scale per 32, x = d*(ls-32)*kvalues[q]
//   MXFP4: 32 elems/block { uint8 e; uint8 qs[16]; }  nibbles as Q4_0 index the doubled E2M1
//         values {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12}, x = kvalues[q] * 2^(e - 128)
//   IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: 256 elems/block, groups of 8 (IQ3: 4)
//         elements as one entry of a fixed grid, signs, and 4-bit (IQ1: 3-bit) scales per 32 or 16
//         (quant_iq.h; quantized by a quantizer of our own, not ggml's)
//   TQ1_0, TQ2_0: 256 elems/block, ternary {-d, 0, d}: trits packed 5 a byte as base-3 fractions of
//         256 (TQ1_0, 54 bytes) or 2 bits each (TQ2_0, 66 bytes), f16 d last
//   F16, BF16, F32: plain.
// (Byte layouts in quant_blocks.h.)
#pragma once
#include <cstdint>

#include "gguf/ggml_types.h"

namespace ft {

// Dequantizes n elements (n a multiple of the block size) from src into dst.
void dequantize_row(GGMLType type, const void* src, float* dst, int64_t n);

// Quantizes n elements (n a multiple of the block size) from src into dst (row_bytes(type, n)).
void quantize_row(GGMLType type, const float* src, void* dst, int64_t n);

}  // namespace ft
