#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace ft {

uint64_t block_hash(uint64_t parent, std::span<const int32_t> block_tokens) {
  // splitmix64-style mixing of each token into the parent hash; never 0 (0 = unpublished).
  uint64_t h = parent ^ 0x9E3779B97F4A7C15ull;
  for (int32_t t : block_tokens) {
    h ^= uint64_t(uint32_t(t)) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  return h ? h : 1;
}

uint64_t prefix_salt(uint64_t uid, uint64_t cache_salt) {
  uint64_t salt = 0;
  if (uid != 0) {
    const int32_t words[2] = {int32_t(uint32_t(uid)), int32_t(uint32_t(uid >> 32))};
    salt = block_hash(0x4C6F5241ull /* "LoRA" */, words);
  }
  if (cache_salt != 0) {
    const int32_t words[2] = {int32_t(uint32_t(cache_salt)), int32_t(uint32_t(cache_salt >> 32))};
    salt = block_hash(salt ^ 0x53616C74ull /* "Salt" */, words);
  }
  return salt;
}

KVCache::KVCache(const KVCacheConfig& cfg) : cfg_(cfg), geo_(cfg.geometry()) {
  if (cfg.n_layers <= 0 || cfg.kv_dim <= 0 || cfg.block_size <= 0 || cfg.n_blocks <= 0 || cfg.n_kv_heads <= 0 ||
      cfg.kv_dim % cfg.n_kv_heads != 0)
    fail("KV cache: invalid configuration (layers ", cfg.n_layers, ", kv_dim ", cfg.kv_dim, ", KV heads ",
         cfg.n_kv_heads, ", block size ", cfg.block_size, ", blocks ", cfg.n_blocks, ")");
  geo_.validate();
  // (Each factor < 2^31 and a block's bytes < 2^40: checked against overflow as a product.)
  layer_bytes_ = uint64_t(cfg.n_blocks) * geo_.block_bytes();
  if (layer_bytes_ / uint64_t(cfg.n_blocks) != geo_.block_bytes() ||
      layer_bytes_ > std::numeric_limits<size_t>::max() / uint64_t(cfg.n_layers))
    fail("KV cache: ", cfg.n_blocks, " blocks do not fit in memory");
  arena_bytes_ = layer_bytes_ * uint64_t(cfg.n_layers);
  // (Attention streams the pools: on huge pages, allocated now, not on a request's first write.)
  mem_ = MappedMemory(arena_bytes_, "KV cache", MappedMemory::Prefault::Yes);
  arena_ = mem_.data();
  blocks_.resize(size_t(cfg.n_blocks));
  free_.reserve(size_t(cfg.n_blocks));
  for (int32_t b = cfg.n_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t KVCache::blocks_for(int64_t n_positions, int32_t block_size) {
  if (block_size < 1) fail("KV cache: block size ", block_size, " must be positive");
  const int64_t n = std::max<int64_t>(n_positions, 0);
  const int64_t blocks = n / block_size + (n % block_size != 0);  // (n + block_size - 1 overflowed near INT64_MAX)
  if (blocks > std::numeric_limits<int32_t>::max())
    fail("KV cache: ", n, " positions need more than ", std::numeric_limits<int32_t>::max(), " blocks of ", block_size);
  return int32_t(blocks);
}

uint64_t KVCache::block_bytes(const KVCacheConfig& cfg) {
  return uint64_t(std::max(cfg.n_layers, 0)) * cfg.geometry().block_bytes();
}

std::string KVCache::summary() const {
  return cat(capacity_tokens(), " tokens (", bytes() >> 20, " MiB, ", kv_type_name(cfg_.type), ", ",
             cfg_.block_size, "-token blocks)");
}

int32_t KVCache::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = lru_.front();  // evict the least recently used cached prefix block
    lru_.pop_front();
    by_hash_.erase(blocks_[size_t(b)].hash);
    ++stats_.evictions;
  }
  Block& blk = blocks_[size_t(b)];
  blk.hash = 0;
  blk.parent = 0;
  blk.tokens.clear();
  blk.refs = 1;
  return b;
}

void KVCache::unref(int32_t b) {
  Block& blk = blocks_[size_t(b)];
  if (--blk.refs > 0) return;
  if (blk.hash != 0) {
    blk.lru_pos = lru_.insert(lru_.end(), b);
  } else {
    free_.push_back(b);
  }
}

bool KVCache::reserve(int32_t seq, int64_t n_positions) {
  auto it = seqs_.find(seq);
  const int32_t have = it == seqs_.end() ? 0 : int32_t(it->second.table.size());
  const int32_t need = blocks_for(n_positions, cfg_.block_size) - have;
  if (need <= 0) {
    if (it == seqs_.end()) seqs_.emplace(seq, Seq{});
    return true;
  }
  if (need > free_blocks()) return false;
  auto& table = seqs_[seq].table;
  for (int32_t i = 0; i < need; ++i) table.push_back(take_block());
  return true;
}

void KVCache::release(int32_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last blocks first, so a shared prefix's head stays cached longest under LRU.
  for (auto b = it->second.table.rbegin(); b != it->second.table.rend(); ++b) unref(*b);
  seqs_.erase(it);
}

void KVCache::truncate(int32_t seq, int64_t n_positions) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  const int32_t keep = blocks_for(std::max<int64_t>(n_positions, 0), cfg_.block_size);
  if (keep < std::max(s.n_published, s.n_forked))
    fail("KV cache: truncating sequence ", seq, " to ", n_positions, " positions would cut into its ",
         std::max(s.n_published, s.n_forked), " published or forked blocks");
  while (int32_t(s.table.size()) > keep) {
    unref(s.table.back());
    s.table.pop_back();
  }
}

