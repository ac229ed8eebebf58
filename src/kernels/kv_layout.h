// The KV cache's storage layout: what the cache writes (kv_store) and what attention reads as
// stored (no dequantized copy of the context). Element types: F32, F16, BF16 and Q8_0.
//
// Per layer, K and V are two pools of (n_blocks, n_kv_heads, head block) bytes: one head's part
// of one block of block_size positions is contiguous ("head-major"), so attention for one KV head
// streams one run of bytes per block.
//   K head block: block_size / 16 tiles of 16 positions. A tile is laid out for scores computed
//     16 positions at a time, one position per vector lane, with no horizontal sums:
//       F32/F16/BF16: (head_dim, 16) elements, d-major: element (d, lane) = K[pos0 + lane][d].
//       Q8_0: (head_dim / 4, 16, 4) int8: each lane's 4 consecutive d's together (one 32-bit lane
//         of a 4-byte int8 dot product, vpdpbusd), then (q_blocks, 16) f32 scales.
//   V head block: block_size rows of one position each (P.V runs along head_dim):
//       F32/F16/BF16: head_dim elements; Q8_0: head_dim int8 then q_blocks f32 scales.
// Q8_0: each head's head_dim values in blocks of 32 (the last one shorter when head_dim is not a
// multiple of 32), d = max|x| / 127, q = x / d rounded to nearest even, so x ~= d * q within d / 2.
// Attention quantizes the query the same way (kv_quantize_query) and forms Q.K from exact int32
// block sums.
#pragma once
#include <cstdint>
#include <string_view>

#include "gguf/ggml_types.h"

namespace ft {

constexpr int32_t kKvTile = 16;    // positions per K tile (block_size is a multiple of it)
constexpr int32_t kKvQBlock = 32;  // Q8_0: values per scale along a head

// F32, F16, BF16, Q8_0.
bool is_kv_type(GGMLType t);
// "f32", "f16", "bf16", "q8_0" (any case) -> the type; otherwise an error naming the choices.
GGMLType parse_kv_type(std::string_view name);
std::string_view kv_type_name(GGMLType t);

struct KVGeometry {
  GGMLType type = GGMLType::F32;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;  // positions per block

  int32_t q_blocks() const { return (head_dim + kKvQBlock - 1) / kKvQBlock; }  // Q8_0 scales per head row
  // (Inline: attention computes tile and row addresses from them; out of line, v_row_bytes alone
  // was 0.3% of the 110m decode's samples.)
  uint64_t elem_bytes() const { return type == GGMLType::F32 ? 4 : type == GGMLType::Q8_0 ? 1 : 2; }  // f32, f16/bf16, q8_0
  uint64_t k_tile_bytes() const {
    const uint64_t scales = type == GGMLType::Q8_0 ? uint64_t(q_blocks()) * kKvTile * sizeof(float) : 0;
    return uint64_t(head_dim) * kKvTile * elem_bytes() + scales;
  }
  uint64_t v_row_bytes() const {
    const uint64_t scales = type == GGMLType::Q8_0 ? uint64_t(q_blocks()) * sizeof(float) : 0;
    return uint64_t(head_dim) * elem_bytes() + scales;
  }
  uint64_t k_head_bytes() const { return k_tile_bytes() * uint64_t(block_size / kKvTile); }
  uint64_t v_head_bytes() const { return v_row_bytes() * uint64_t(block_size); }
  // One block of one layer, K and V of every head.
  uint64_t block_bytes() const { return (k_head_bytes() + v_head_bytes()) * uint64_t(n_kv_heads); }
  // Fails (ft::Error) unless the type is a KV type, sizes are positive, block_size is a multiple
  // of kKvTile and, for Q8_0, head_dim a multiple of 4.
  void validate() const;
};

// Where attention finds one sequence's K/V in one layer of the paged KV cache: position j lives
// in physical block block_table[j / block_size] at row j % block_size of each head block.
struct KVLayerView {
  KVGeometry geo;
  const uint8_t* k_pool = nullptr;  // (n_blocks, n_kv_heads, k_head_bytes)
  const uint8_t* v_pool = nullptr;  // (n_blocks, n_kv_heads, v_head_bytes)
  const int32_t* block_table = nullptr;

  // The K tile holding position pos (its first position is pos rounded down to 16) of head h.
  const uint8_t* k_tile(int64_t pos, int32_t h) const {
    const int64_t b = block_table[pos / geo.block_size];
    return k_pool + (uint64_t(b) * uint64_t(geo.n_kv_heads) + uint64_t(h)) * geo.k_head_bytes() +
           uint64_t((pos % geo.block_size) / kKvTile) * geo.k_tile_bytes();
  }
  const uint8_t* v_row(int64_t pos, int32_t h) const {
    const int64_t b = block_table[pos / geo.block_size];
    return v_pool + (uint64_t(b) * uint64_t(geo.n_kv_heads) + uint64_t(h)) * geo.v_head_bytes() +
           uint64_t(pos % geo.block_size) * geo.v_row_bytes();
  }
};

// Writes one position's K and V rows of head h: k, v (head_dim,) f32 -> the stored type, at row
// `row` (< block_size) of the head blocks k_head / v_head.
void kv_store(const KVGeometry& g, uint8_t* k_head, uint8_t* v_head, int32_t row, const float* k, const float* v);
// Reads them back as f32 (what attention computes with): k or v (head_dim,); either may be null.
void kv_load(const KVGeometry& g, const uint8_t* k_head, const uint8_t* v_head, int32_t row, float* k, float* v);
// One V row (v_row_bytes at p) -> f32 (head_dim,).
void kv_load_v_row(const KVGeometry& g, const uint8_t* p, float* v);

// Q8_0 scores: q (head_dim,) * scale quantized as K is: qq (head_dim,) int8, qd (q_blocks,) the
// block scales, qsum (q_blocks,) the sums of qq. Score = sum_b qd[b] * kd[b] * sum_{d in b} qq[d] * kq[d].
void kv_quantize_query(const float* q, int32_t head_dim, float scale, int8_t* qq, float* qd, int32_t* qsum);

}  // namespace ft
