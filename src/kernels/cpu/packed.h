// The "panel" layout the fast CPU kernels repack weights into at load (Backend::prepare), so that
// the GEMM micro-kernel reads 16 output rows' weights at one k as two contiguous vectors, and
// decode streams each group of rows front to back. Quantized types stay quantized (same bytes per
// weight, give or take the unpacked 6-bit Q4_K scales), so decode reads as many bytes as before.
//
// W (N, K) -> ceil(N/16) groups of kGroup = 16 rows (the last padded with zero rows); group g is
// contiguous, group_bytes(type, K) bytes; inside it K is cut into blocks of block_len(type)
// elements (F32/F16/BF16: one element, so K is arbitrary), each block laid out as:
//   F32        float  w[16]                          (row r at k)
//   F16, BF16  uint16 w[16]
//   Q8_0 (32)  f16 d[16]; int8 q[32][16]             w = q * d
//   Q4_0 (32)  f16 d[16]; uint8 q[32][8]             byte j: row j in the low nibble, row j+8 in
//                                                    the high one (ggml's 0..15); w = (q-8) * d
//   Q4_K (256) f16 d[16], dmin[16]; uint8 sc[8][16], m[8][16]; uint8 q[256][8] (nibbles as Q4_0)
//                                                    w = (d*sc) * q - dmin*m, sub-block = k/32
//   Q6_K (256) f16 d[16]; int8 sc[16][16]; uint8 ql[256][8] (nibbles as Q4_0);
//              uint32 qh[256] (row r's 2 high bits at bits 2r..2r+1)   w = (d*sc) * (q-32), sub = k/16
// Every w is computed with the same float operations as dequantize_row, so it is bit-identical.
#pragma once
#include <cstdint>

#include "gguf/ggml_types.h"

namespace ft::cpu {

constexpr int kGroup = 16;

int64_t block_len(GGMLType t);           // elements per block along K (type_traits)
uint64_t packed_block_bytes(GGMLType t);  // bytes of one block of a group (16 rows)
inline uint64_t group_bytes(GGMLType t, int64_t K) { return uint64_t(K / block_len(t)) * packed_block_bytes(t); }
inline int64_t n_groups(int64_t n_rows) { return (n_rows + kGroup - 1) / kGroup; }

// rows (n_rows, K) in GGUF row layout (row_bytes apart) -> out (n_groups * group_bytes).
void pack_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
               uint8_t* out);
// Wp (len, 16) = the f32 weights of one group at k in [k0, k0 + len) (k0 and len block-aligned,
// or k0 + len == K). Portable; the reference for the AVX2 version.
void unpack_group(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, float* Wp);

}  // namespace ft::cpu
