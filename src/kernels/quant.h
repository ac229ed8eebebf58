// Block formats of the supported weight types, exactly as ggml lays them out in GGUF, with scalar
// dequantization (the reference every fast kernel is tested against) and quantization (used by
// make-model and tests).
//   Q8_0: 32 elems/block  { f16 d; int8 qs[32]; }                       x = d*q
//   Q4_0: 32 elems/block  { f16 d; uint8 qs[16]; }  lo nibbles = elems 0..15, hi = 16..31, x = d*(q-8)
//   Q4_K: 256 elems/block { f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128]; }  8 sub-blocks of 32,
//         6-bit scale/min per sub-block, x = d*sc*q - dmin*m
//   Q6_K: 256 elems/block { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }  x = d*sc*(q-32)
//   F16, BF16, F32: plain.
#pragma once
#include <cstdint>

#include "gguf/ggml_types.h"

namespace ft {

// Dequantizes n elements (n a multiple of the block size) from src into dst.
void dequantize_row(GGMLType type, const void* src, float* dst, int64_t n);

// Quantizes n elements (n a multiple of the block size) from src into dst (row_bytes(type, n)).
void quantize_row(GGMLType type, const float* src, void* dst, int64_t n);

}  // namespace ft