bool KVCache::fork(int32_t parent, int32_t child, int64_t n_positions) {
  if (capacity(child) != 0) fail("KV cache: forking into sequence ", child, " that already holds blocks");
  if (n_positions < 1 || capacity(parent) < n_positions)
    fail("KV cache: forking ", n_positions, " positions of sequence ", parent, " that holds ", capacity(parent));
  const int32_t full = int32_t(n_positions / cfg_.block_size);
  const bool partial = n_positions % cfg_.block_size != 0;
  Seq& p = seqs_.at(parent);
  // (publish() covers computed positions: the parent's published chain lies within the full blocks.)
  if (p.n_published > full) fail("KV cache: sequence ", parent, " published past the ", n_positions, " positions forked");
  if (partial && free_blocks() < 1) return false;
  Seq c;
  c.table.assign(p.table.begin(), p.table.begin() + full);
  for (const int32_t b : c.table) ++blocks_[size_t(b)].refs;  // held by parent: never idle in the LRU
  if (partial) {
    const int32_t b = take_block();
    copy_block(p.table[size_t(full)], b);
    c.table.push_back(b);
  }
  c.n_published = p.n_published;  // the chain continues from the parent's published blocks
  c.last_hash = p.last_hash;
  c.n_forked = full;
  p.n_forked = std::max(p.n_forked, full);
  seqs_.insert_or_assign(child, std::move(c));
  return true;
}

void KVCache::copy_block(int32_t src, int32_t dst) {
  if (src < 0 || src >= cfg_.n_blocks || dst < 0 || dst >= cfg_.n_blocks)
    fail("KV cache: copying block ", src, " to ", dst, " outside [0, ", cfg_.n_blocks, ")");
  const uint64_t k_bytes = geo_.k_head_bytes() * uint64_t(geo_.n_kv_heads);
  const uint64_t v_bytes = geo_.v_head_bytes() * uint64_t(geo_.n_kv_heads);
  for (int32_t l = 0; l < cfg_.n_layers; ++l) {
    std::memcpy(k_pool(l) + uint64_t(dst) * k_bytes, k_pool(l) + uint64_t(src) * k_bytes, k_bytes);
    std::memcpy(v_pool(l) + uint64_t(dst) * v_bytes, v_pool(l) + uint64_t(src) * v_bytes, v_bytes);
  }
  if (record_copies_) copies_.emplace_back(src, dst);
}

