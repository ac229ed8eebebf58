#include "kv/kv_cache.h"

#include "core/error.h"

namespace ft {

KVCache::KVCache(const KVCacheConfig& cfg) : cfg_(cfg) {
  if (cfg.n_layers <= 0 || cfg.kv_dim <= 0 || cfg.block_size <= 0 || cfg.n_blocks <= 0)
    fail("KV cache: invalid configuration (layers ", cfg.n_layers, ", kv_dim ", cfg.kv_dim,
         ", block size ", cfg.block_size, ", blocks ", cfg.n_blocks, ")");
  const size_t n = size_t(cfg.n_layers) * size_t(cfg.n_blocks) * size_t(cfg.block_size) *
                   size_t(cfg.kv_dim);
  k_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
  free_.reserve(size_t(cfg.n_blocks));
  for (int32_t b = cfg.n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t KVCache::blocks_for(int64_t n_positions, int32_t block_size) {
  return int32_t((n_positions + block_size - 1) / block_size);
}

uint64_t KVCache::block_bytes(int32_t n_layers, int32_t kv_dim, int32_t block_size) {
  return 2ull * uint64_t(n_layers) * uint64_t(kv_dim) * uint64_t(block_size) * sizeof(float);
}

bool KVCache::reserve(int32_t seq, int64_t n_positions) {
  auto& table = seqs_[seq];
  const int32_t need = blocks_for(n_positions, cfg_.block_size) - int32_t(table.size());
  if (need <= 0) return true;
  if (need > free_blocks()) {
    if (table.empty()) seqs_.erase(seq);
    return false;
  }
  for (int32_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KVCache::release(int32_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second) free_.push_back(b);
  seqs_.erase(it);
}

int64_t KVCache::capacity(int32_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : int64_t(it->second.size()) * cfg_.block_size;
}

float* KVCache::row(std::vector<float>& pool, int32_t layer, int32_t seq, int64_t pos) {
  const auto& table = seqs_.at(seq);
  const int64_t blk = pos / cfg_.block_size;
  if (pos < 0 || blk >= int64_t(table.size()))
    fail("KV cache: position ", pos, " of sequence ", seq, " is outside its reserved capacity ",
         capacity(seq));
  const int64_t phys = table[size_t(blk)];
  const size_t layer_off = size_t(layer) * cfg_.n_blocks * cfg_.block_size * cfg_.kv_dim;
  return pool.data() + layer_off +
         size_t((phys * cfg_.block_size + pos % cfg_.block_size) * cfg_.kv_dim);
}

float* KVCache::k_row(int32_t layer, int32_t seq, int64_t pos) { return row(k_, layer, seq, pos); }
float* KVCache::v_row(int32_t layer, int32_t seq, int64_t pos) { return row(v_, layer, seq, pos); }

KVLayerView KVCache::view(int32_t layer, int32_t seq) const {
  const size_t layer_off = size_t(layer) * cfg_.n_blocks * cfg_.block_size * cfg_.kv_dim;
  KVLayerView v;
  v.k_pool = k_.data() + layer_off;
  v.v_pool = v_.data() + layer_off;
  v.block_table = seqs_.at(seq).data();
  v.block_size = cfg_.block_size;
  v.kv_dim = cfg_.kv_dim;
  return v;
}

}  // namespace ft
