// Paged KV cache: fixed-size blocks of positions, a block table per sequence.
// Storage per layer: K and V pools of (n_blocks, block_size, kv_dim) floats. A forward pass
// writes each new token's K/V in place at (sequence, position); attention reads through the
// sequence's block table (KVLayerView), so chunked prefill needs no copies.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/kernels.h"

namespace ft {

struct KVCacheConfig {
  int32_t n_layers = 0;
  int32_t kv_dim = 0;       // n_kv_heads * head_dim
  int32_t block_size = 16;  // positions per block
  int32_t n_blocks = 0;
};

class KVCache {
 public:
  explicit KVCache(const KVCacheConfig& cfg);

  // Blocks needed to hold a capacity of n positions.
  static int32_t blocks_for(int64_t n_positions, int32_t block_size);
  // Bytes one block takes over all layers (K and V).
  static uint64_t block_bytes(int32_t n_layers, int32_t kv_dim, int32_t block_size);

  const KVCacheConfig& config() const { return cfg_; }
  int32_t free_blocks() const { return int32_t(free_.size()); }
  int32_t used_blocks() const { return cfg_.n_blocks - free_blocks(); }

  // Makes room for positions [0, n_positions) of seq (creating it if new). Returns false, and
  // changes nothing, when there are not enough free blocks.
  bool reserve(int32_t seq, int64_t n_positions);
  // Releases all of seq's blocks. Unknown seq: no-op.
  void release(int32_t seq);
  bool has(int32_t seq) const { return seqs_.count(seq) != 0; }
  // Positions [0, capacity) that seq can hold without another reserve().
  int64_t capacity(int32_t seq) const;

  float* k_row(int32_t layer, int32_t seq, int64_t pos);
  float* v_row(int32_t layer, int32_t seq, int64_t pos);
  KVLayerView view(int32_t layer, int32_t seq) const;

 private:
  float* row(std::vector<float>& pool, int32_t layer, int32_t seq, int64_t pos);
  KVCacheConfig cfg_;
  std::vector<float> k_, v_;  // (n_layers, n_blocks, block_size, kv_dim)
  std::vector<int32_t> free_;
  std::unordered_map<int32_t, std::vector<int32_t>> seqs_;  // seq -> block table
};

}  // namespace ft