int64_t KVCache::capacity(int32_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : int64_t(it->second.table.size()) * cfg_.block_size;
}

int32_t KVCache::find_cached(uint64_t parent, std::span<const int32_t> block_tokens) const {
  const auto it = by_hash_.find(block_hash(parent, block_tokens));
  if (it == by_hash_.end()) return -1;
  const Block& blk = blocks_[size_t(it->second)];
  if (blk.parent != parent || !std::equal(block_tokens.begin(), block_tokens.end(), blk.tokens.begin(),
                                          blk.tokens.end()))
    return -1;
  return it->second;
}

KVCache::PrefixHit KVCache::prefix_hit(std::span<const int32_t> tokens, int64_t max_tokens, uint64_t salt) const {
  PrefixMemo memo;
  return prefix_hit(tokens, max_tokens, salt, memo);
}

KVCache::PrefixHit KVCache::prefix_hit(std::span<const int32_t> tokens, int64_t max_tokens, uint64_t salt,
                                       PrefixMemo& m) const {
  PrefixHit hit;
  if (!cfg_.prefix_caching) return hit;
  const int64_t B = cfg_.block_size;
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(tokens.size()));
  if (m.evictions != stats_.evictions || m.salt != salt || int64_t(m.blocks.size()) * B > limit) {
    m.evictions = stats_.evictions;
    m.salt = salt;
    m.parent = salt;
    m.blocks.clear();
  }
  for (const int32_t b : m.blocks) hit.idle_blocks += blocks_[size_t(b)].refs == 0;
  hit.blocks = int32_t(m.blocks.size());
  hit.tokens = int64_t(m.blocks.size()) * B;
  while (hit.tokens + B <= limit) {
    const auto blk = tokens.subspan(size_t(hit.tokens), size_t(B));
    const int32_t b = find_cached(m.parent, blk);
    if (b < 0) break;
    m.blocks.push_back(b);
    ++hit.blocks;
    hit.idle_blocks += blocks_[size_t(b)].refs == 0;
    m.parent = block_hash(m.parent, blk);
    hit.tokens += B;
  }
  return hit;
}

int32_t KVCache::shared_blocks(int32_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int32_t n = 0;
  for (const int32_t b : it->second.table) n += blocks_[size_t(b)].refs > 1;
  return n;
}

int64_t KVCache::attach_prefix(int32_t seq, std::span<const int32_t> tokens, int64_t max_tokens, uint64_t salt) {
  if (capacity(seq) != 0) fail("KV cache: attach_prefix on sequence ", seq, " that already holds blocks");
  ++stats_.prefix_queries;
  stats_.prefix_query_tokens += uint64_t(std::max<int64_t>(0, std::min<int64_t>(max_tokens, int64_t(tokens.size()))));
  Seq& s = seqs_[seq];
  s.last_hash = salt;  // the chain's seed: publish() continues it
  if (!cfg_.prefix_caching) return 0;
  const int64_t B = cfg_.block_size;
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(tokens.size()));
  int64_t n = 0;
  while (n + B <= limit) {
    const auto blk_tokens = tokens.subspan(size_t(n), size_t(B));
    const int32_t b = find_cached(s.last_hash, blk_tokens);
    if (b < 0) break;
    Block& blk = blocks_[size_t(b)];
    if (blk.refs++ == 0) lru_.erase(blk.lru_pos);
    s.table.push_back(b);
    s.last_hash = blk.hash;
    ++s.n_published;
    n += B;
  }
  stats_.prefix_hit_tokens += uint64_t(n);
  return n;
}

