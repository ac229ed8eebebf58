// Paged KV cache with prefix caching.
//
// Storage per layer: K and V pools of n_blocks blocks in the layout and element type of
// kernels/kv_layout.h (f32, f16, bf16 or q8_0; head-major blocks). A sequence owns a block table
// (logical block -> physical block); position j lives in block table[j / block_size] at row
// j % block_size. A forward pass writes each new token's K/V in place (converted to the stored
// type), and attention reads through the block table (KVLayerView) as stored, so chunked prefill
// needs no copies. All pools are one anonymous mapping (zero pages until written), advised to be
// backed by transparent huge pages.
//
// Prefix caching: a FULL block whose K/V has been computed can be published under a chained hash
// of its tokens (hash of the previous block's hash and this block's tokens), so the hash names the
// whole prefix up to and including the block. A new sequence attaches the cached blocks of its
// longest cached prefix instead of recomputing them (blocks are shared, reference counted, and
// never written again: a sequence only writes positions past its attached prefix). Blocks nobody
// references stay cached and are evicted least-recently-used when a new block is needed.
// A salt seeds the chain (the first block's parent): K/V computed under a LoRA adapter depend on
// it, so each adapter has its own key space (salt = prefix_salt(its uid); 0 = the base model) and a
// block is never reused across adapters or between an adapter and the base.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/mapped_memory.h"
#include "kernels/kernels.h"

namespace ft {

struct KVCacheConfig {
  int32_t n_layers = 0;
  int32_t kv_dim = 0;       // n_kv_heads * head_dim
  int32_t block_size = 16;  // positions per block (a multiple of kKvTile)
  int32_t n_blocks = 0;
  bool prefix_caching = true;
  int32_t n_kv_heads = 1;
  GGMLType type = GGMLType::F32;  // stored element type (the user's default is RuntimeConfig's)

  KVGeometry geometry() const { return {type, n_kv_heads, n_kv_heads > 0 ? kv_dim / n_kv_heads : 0, block_size}; }
};

struct KVCacheStats {
  uint64_t prefix_queries = 0;      // attach_prefix calls
  uint64_t prefix_hit_tokens = 0;   // tokens attached from the cache
  uint64_t prefix_query_tokens = 0; // tokens asked for
  uint64_t evictions = 0;           // cached blocks reused for new data
};

class KVCache {
 public:
  explicit KVCache(const KVCacheConfig& cfg);
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  // Blocks needed to hold n positions; ft::Error past INT32_MAX blocks.
  static int32_t blocks_for(int64_t n_positions, int32_t block_size);
  // Bytes one block takes over all layers (K and V) for cfg's layers, geometry and type.
  static uint64_t block_bytes(const KVCacheConfig& cfg);
  // The whole cache: bytes, and positions it holds (n_blocks * block_size).
  uint64_t bytes() const { return uint64_t(cfg_.n_blocks) * block_bytes(cfg_); }
  int64_t capacity_tokens() const { return int64_t(cfg_.n_blocks) * cfg_.block_size; }
  // Whether the kernel accepted MADV_HUGEPAGE for the pools (THP "madvise" or "always").
  bool huge_pages() const { return mem_.huge_pages(); }
  const MappedMemory& memory() const { return mem_; }  // the arena (prefaulted at construction)
  // "N tokens (M MiB, DTYPE, B-token blocks)"
  std::string summary() const;

  const KVCacheConfig& config() const { return cfg_; }
  int32_t total_blocks() const { return cfg_.n_blocks; }
  // Blocks a reserve() can take: never used, released, or cached but unreferenced (evictable).
  int32_t free_blocks() const { return int32_t(free_.size() + lru_.size()); }
  // Blocks referenced by at least one sequence.
  int32_t used_blocks() const { return cfg_.n_blocks - free_blocks(); }
  // Unreferenced blocks that still hold a reusable prefix.
  int32_t cached_blocks() const { return int32_t(lru_.size()); }
  const KVCacheStats& stats() const { return stats_; }

  // Makes room for positions [0, n_positions) of seq (creating it if new). Returns false, and
  // changes nothing, when there are not enough free blocks.
  bool reserve(int32_t seq, int64_t n_positions);
  // Drops seq's references to its blocks (published ones stay cached). Unknown seq: no-op.
  void release(int32_t seq);
  // Shrinks seq's reservation to the blocks holding positions [0, n_positions): the blocks past
  // them go back to the pool, their contents abandoned in place (speculative decoding's rejected
  // draft positions: no copy). Those blocks were never published (publish() covers computed
  // positions only), and a position inside a published, attached or forked block cannot be cut
  // (ft::Error).
  void truncate(int32_t seq, int64_t n_positions);
  // Makes `child` (a sequence holding no blocks) hold what positions [0, n_positions) of `parent`
  // hold, without recomputing them (n > 1 choices of one prompt): the blocks those positions fill
  // wholly are shared, reference counted like attached prefix blocks and never written again (both
  // sequences only write past n_positions, and neither can truncate into them); the last partial
  // block, if any, is copied into a new block, since both write their next positions into it. The
  // child continues the parent's prefix-cache chain (its own later blocks publish after the
  // parent's). Returns false, and changes nothing, when no block is free for the copy; ft::Error
  // when child holds blocks or parent holds fewer than n_positions.
  bool fork(int32_t parent, int32_t child, int64_t n_positions);
  // Copies block src's K/V (every layer) into block dst.
  void copy_block(int32_t src, int32_t dst);
  bool has(int32_t seq) const { return seqs_.count(seq) != 0; }
  // Positions [0, capacity) that seq can hold without another reserve().
  int64_t capacity(int32_t seq) const;
  int32_t n_sequences() const { return int32_t(seqs_.size()); }

