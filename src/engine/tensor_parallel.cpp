#include "engine/tensor_parallel.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "engine/engine.h"

namespace ft {

namespace {
enum : int64_t { kStep = 1, kStop = 2 };
constexpr int kStartFields = 6, kHeaderFields = 4;
}  // namespace

void attach(Forward& f, Communicator& c) {
  if (c.tp_size() > 1) f.set_reducer(&c);
  if (c.pp_size() > 1) f.set_stage_link(&c);
}

void TpLeader::start(const KVCacheConfig& kc, int64_t max_batch, int64_t n_ctx) {
  int64_t s[kStartFields] = {max_batch, n_ctx, kc.n_blocks, kc.block_size, int64_t(kc.type), kc.kv_dim};
  c_.broadcast(s, sizeof s);
}

void TpLeader::send_step(const Batch& b, KVCache& kv) {
  const int64_t M = b.size();
  payload_.clear();
  for (const auto* v : {&b.tokens, &b.pos, &b.seq}) payload_.insert(payload_.end(), v->begin(), v->end());
  payload_.insert(payload_.end(), b.want_logits.begin(), b.want_logits.end());
  for (int64_t i = 0; i < M; ++i) {
    const int32_t s = b.seq[size_t(i)];
    bool seen = false;  // (sequences are few, their entries consecutive: a short scan)
    for (int64_t j = i - 1; j >= 0 && !seen; --j) seen = b.seq[size_t(j)] == s;
    if (seen) continue;
    const std::span<const int32_t> t = kv.block_table(s);
    payload_.push_back(s);
    payload_.push_back(int32_t(t.size()));
    payload_.insert(payload_.end(), t.begin(), t.end());
  }
  const auto copies = kv.take_copies();
  for (const auto& [src, dst] : copies) {
    payload_.push_back(src);
    payload_.push_back(dst);
  }
  // Posted: this step's stage-0 part may run while the next stage still runs the previous step.
  const int64_t h[kHeaderFields] = {kStep, M, int64_t(payload_.size()), int64_t(copies.size())};
  c_.post_broadcast(h, sizeof h);
  c_.post_broadcast(payload_.data(), int64_t(payload_.size() * sizeof(int32_t)));
  c_.count_step();
}

void split_model(Model& m, const Communicator& c) {
  m.stage(c.stage(), c.pp_size());  // first: only the stage's layers get sliced
  m.shard(c.tp_rank(), c.tp_size());
}

void TpLeader::stop() {
  if (stopped_) return;
  stopped_ = true;
  c_.drain();
  int64_t h[kHeaderFields] = {kStop, 0, 0, 0};
  c_.broadcast(h, sizeof h);
}

void run_tp_worker(const Model& m, const RuntimeConfig& rt, Communicator& c, const std::function<void()>& before_step) {
  int64_t s[kStartFields];
  c.broadcast_idle(s, sizeof s);  // rank 0 may take a while to start (its tokenizer, its checks)
  const int64_t max_batch = s[0], n_ctx = s[1];
  RuntimeConfig r = rt;
  r.kv_block_size = int32_t(s[3]);
  r.kv_type = GGMLType(s[4]);
  const KVCacheConfig kc = kv_cache_config(r, m.hparams(), int32_t(s[2]), false);
  if (kc.kv_dim != s[5]) c.abort(cat("rank 0's KV rows are ", s[5], " floats, this rank's ", kc.kv_dim));
  KVCache kv(kc);
  std::unique_ptr<Backend> be = make_backend(r.backend, resolve_threads(r.threads));
  Forward fwd(m, *be, max_batch, n_ctx);  // (prepares the backend's copies: then they can be locked)
  if (rt.mlock) std::fprintf(stderr, "firsttoken: rank %d: %s\n", c.rank(), lock_weights(m, *be).c_str());
  attach(fwd, c);
  Batch b;
  std::vector<int32_t> p;
  for (;;) {
    int64_t h[kHeaderFields];
    c.broadcast_idle(h, sizeof h);
    if (h[0] == kStop) return c.drain();
    if (h[0] != kStep || h[1] < 1 || h[1] > max_batch || h[3] < 0 || h[2] < 4 * h[1] + 2 * h[3])
      c.abort("a malformed step message from rank 0");
    const size_t M = size_t(h[1]);
    p.resize(size_t(h[2]));
    c.broadcast(p.data(), int64_t(p.size() * sizeof(int32_t)));
    b.tokens.assign(p.begin(), p.begin() + M);
    b.pos.assign(p.begin() + M, p.begin() + 2 * M);
    b.seq.assign(p.begin() + 2 * M, p.begin() + 3 * M);
    b.want_logits.assign(p.begin() + 3 * M, p.begin() + 4 * M);
    const size_t tables_end = p.size() - 2 * size_t(h[3]);
    for (size_t i = 4 * M; i + 2 <= tables_end;) {
      const size_t n = size_t(p[i + 1]);
      if (n > tables_end - i - 2) c.abort("a malformed block table from rank 0");
      kv.mirror_table(p[i], std::span<const int32_t>(p.data() + i + 2, n));
      i += 2 + n;
    }
    for (size_t i = tables_end; i < p.size(); i += 2) {
      if (std::min(p[i], p[i + 1]) < 0 || std::max(p[i], p[i + 1]) >= kv.total_blocks())
        c.abort("a malformed block copy from rank 0");
      kv.copy_block(p[i], p[i + 1]);
    }
    if (before_step) before_step();
    try {
      fwd.run(b, kv, nullptr);
    } catch (const std::exception& e) {  // rank 0 fails the same batch the same way
      std::fprintf(stderr, "firsttoken: rank %d: step failed: %s\n", c.rank(), e.what());
    }
  }
}

}  // namespace ft