void KVCache::publish(int32_t seq, std::span<const int32_t> tokens, int64_t n_computed) {
  if (!cfg_.prefix_caching) return;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  const int64_t B = cfg_.block_size;
  const int64_t full = std::min<int64_t>(std::min<int64_t>(n_computed, int64_t(tokens.size())) / B,
                                         int64_t(s.table.size()));
  for (int64_t i = s.n_published; i < full; ++i) {
    const auto blk_tokens = tokens.subspan(size_t(i * B), size_t(B));
    const uint64_t h = block_hash(s.last_hash, blk_tokens);
    Block& blk = blocks_[size_t(s.table[size_t(i)])];
    if (by_hash_.count(h) == 0 && blk.hash == 0) {
      blk.hash = h;
      blk.parent = s.last_hash;
      blk.tokens.assign(blk_tokens.begin(), blk_tokens.end());
      by_hash_.emplace(h, s.table[size_t(i)]);
    }
    s.last_hash = h;
    s.n_published = int32_t(i + 1);
  }
}

int64_t KVCache::block_of(int32_t seq, int64_t pos) const {
  const auto& table = seqs_.at(seq).table;
  const int64_t blk = pos / cfg_.block_size;
  if (pos < 0 || blk >= int64_t(table.size()))
    fail("KV cache: position ", pos, " of sequence ", seq, " is outside its reserved capacity ",
         capacity(seq));
  return table[size_t(blk)];
}

void KVCache::write(int32_t layer, int32_t seq, int64_t pos, const float* k, const float* v) {
  const int64_t blk = block_of(seq, pos);
  if (blocks_[size_t(blk)].refs > 1)  // (a mirrored table's blocks count no references)
    fail("KV cache: position ", pos, " of sequence ", seq, " lies in a block other sequences share");
  const uint64_t b = uint64_t(blk) * uint64_t(geo_.n_kv_heads);
  const int32_t row = int32_t(pos % cfg_.block_size);
  for (int32_t h = 0; h < geo_.n_kv_heads; ++h)
    kv_store(geo_, k_pool(layer) + (b + uint64_t(h)) * geo_.k_head_bytes(),
             v_pool(layer) + (b + uint64_t(h)) * geo_.v_head_bytes(), row, k + int64_t(h) * geo_.head_dim,
             v + int64_t(h) * geo_.head_dim);
}

void KVCache::read(int32_t layer, int32_t seq, int64_t pos, float* k, float* v) const {
  const uint64_t b = uint64_t(block_of(seq, pos)) * uint64_t(geo_.n_kv_heads);
  const int32_t row = int32_t(pos % cfg_.block_size);
  for (int32_t h = 0; h < geo_.n_kv_heads; ++h) {
    const int64_t off = int64_t(h) * geo_.head_dim;
    kv_load(geo_, k_pool(layer) + (b + uint64_t(h)) * geo_.k_head_bytes(),
            v_pool(layer) + (b + uint64_t(h)) * geo_.v_head_bytes(), row, k ? k + off : nullptr,
            v ? v + off : nullptr);
  }
}

KVLayerView KVCache::view(int32_t layer, int32_t seq) const {
  KVLayerView v;
  v.geo = geo_;
  v.k_pool = k_pool(layer);
  v.v_pool = v_pool(layer);
  v.block_table = seqs_.at(seq).table.data();
  return v;
}

std::span<const int32_t> KVCache::block_table(int32_t seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.table;
}

void KVCache::mirror_table(int32_t seq, std::span<const int32_t> table) {
  for (const int32_t b : table)
    if (b < 0 || b >= cfg_.n_blocks) fail("KV cache: block ", b, " of sequence ", seq, " is outside [0, ", cfg_.n_blocks, ")");
  seqs_[seq].table.assign(table.begin(), table.end());
}

}  // namespace ft