  // The longest cached prefix of `tokens` (whole blocks, at most max_tokens tokens): what
  // attach_prefix would attach now, and how many of its blocks are idle (unreferenced: attaching
  // them takes them out of free_blocks()).
  struct PrefixHit {
    int64_t tokens = 0;
    int32_t blocks = 0, idle_blocks = 0;
  };
  PrefixHit prefix_hit(std::span<const int32_t> tokens, int64_t max_tokens, uint64_t salt = 0) const;
  // The same, resumed from what an earlier call for a prefix of these tokens (the same salt) found:
  // until a block is evicted (the only way a cached block leaves the cache) its blocks are still
  // cached, so the walk goes on after them and only their idle count is redone. (A waiting request
  // with a 30,000-token cached prefix was hashed and compared whole every step: 150 of them took
  // a step from 85 to 190 ms.)
  struct PrefixMemo {
    uint64_t evictions = ~uint64_t(0);  // the cache's evictions when found (~0: nothing found yet)
    uint64_t salt = 0;
    uint64_t parent = 0;          // the chain's hash after `blocks`
    std::vector<int32_t> blocks;  // the blocks found, in order
  };
  PrefixHit prefix_hit(std::span<const int32_t> tokens, int64_t max_tokens, uint64_t salt, PrefixMemo& memo) const;
  // Blocks of seq that another sequence also references (release(seq) does not free them).
  int32_t shared_blocks(int32_t seq) const;
  // For a sequence that holds no blocks yet: attaches the cached blocks of the longest cached
  // prefix under `salt` (at most max_tokens tokens) and returns how many tokens they cover; its
  // later publish() calls publish under the same salt.
  int64_t attach_prefix(int32_t seq, std::span<const int32_t> tokens, int64_t max_tokens, uint64_t salt = 0);
  // Publishes seq's full blocks within positions [0, n_computed), whose K/V are computed from
  // tokens[0..n_computed), for reuse by later sequences.
  void publish(int32_t seq, std::span<const int32_t> tokens, int64_t n_computed);

  // Stores position pos of seq in layer: k, v (kv_dim,) f32, converted to the stored type. A block
  // another sequence shares (attached, forked) is never written: ft::Error.
  void write(int32_t layer, int32_t seq, int64_t pos, const float* k, const float* v);
  // Reads it back as f32 (what attention computes with); k or v may be null.
  void read(int32_t layer, int32_t seq, int64_t pos, float* k, float* v) const;
  KVLayerView view(int32_t layer, int32_t seq) const;

  // Tensor parallelism (engine/tensor_parallel.h): rank 0's cache allocates the blocks and sends
  // each step's tables; a worker's cache (same n_blocks, its own KV heads) takes them as they are.
  // The physical blocks of seq's positions, in order (empty for an unknown seq).
  std::span<const int32_t> block_table(int32_t seq) const;
  // Makes seq's table `table` (block ids < total_blocks(), else ft::Error). For a cache whose
  // blocks are allocated elsewhere only: no reference counts, no free list, no prefix cache.
  void mirror_table(int32_t seq, std::span<const int32_t> table);
  // Block copies (fork's partial blocks) are data, not tables: with record_copies(true), every
  // copy_block is also logged (src, dst) for take_copies(), which rank 0 sends with the next step
  // so each worker replays them on its own shard before that step's forward.
  void record_copies(bool on) { record_copies_ = on; }
  std::vector<std::pair<int32_t, int32_t>> take_copies() { return std::exchange(copies_, {}); }

 private:
  struct Block {
    int32_t refs = 0;
    uint64_t hash = 0;  // 0: not published
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // contents of a published block (to rule out hash collisions)
    std::list<int32_t>::iterator lru_pos;
  };
  struct Seq {
    std::vector<int32_t> table;
    int32_t n_published = 0;  // leading blocks already published or attached from the cache
    int32_t n_forked = 0;     // leading blocks shared by fork() (never truncated)
    uint64_t last_hash = 0;   // chained hash after n_published blocks
  };

  int32_t take_block();
  void unref(int32_t b);
  int32_t find_cached(uint64_t parent, std::span<const int32_t> block_tokens) const;
  // Physical block of position pos of seq (fails outside its reserved capacity).
  int64_t block_of(int32_t seq, int64_t pos) const;
  uint8_t* k_pool(int32_t layer) const { return arena_ + uint64_t(layer) * layer_bytes_; }
  uint8_t* v_pool(int32_t layer) const { return k_pool(layer) + uint64_t(cfg_.n_blocks) * geo_.k_head_bytes() * uint64_t(geo_.n_kv_heads); }

  KVCacheConfig cfg_;
  KVGeometry geo_;
  MappedMemory mem_;
  uint8_t* arena_ = nullptr;  // mem_: per layer: K pool, V pool (kv_layout.h)
  uint64_t arena_bytes_ = 0, layer_bytes_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;             // unreferenced, unpublished
  std::list<int32_t> lru_;                // unreferenced, published; front = least recently used
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::unordered_map<int32_t, Seq> seqs_;
  KVCacheStats stats_;
  bool record_copies_ = false;
  std::vector<std::pair<int32_t, int32_t>> copies_;
};

// Chained hash of one block: names the prefix ending with this block.
uint64_t block_hash(uint64_t parent, std::span<const int32_t> block_tokens);
// The prefix-cache salt of a LoRA adapter's uid (LoraAdapter::uid; 0, the base, -> 0) and a
// request's cache salt (EngineRequest::cache_salt; 0: none): 0 for the base without a salt,
// nonzero and well mixed for anything else.
uint64_t prefix_salt(uint64_t adapter_uid, uint64_t cache_salt = 0);

}  // namespace ft
