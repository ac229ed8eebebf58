// Tensor and pipeline parallelism's step protocol over a Communicator (parallel/comm.h). Rank 0's
// engine (Engine with EngineConfig::tp) owns the scheduler and the KV cache's block allocation;
// before each forward it broadcasts the batch (tokens, positions, sequences, want_logits) and the
// block table of every sequence in it to every rank. A worker (run_tp_worker) runs the same
// forward on its part of the model (Model::stage's layers, Model::shard's heads and columns)
// over a KV cache of the same blocks holding its layers' KV heads, so the block ids rank 0
// allocates are valid on every rank. Only rank 0 computes logits.
//   start:  int64 {max_batch, n_ctx, n_blocks, block_size, kv_type, kv_dim}
//   step:   int64 {kStep, M, payload ints, C}, then int32 tokens[M] pos[M] seq[M] want[M],
//           then per distinct sequence {seq, n, table[n]}, then C block copies {src, dst}
//           (KVCache::take_copies: a fork's partial blocks since the last step, replayed before
//           the forward; a copy's source is never rewritten before the step that carries it)
//   stop:   int64 {kStop, 0, 0, 0}
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/runtime_config.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "parallel/comm.h"

namespace ft {

// This rank's part of m: its stage's layers (Model::stage), then its shard of them (Model::shard).
void split_model(Model& m, const Communicator& c);
// Connects f to the group: the stage's allreduces when tp > 1, the stage links when pp > 1.
void attach(Forward& f, Communicator& c);

class TpLeader {
 public:
  explicit TpLeader(Communicator& c) : c_(c) {}
  // The geometry every rank must share: sent once, before the first step.
  void start(const KVCacheConfig& kc, int64_t max_batch, int64_t n_ctx);
  // Posts the step to every rank (Communicator::post_broadcast: returns before they take it).
  void send_step(const Batch& b, KVCache& kv);
  // Waits until every rank has taken what was posted (before rank 0 idles: a posted send's
  // transfer may need rank 0's progress, so the next stage would wait on it).
  void drain() { c_.drain(); }
  void stop();  // drains; the workers return; idempotent
  Communicator& comm() { return c_; }

 private:
  Communicator& c_;
  std::vector<int32_t> payload_;
  bool stopped_ = false;
};

// A worker rank (rank > 0) after start-up: takes rank 0's start message, builds its backend
// (rt.backend, rt.threads), Forward and KV cache, and runs every step until rank 0's stop. A
// step that fails here fails alike on rank 0 (same batch, same checks) and is skipped; a rank
// that stops answering ends the job through the communicator's timeouts.
// before_step (tests): runs before each step's forward (e.g. to make this stage the slow one).
void run_tp_worker(const Model& sharded, const RuntimeConfig& rt, Communicator& c,
                   const std::function<void()>& before_step = {});

}  // namespace ft
