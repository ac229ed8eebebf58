#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>

#include "core/error.h"
#include "core/memory_lock.h"
#include "engine/tensor_parallel.h"
#include "profile/profiling_backend.h"
#include "profile/trace.h"

namespace ft {

// What submit and load_adapter say once shutdown() has begun.
constexpr const char* kShuttingDown = "the engine is shutting down";

class Engine::ModelExecutor final : public StepExecutor {
 public:
  // Steps run between the blocks of another (EngineCore::between_blocks) hold at most this many
  // tokens: short prompts (a longer one waits for the next step).
  static constexpr int64_t kBetweenMaxBatch = 256;
  ModelExecutor(const Model& m, Backend& be, int64_t max_batch, int64_t n_ctx, TpLeader* tp)
      : model_(m), fwd_(m, be, max_batch, n_ctx), tp_(tp) {
    // One process only (a step between blocks would need every rank); FT_STEP_YIELD=0: none.
    if (!tp_ && env_switch_on("FT_STEP_YIELD"))
      between_ = std::make_unique<Forward>(m, be, std::min(max_batch, kBetweenMaxBatch), n_ctx);
    if (tp_) attach(fwd_, tp_->comm());
    // Pipeline parallel: one step in flight per stage (FT_PP_STEPS_IN_FLIGHT=1: one at a time).
    if (const int pp = tp_ ? tp_->comm().pp_size() : 1; pp > 1) {
      const char* e = std::getenv("FT_PP_STEPS_IN_FLIGHT");
      in_flight_ = std::clamp(e ? std::atoi(e) : pp, 1, pp);
    }
  }
  void forward(const Batch& batch, KVCache& kv, float* logits, float* hidden) override {
    begin(batch, kv, logits, hidden);
    finish(logits, hidden);
  }
  int32_t max_in_flight() const override { return in_flight_; }
  void begin(const Batch& batch, KVCache& kv, float*, float*) override {
    if (tp_) tp_->send_step(batch, kv);  // the workers run the same step on their shards
    rows_.push_back(fwd_.begin(batch, kv));
  }
  void finish(float* logits, float* hidden) override {
    const Forward::Rows n = rows_.front();
    rows_.pop_front();
    fwd_.finish(n, logits, hidden);
  }
  int32_t n_vocab() const override { return model_.hparams().n_vocab; }
  int32_t n_tokens() const override { return model_.hparams().n_tokens; }
  int32_t n_embd() const override { return model_.hparams().dim; }
  Forward& fwd() { return fwd_; }
  // Yield points: after each attention and each FFN block but the last; as equal parts of a
  // step's time the layers (an FFN block, the longer of a layer's two, is at most ~2/3 of it).
  int32_t step_blocks() const override { return between_ ? model_.hparams().n_layers : 0; }
  int64_t between_max_batch() const override { return between_ ? between_->max_batch() : 0; }
  void forward_between(const Batch& batch, KVCache& kv, float* logits, float* hidden) override {
    between_->run(batch, kv, logits, hidden);
  }
  void set_between_blocks(std::function<void(double)> f) {
    if (between_) fwd_.set_between_blocks(std::move(f));
  }
  // LoRA's scratch of both forwards: made on any thread, enabled on the engine thread.
  struct LoraScratch {
    Forward::LoraScratch fwd, between;
  };
  LoraScratch lora_scratch() const {
    return {fwd_.lora_scratch(), between_ ? between_->lora_scratch() : Forward::LoraScratch{}};
  }
  void enable_lora(LoraScratch s) {
    fwd_.enable_lora(std::move(s.fwd));
    if (between_) between_->enable_lora(std::move(s.between));
  }

 private:
  const Model& model_;
  Forward fwd_;
  std::unique_ptr<Forward> between_;  // steps between fwd_'s blocks: activations of their own
  TpLeader* tp_;
  int32_t in_flight_ = 1;
  std::deque<Forward::Rows> rows_;  // per step in flight, oldest first: its output rows
};

// The draft model of speculative decoding (engine_core.h's Drafter): its own Forward and paged KV
// cache (no prefix caching), a sampler per sequence with the request's temperature and filters
// but no penalties, drawing each draft with the u the target verifies its position with (any
// drafts are exact: verify() samples the target's own token and compares).
// Per step it first catches each sequence up with its tokens (after truncating what it computed
// that the sequence no longer holds: rejected drafts), over all sequences at most the prompt
// tokens it can compute in the step's own predicted time (its measured cost per catch-up token;
// within [kMinCatchUp, kCatchUp]), so a prompt's draft prefill is spread over the first decode
// steps, never delays anyone's first token and at most doubles a step a new arrival may wait
// for; then one batched forward per draft position. A sequence
// drafts only while the tokens it must catch up are at most kCatchUpPerToken x the tokens it may
// still emit: a catch-up token costs about a draft-prefill token, and an accepted draft saves the
// most a token can, so catching up a long prompt for a short answer (and delaying every step it
// runs in) would not pay.
class Engine::DraftModelRunner final : public Drafter {
 public:
  static constexpr int64_t kCatchUp = 256;
  static constexpr int64_t kMinCatchUp = 8;
  static constexpr int64_t kCatchUpPerToken = 8;
  DraftModelRunner(const Model& m, Backend& be, const RuntimeConfig& rt, int32_t n_blocks, int32_t max_seqs)
      : model_(m), fwd_(m, be, kCatchUp + int64_t(max_seqs)),
        kv_(kv_cache_config(rt, m.hparams(), n_blocks, false)),
        logits_(size_t(max_seqs) * size_t(m.hparams().n_vocab)) {}

  void propose(std::span<Job> jobs, double catch_up_ms, SpecTimes& times) override {
    const HParams& hp = model_.hparams();
    const size_t V = size_t(hp.n_vocab);
    std::vector<Job*> active;  // jobs with a logits row this round
    int64_t prompt_tokens = 0;  // catch-up with a prompt (or after preemption) in round 0
    // Before a measurement: kMinCatchUp x 4.
    const int64_t budget0 = token_ms_ > 0 ? std::clamp<int64_t>(int64_t(catch_up_ms / token_ms_), kMinCatchUp, kCatchUp)
                                          : 4 * kMinCatchUp;
    int64_t budget = budget0;
    batch_.clear();
    for (Job& j : jobs) {
      auto [it, fresh] = seqs_.try_emplace(j.seq);
      State& st = it->second;
      if (fresh) {
        SamplingParams sp = *j.sampling;
        sp.repetition_penalty = 1;
        sp.presence_penalty = sp.frequency_penalty = 0;
        // The target's seed: draft i is drawn with the u the target's sampler verifies it with
        // (Sampler::seek), so where the two distributions agree so do their tokens.
        st.sampler = std::make_unique<Sampler>(sp, hp.n_tokens);
      }
      // Keep what still matches the sequence's tokens.
      size_t c = 0;
      while (c < st.fed.size() && c < j.tokens.size() && st.fed[c] == j.tokens[c]) ++c;
      st.fed.resize(c);
      kv_.truncate(j.seq, int64_t(c));
      const int64_t pending = int64_t(j.tokens.size()) - int64_t(c);
      if (pending > 1 && pending > kCatchUpPerToken * j.remaining) continue;
      const int64_t feed = std::min(pending, budget + 1);
      const bool full = feed == pending;
      // Positions: the pending tokens, then k - 1 drafts fed back.
      if (feed <= 0 || !kv_.reserve(j.seq, int64_t(c) + feed + (full ? j.k - 1 : 0))) continue;
      for (int64_t i = 0; i < feed; ++i) {
        const bool last = full && i + 1 == feed;
        batch_.add(j.tokens[c + size_t(i)], int32_t(c + size_t(i)), j.seq, last);
        st.fed.push_back(j.tokens[c + size_t(i)]);
      }
      budget -= feed - 1;  // the last token of a caught-up sequence is a decode, not catch-up
      // Prompt catch-up (for SpecTimes): a verification leaves at most 2 tokens to feed (the
      // last draft and the target's own); more, or the rest of an unfinished catch-up, is one.
      if (st.catching_up || pending > 2) prompt_tokens += full ? feed - 1 : feed;
      st.catching_up = !full;
      if (full) active.push_back(&j);
    }
    const int64_t caught_up = budget0 - budget;  // catch-up tokens in round 0 (beyond one per sequence)
    for (int32_t round = 0; batch_.size() > 0; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      fwd_.run(batch_, kv_, logits_.data());
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (round == 0 && prompt_tokens > 0) {
        times.catch_up_ms += ms;
        ++times.catch_up_forwards;
        times.catch_up_tokens += prompt_tokens;
      } else {
        times.draft_forward_ms += ms;
        ++times.draft_forwards;
      }
      if (round > 0) {  // a draft position alone
        position_ms_ = position_ms_ > 0 ? 0.8 * position_ms_ + 0.2 * ms : ms;
      } else if (caught_up >= kMinCatchUp && position_ms_ > 0) {  // round 0: a position plus the catch-up
        const double t = std::max(ms - position_ms_, 0.0) / double(caught_up);
        token_ms_ = token_ms_ > 0 ? 0.7 * token_ms_ + 0.3 * t : t;
      }
      batch_.clear();
      std::vector<Job*> next;
      for (size_t a = 0; a < active.size(); ++a) {
        Job& j = *active[a];
        State& st = seqs_.at(j.seq);
        st.sampler->seek(j.position + j.draft->size());
        const int32_t tok = st.sampler->sample(logits_.data() + a * V);
        j.draft->push_back(tok);
        if (int32_t(j.draft->size()) < j.k) {
          batch_.add(tok, int32_t(st.fed.size()), j.seq, true);
          st.fed.push_back(tok);
          next.push_back(&j);
        }
      }
      active.swap(next);
    }
  }

  void release(int32_t seq) override {
    kv_.release(seq);
    seqs_.erase(seq);
  }

 private:
  struct State {
    std::vector<int32_t> fed;  // tokens whose K/V its cache holds, in order
    bool catching_up = false;  // its last propose() fed part of what it had to catch up
    std::unique_ptr<Sampler> sampler;
  };
  const Model& model_;
  Forward fwd_;
  KVCache kv_;
  std::vector<float> logits_;
  Batch batch_;
  std::map<int32_t, State> seqs_;
  double position_ms_ = 0;  // EWMA of the rounds after the first
  double token_ms_ = 0;     // EWMA of a catch-up token's cost in round 0
};

void check_same_vocabulary(const Model& target, const Model& draft) {
  const auto a = target.file().get_str_array("tokenizer.ggml.tokens");
  const auto b = draft.file().get_str_array("tokenizer.ggml.tokens");
  const std::string names = cat("the draft model ", draft.file().path(), " and the target ", target.file().path());
  if (a.size() != b.size())
    fail(names, " do not share a tokenizer: ", b.size(), " vs ", a.size(), " tokens (speculative decoding needs the same vocabulary)");
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i])
      fail(names, " do not share a tokenizer: token ", i, " is '", b[i], "' vs '", a[i],
           "' (speculative decoding needs the same vocabulary)");
  if (draft.hparams().n_tokens != target.hparams().n_tokens)
    fail(names, " differ in token count: ", draft.hparams().n_tokens, " vs ", target.hparams().n_tokens);
}

std::unique_ptr<Model> load_draft_model(const std::string& path, const Model& target, const RopeOverrides& rope) {
  auto m = Model::load(path, rope);
  check_same_vocabulary(target, *m);
  return m;
}

int64_t resolve_n_ctx(const RuntimeConfig& rt, const HParams& hp) { return rt.n_ctx > 0 ? rt.n_ctx : hp.ctx_len; }

KVCacheConfig kv_cache_config(const RuntimeConfig& rt, const HParams& hp, int32_t n_blocks, bool prefix_caching) {
  KVCacheConfig kc;
  kc.n_layers = hp.n_layers;
  kc.kv_dim = hp.kv_dim();
  kc.n_kv_heads = hp.n_kv_heads;
  kc.type = rt.kv_type;
  kc.block_size = rt.kv_block_size;
  kc.n_blocks = n_blocks;
  kc.prefix_caching = prefix_caching;
  return kc;
}

EngineConfig single_request_config(const Model& model, int64_t n_ctx, int64_t chunk, int threads,
                                   GGMLType kv_type) {
  EngineConfig c;
  c.runtime.threads = threads;
  c.runtime.kv_type = kv_type;
  c.runtime.n_ctx = n_ctx;
  c.scheduler.chunk_size = chunk;
  c.scheduler.max_num_seqs = 1;
  c.scheduler.max_batch_tokens = 0;  // no more than a chunk needs (raised to it)
  const HParams& hp = model.hparams();
  const int32_t B = c.runtime.kv_block_size;
  const uint64_t block_bytes = KVCache::block_bytes(kv_cache_config(c.runtime, hp, 0, false));
  const uint64_t blocks = uint64_t(std::max(KVCache::blocks_for(resolve_n_ctx(c.runtime, hp), B), kMinKvBlocks));
  c.kv_memory_bytes = std::max(std::min(blocks, kDefaultMaxKvBytes / block_bytes), uint64_t(kMinKvBlocks)) * block_bytes;
  c.prefix_caching = false;
  c.calibrate = false;
  return c;
}

Engine::Engine(const Model& model, const EngineConfig& cfg, std::function<bool(int32_t)> is_eog)
    : model_(model), t0_(std::chrono::steady_clock::now()) {
  const HParams& hp = model.hparams();
  n_ctx_ = resolve_n_ctx(cfg.runtime, hp);
  sched_cfg_ = cfg.scheduler;
  adapter_pack_slice_ms_ = cfg.adapter_pack_slice_ms;
  if (sched_cfg_.max_num_seqs < 1) fail("max_num_seqs must be at least 1");
  const int32_t B = cfg.runtime.kv_block_size;
  if (B < 1) fail("KV block size must be positive");
  sched_cfg_.block_size = B;

  KVCacheConfig kc = kv_cache_config(cfg.runtime, hp, 0, cfg.prefix_caching);
  kc.geometry().validate();
  const uint64_t block_bytes = KVCache::block_bytes(kc);
  uint64_t kv_bytes = cfg.kv_memory_bytes;
  if (kv_bytes == 0) kv_bytes = std::min<uint64_t>(4ull * uint64_t(n_ctx_) / uint64_t(B) * block_bytes, kDefaultMaxKvBytes);
  kc.n_blocks = int32_t(std::min<uint64_t>(kv_bytes / block_bytes, 1u << 30));
  if (kc.n_blocks < kMinKvBlocks)
    fail("KV cache memory of ", kv_bytes, " bytes holds fewer than ", kMinKvBlocks, " blocks of ", block_bytes, " bytes");
  // A context the cache cannot hold is one no request could use (chat's default max_tokens, the
  // rest of it, would be refused as never fitting): the served context is what the cache holds.
  if (const int64_t holds = int64_t(kc.n_blocks) * B; holds < n_ctx_) {
    ctx_cut_from_ = n_ctx_;
    n_ctx_ = holds;
  }
  // A step holds a whole prompt chunk (no chunking: a whole context) and a decode token per sequence.
  // (Saturating: a chunk near INT64_MAX plus the sequences overflowed.)
  if (const int64_t chunk = sched_cfg_.chunk_size == 0 ? n_ctx_ : sched_cfg_.chunk_size; chunk > 0)
    sched_cfg_.max_batch_tokens = std::max<int64_t>(
        sched_cfg_.max_batch_tokens, chunk > std::numeric_limits<int64_t>::max() - sched_cfg_.max_num_seqs
                                         ? std::numeric_limits<int64_t>::max()
                                         : chunk + sched_cfg_.max_num_seqs);
  if (sched_cfg_.max_batch_tokens < sched_cfg_.max_num_seqs + 1)
    fail("max_batch_tokens (", sched_cfg_.max_batch_tokens, ") must exceed max_num_seqs (",
         sched_cfg_.max_num_seqs, ")");
  kv_ = std::make_unique<KVCache>(kc);

  backend_ = make_backend(cfg.runtime.backend, resolve_threads(cfg.runtime.threads));
  if (profile::enabled()) {  // every kernel call becomes a span; chosen once, free when off
    backend_ = profile::wrap_backend(std::move(backend_), model);
    const int64_t T = sched_cfg_.max_batch_tokens;
    profile::set_meta("model", std::string_view(hp.name.empty() ? hp.arch_name : hp.name));
    profile::set_meta("n_layers", int64_t(hp.n_layers));
    profile::set_meta("dim", int64_t(hp.dim));
    profile::set_meta("backend", backend_->name());
    profile::set_meta("threads", int64_t(backend_->threads()));
    profile::set_meta("weights_bytes", int64_t(model.weight_bytes()));
    // Forward's activation scratch: x, h (dim), q, attn (q_dim), k, v (kv_dim), gate (the wider FFN)
    // per token; a mixture of experts' router logits, gathered rows, outputs and sums.
    profile::set_meta("activation_bytes",
                      int64_t(4 * T * (2 * int64_t(hp.dim) + 2 * hp.q_dim() + 2 * hp.kv_dim() +
                                       std::max({hp.ffn_dim, hp.expert_ffn_dim, hp.shexp_ffn_dim}) +
                                       (hp.n_experts > 0 ? hp.n_experts + 3 * int64_t(hp.dim) + 4 * hp.n_experts_used +
                                                               (hp.ffn_act == GateAct::SwigluOai ? hp.expert_ffn_dim : 0)
                                                         : 0))));
    profile::set_meta("logits_bytes", int64_t(4 * int64_t(sched_cfg_.max_num_seqs) * hp.n_vocab));
    profile::set_meta("max_batch_tokens", T);
    profile::set_meta("kv_total_blocks", int64_t(kc.n_blocks));
    profile::set_meta("kv_block_bytes", int64_t(block_bytes));
    profile::set_meta("kv_block_size", int64_t(B));
    profile::set_meta("cost_model_calibrated", int64_t(cfg.calibrate));
  }
  if (cfg.tp) {
    if (cfg.tp->rank() != 0 || model.shard_count() != cfg.tp->tp_size() || model.stage_count() != cfg.tp->pp_size())
      fail("parallelism: the engine runs on rank 0 of ", cfg.tp->size(), " with the model sharded tp_size and staged "
           "pp_size ways");
    // Pipeline parallel: a lone prompt's chunks go through the stages one behind the other (n
    // chunks take n + pp - 1 stage-times instead of n x pp): auto mode's largest chunk is cut to
    // give 2 pp chunks where one process would run one, so the stages are busy most of the prompt.
    if (const int pp = cfg.tp->pp_size(); pp > 1)
      sched_cfg_.max_auto_chunk = std::max(sched_cfg_.min_chunk, sched_cfg_.max_auto_chunk / (2 * pp));
    tp_ = std::make_unique<TpLeader>(*cfg.tp);
    tp_->start(kc, sched_cfg_.max_batch_tokens, n_ctx_);
    kv_->record_copies(true);  // a fork's block copies: replayed on every rank with the next step
    if (profile::enabled()) {
      profile::set_meta("tp_size", int64_t(cfg.tp->tp_size()));
      profile::set_meta("pp_size", int64_t(cfg.tp->pp_size()));
    }
  }
  exec_ = std::make_unique<ModelExecutor>(model, *backend_, sched_cfg_.max_batch_tokens, n_ctx_, tp_.get());
  if (cfg.runtime.mlock) weights_summary_ = lock_weights(model, *backend_);
  CostModel cost;
  if (cfg.calibrate) {
    profile::Scope sc("calibrate", "engine");
    cost = calibrate();
  }
  core_ = std::make_unique<EngineCore>(*kv_, *exec_, sched_cfg_, cost, n_ctx_, std::move(is_eog),
                                       [this] { return now_ms(); });
  exec_->set_between_blocks([this](double done) { between_blocks(done); });
  if (cfg.spec.enabled()) {
    cfg.spec.validate();
    if (cfg.spec.method == SpecMethod::Draft) {
      if (!cfg.draft_model) fail("speculative decoding: method 'draft' without a draft model loaded");
      check_same_vocabulary(model, *cfg.draft_model);
      // Its cache holds as many positions as the target's.
      const KVCacheConfig dc = kv_cache_config(cfg.runtime, cfg.draft_model->hparams(), kc.n_blocks, false);
      dc.geometry().validate();
      drafter_ = std::make_unique<DraftModelRunner>(*cfg.draft_model, *backend_, cfg.runtime, kc.n_blocks,
                                                    sched_cfg_.max_num_seqs);
    }
    core_->set_speculation(cfg.spec, drafter_.get());
  }
  snapshot_.spec_method = cfg.spec.method;
  snapshot_.kv_total_blocks = kv_->total_blocks();
  snapshot_.kv_capacity_tokens = kv_->capacity_tokens();
  snapshot_.kv_bytes = kv_->bytes();
  snapshot_.cost = cost;
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  shutdown();
  std::unique_lock<std::mutex> lk(mu_);  // (a load woken by the shutdown still uses members)
  loads_cv_.wait(lk, [&] { return loads_in_flight_ == 0; });
}

// (The embedding table is locked as rows even when the output head is a packed copy of it.)
std::string lock_weights(const Model& model, Backend& backend) {
  try {
    uint64_t bytes = backend.lock_prepared();
    for (const GGUFTensorInfo& t : model.file().tensors())
      if (model.reads_tensor(t.name) && (!backend.has_copy_of(t.data) || t.data == model.weights().token_embd.data)) {
        lock_memory(t.data, t.n_bytes, cat("tensor '", t.name, "'"));
        bytes += t.n_bytes;
      }
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.1f", double(bytes) / double(1 << 20));
    return cat("weights locked in RAM (mlock): ", mib, " MiB");
  } catch (const Error& e) {
    return cat("warning: --mlock: ", e.what(), "; the weights stay pageable");
  }
}

std::string Engine::context_warning() const {
  if (ctx_cut_from_ == 0) return "";
  return cat("the KV cache holds ", n_ctx_, " tokens, fewer than the context of ", ctx_cut_from_,
             ": serving a context of ", n_ctx_, " tokens (raise --kv-memory or lower --ctx)");
}

std::string Engine::kv_summary() const {
  auto pages = [](bool huge) {
    return huge ? "huge pages advised" : huge_pages_wanted() ? "huge pages unavailable (4 KiB pages)" : "4 KiB pages (FT_HUGE_PAGES=0)";
  };
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.1f", double(exec_->fwd().scratch().size()) / double(1 << 20));
  return cat("KV cache: ", kv_->summary(), "; ", pages(kv_->huge_pages()), " | activations: ", mib, " MiB; ",
             pages(exec_->fwd().scratch().huge_pages()));
}

void Engine::reject(Pending& p, const std::string& why) {
  RequestTimings t;
  t.arrival_ms = p.req.arrival_ms;
  t.finish_ms = now_ms();
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::Finished;
  ev.reason = FinishReason::Error;
  ev.error = cat("the request could not start: ", why);
  ev.n_prompt = int64_t(p.req.prompt.size());
  ev.timings = &t;
  for (size_t k = 0; k <= p.req.forks.size(); ++k) {  // the request, then its forks
    const EventCallback& cb = k == 0 ? p.cb : p.req.forks[k - 1].cb;
    ev.id = p.id + k;
    if (!cb) continue;
    try {
      cb(ev);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "firsttoken: request %llu: event callback failed: %s\n", (unsigned long long)ev.id, e.what());
    }
  }
}

double Engine::now_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
}

// Times a few forward passes on a scratch sequence and fits the scheduler's cost model:
// base + per_token * tokens from chunks of 1, 32 and 128 tokens at an empty context, and the
// attention term from a 32-token chunk after a longer context.
CostModel Engine::calibrate() {
  constexpr int32_t kSeq = -1;
  std::vector<float> logits(size_t(model_.hparams().n_vocab));
  auto time_chunk = [&](int64_t start, int64_t n) {
    Batch b;
    for (int64_t i = 0; i < n; ++i) b.add(int32_t(1 + (i % 7)), int32_t(start + i), kSeq, i == n - 1);
    const double t = now_ms();
    exec_->forward(b, *kv_, logits.data(), nullptr);  // (tensor parallel: on every rank)
    return now_ms() - t;
  };
  CostModel c;
  const int64_t max_n = std::min<int64_t>({128, sched_cfg_.max_batch_tokens, n_ctx_ / 2});
  const int64_t ctx = std::min<int64_t>(256, n_ctx_ / 2);
  if (max_n < 8 || !kv_->reserve(kSeq, std::max(max_n, ctx + 32))) return c;
  time_chunk(0, 8);  // warm-up
  const std::vector<int64_t> sizes = {1, std::min<int64_t>(32, max_n), max_n};
  std::vector<double> ts;
  for (int64_t n : sizes) ts.push_back(std::min(time_chunk(0, n), time_chunk(0, n)));
  // Least squares fit of t = a + b n.
  double sn = 0, st = 0, snn = 0, snt = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sn += double(sizes[i]);
    st += ts[i];
    snn += double(sizes[i]) * double(sizes[i]);
    snt += double(sizes[i]) * ts[i];
  }
  const double k = double(sizes.size());
  const double den = k * snn - sn * sn;
  c.per_token_ms = std::max(1e-6, den != 0 ? (k * snt - sn * st) / den : ts.back() / double(sizes.back()));
  c.base_ms = std::max(0.0, (st - c.per_token_ms * sn) / k);
  if (ctx >= 64) {
    for (int64_t s = 0; s < ctx; s += max_n) time_chunk(s, std::min(max_n, ctx - s));
    const double t = time_chunk(ctx, 32);
    const double pairs = 32.0 * double(ctx) + 32.0 * 33.0 / 2;
    c.per_attn_ms = std::max(0.0, (t - c.predict(32, 0)) / pairs);
  }
  kv_->release(kSeq);
  return c;
}

uint64_t Engine::submit(EngineRequest req, EventCallback cb) {
  core_->validate(req);  // reads only immutable configuration: safe off the engine thread
  if (req.arrival_ms < 0) req.arrival_ms = now_ms();  // queueing starts now, not when the loop sees it
  if (profile::enabled() && req.trace_arrival_ns == 0) req.trace_arrival_ns = profile::now_ns();
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_) fail(kShuttingDown);
  const int64_t n = int64_t(req.prompt.size());
  if (req.ttft_slo_ms <= 0) req.ttft_slo_ms = default_ttft_slo_ms(sched_cfg_, snapshot_.cost, n);
  const QueuedPrefill queued{req.priority, req.arrival_ms + req.ttft_slo_ms, predict_prefill_ms(snapshot_.cost, 0, n)};
  if (sched_cfg_.reject_late_factor > 0) {
    std::vector<QueuedPrefill> queue = queue_snapshot_;
    for (const Pending& p : incoming_) queue.push_back(p.queued);
    const double ttft = predict_ttft_ms(queue, queued);
    if (ttft > sched_cfg_.reject_late_factor * req.ttft_slo_ms) {
      ++snapshot_.rejected_late;
      double ahead = 0;  // the work queued before it: when a retry may fare better
      for (const QueuedPrefill& q : queue) ahead += q.remaining_ms;
      throw DeadlineError(cat("the request would get its first token in about ", int64_t(ttft), " ms, past its ",
                              int64_t(req.ttft_slo_ms), " ms deadline; retry later"),
                          std::max<int64_t>(1, int64_t(std::ceil(ahead / 1e3))));
    }
  }
  const uint64_t id = next_id_;
  next_id_ += 1 + req.forks.size();  // its forks' ids follow
  incoming_.push_back({id, std::move(req), std::move(cb), queued});
  has_incoming_.store(true, std::memory_order_release);
  cv_.notify_one();
  return id;
}

std::shared_ptr<const LoraAdapter> Engine::load_adapter(const std::string& name, const std::string& path,
                                                        bool replace) {
  if (name.empty()) fail("a LoRA adapter needs a name");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) fail(kShuttingDown);  // (before mapping and packing a whole file)
    ++loads_in_flight_;
  }
  struct InFlight {  // (declared first: left last, after every local that uses the engine)
    Engine* e;
    ~InFlight() {
      std::lock_guard<std::mutex> lk(e->mu_);
      if (--e->loads_in_flight_ == 0) e->loads_cv_.notify_all();
    }
  } in_flight{this};
  if (sched_cfg_.max_active_adapters < 1)
    fail("LoRA adapter '", name, "': adapters are off (max_active_adapters is 0)");
  const bool taken = find_adapter(name) != nullptr;
  if (!replace && taken) fail("a LoRA adapter named '", name, "' is already loaded");
  // Loads under way count, as they will; a replacement adds one when requests hold the one it
  // replaces (it stays until they finish: 40 in-place loads, each under a stream, held 40 copies).
  int64_t held = 0;
  bool adds = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    held = loads_in_flight_ - 1;
  }
  {
    std::lock_guard<std::mutex> lk(adapters_mu_);
    held += adapters_resident_locked();
    if (auto it = adapters_.find(name); it != adapters_.end()) adds = it->second.use_count() > 1;
  }
  {
    if (adds && held >= sched_cfg_.max_loaded_adapters)
      fail("LoRA adapter '", name, "': ", held, " adapters are loaded or loading, the most this server holds (",
           sched_cfg_.max_loaded_adapters, ", max_loaded_adapters); unload one first");
  }
  std::shared_ptr<LoraAdapter> a = LoraAdapter::load(path, model_);
  // Packed on the engine thread between steps, a slice of kAdapterPackSliceMs at a time, so that
  // streams running meanwhile pay its packing time spread over their steps (LoraAdapter::
  // prepare_some). TinyLlama's rank-16 F16 adapter (25 MB) on the Zen 5's 2 cores, 2 compute
  // threads: packed in one go there, a 68-90 ms stall; on this (loading) thread beside the steps,
  // ~180 ms of added step time (a core taken from every forward). The forwards' LoRA scratch is
  // made here and only taken there.
  auto scratch = std::make_shared<ModelExecutor::LoraScratch>();
  if (!lora_enabled_.load()) *scratch = exec_->lora_scratch();
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  // (a task: one slice, then itself again after the next step until packed. a: alive until the
  // promise is kept, which f.get() below waits for; not owned, so an unload never counts a
  // finished load's task as a user.)
  struct PackSlice {
    Engine* e;
    LoraAdapter* a;
    std::shared_ptr<ModelExecutor::LoraScratch> scratch;
    std::shared_ptr<std::promise<void>> done;
    void operator()() const {
      try {
        {
          std::lock_guard<std::mutex> lk(e->mu_);
          if (e->stop_) fail(kShuttingDown);  // (shutdown runs each task once)
        }
        if (!a->prepare_some(*e->backend_, e->adapter_pack_slice_ms_)) {
          std::lock_guard<std::mutex> lk(e->mu_);
          e->tasks_.push_back(*this);
          return;
        }
        if (!e->lora_enabled_.load()) e->exec_->enable_lora(std::move(*scratch));
        e->lora_enabled_.store(true);
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    }
  };
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) fail(kShuttingDown);
    tasks_.push_back(PackSlice{this, a.get(), scratch, done});
    cv_.notify_one();
  }
  f.get();
  std::shared_ptr<const LoraAdapter> old;  // (replaced: freed after the lock, unless requests hold it)
  std::lock_guard<std::mutex> lk(adapters_mu_);
  auto [it, added] = adapters_.emplace(name, a);
  if (!added) {
    if (!replace) fail("a LoRA adapter named '", name, "' is already loaded");
    // (Checked again: a request may have taken the old one while this one was packed.)
    if (it->second.use_count() > 1 && adapters_resident_locked() + 1 > sched_cfg_.max_loaded_adapters)
      fail("LoRA adapter '", name, "': requests hold the adapter it replaces, and with it ", sched_cfg_.max_loaded_adapters + 1,
           " would be loaded, more than this server holds (max_loaded_adapters); retry when they have finished");
    old = std::exchange(it->second, a);
    if (old.use_count() > 1) replaced_.push_back(old);  // (held by requests besides `old`)
  }
  return a;
}

int64_t Engine::adapters_resident_locked() {
  std::erase_if(replaced_, [](const std::weak_ptr<const LoraAdapter>& w) { return w.expired(); });
  return int64_t(adapters_.size() + replaced_.size());
}

int Engine::adapter_loads_in_flight() const {
  std::lock_guard<std::mutex> lk(mu_);
  return loads_in_flight_;
}

void Engine::unload_adapter(const std::string& name, std::chrono::milliseconds grace) {
  std::shared_ptr<const LoraAdapter> a;
  // One unload waits at a time (a server answers these on its one blocking-work thread: many
  // unloads of a held adapter would each hold it for the grace); the others answer at once.
  struct Waiting {
    std::atomic<int>& n;
    ~Waiting() { --n; }
  } waiting{unloads_waiting_};
  if (unloads_waiting_++ > 0) grace = std::chrono::milliseconds(0);
  const auto until = std::chrono::steady_clock::now() + grace;
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(adapters_mu_);
      auto it = adapters_.find(name);
      if (it == adapters_.end()) throw AdapterNotFound(cat("no LoRA adapter named '", name, "' is loaded"));
      // Requests hold their adapter until they finish; new ones take it from here, under this lock.
      const long users = it->second.use_count() - 1;
      if (users == 0) {
        a = std::move(it->second);
        adapters_.erase(it);
        break;
      }
      if (std::chrono::steady_clock::now() >= until)
        fail("the LoRA adapter '", name, "' is in use by ", users, " request(s); unload it when they have finished");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // (a's packed copies go back to the backend as it is destroyed here: nothing can reach them.)
}

std::shared_ptr<const LoraAdapter> Engine::find_adapter(const std::string& name) const {
  std::lock_guard<std::mutex> lk(adapters_mu_);
  auto it = adapters_.find(name);
  return it == adapters_.end() ? nullptr : it->second;
}

std::vector<std::pair<std::string, std::string>> Engine::adapter_files() const {
  std::lock_guard<std::mutex> lk(adapters_mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, a] : adapters_) out.emplace_back(name, a->path());
  return out;
}

std::optional<std::string> Engine::adapter_file(const std::string& name) const {
  std::lock_guard<std::mutex> lk(adapters_mu_);
  auto it = adapters_.find(name);
  if (it == adapters_.end()) return std::nullopt;
  return it->second->path();
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancels_.push_back(id);
  cv_.notify_one();
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  if (tp_) {  // (the engine thread, the only other caller of MPI, has ended)
    tp_->stop();
    const CommStats& st = tp_->comm().stats();
    if (profile::enabled()) {
      profile::set_meta("tp_allreduces", int64_t(st.allreduces));
      profile::set_meta("tp_allreduce_ms", double(st.allreduce_ns) / 1e6);
      profile::set_meta("tp_broadcast_ms", double(st.broadcast_ns) / 1e6);
      profile::set_meta("pp_transfers", int64_t(st.transfers));
      profile::set_meta("pp_transfer_ms", double(st.transfer_ns) / 1e6);
    }
  }
}

void Engine::add_to_core(std::deque<Pending>& adds) {
  for (auto& p : adds) {
    try {
      core_->add(p.id, p.req, p.cb);  // copies: p stays whole for reject()
    } catch (const std::exception& e) {  // validated at submit: an allocation failure
      std::fprintf(stderr, "firsttoken: request %llu rejected: %s\n", (unsigned long long)p.id, e.what());
      reject(p, e.what());
    }
  }
  adds.clear();
}

void Engine::between_blocks(double done) {
  if (has_incoming_.load(std::memory_order_acquire)) {  // (no lock taken between blocks otherwise)
    std::deque<Pending> adds;
    {
      std::lock_guard<std::mutex> lk(mu_);
      adds.swap(incoming_);
      has_incoming_.store(false, std::memory_order_relaxed);
      for (const Pending& p : adds) queue_snapshot_.push_back(p.queued);  // in the core from now on
    }
    add_to_core(adds);
  }
  core_->between_blocks(done);
}

void Engine::loop() {
  profile::set_thread_name("engine");
  std::deque<Pending> adds;
  std::vector<uint64_t> cancels;
  std::vector<std::function<void()>> tasks;
  for (;;) {
    // Pipeline parallel: what rank 0 posted for the last steps is taken before it sleeps.
    if (tp_ && core_->idle()) tp_->drain();
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !incoming_.empty() || !cancels_.empty() || !tasks_.empty() || !core_->idle(); });
      tasks.swap(tasks_);
      adds.swap(incoming_);
      has_incoming_.store(false, std::memory_order_relaxed);
      for (const Pending& p : adds) queue_snapshot_.push_back(p.queued);  // in the core from now on
      cancels.swap(cancels_);
      if (stop_) break;
    }
    for (auto& t : tasks) t();  // (each reports its own failure)
    tasks.clear();
    // Nothing thrown here leaves the thread: a request that fails to start fails alone (its
    // callback hears why); a failed step fails the requests it ran and the engine goes on.
    add_to_core(adds);
    try {
      for (uint64_t id : cancels) core_->cancel(id);
      if (!core_->step() && tp_) tp_->drain();  // (no forward this turn: nothing drives MPI's progress)
    } catch (const std::exception& e) {
      std::fprintf(stderr, "firsttoken: engine step failed, failing the requests it ran: %s\n", e.what());
      core_->fail_running(cat("generation failed: ", e.what()));
    }
    cancels.clear();
    std::lock_guard<std::mutex> lk(mu_);
    snapshot_.counters = core_->counters();
    snapshot_.running = core_->n_running();
    snapshot_.waiting = core_->n_waiting() + int32_t(incoming_.size());
    snapshot_.kv_used_blocks = kv_->used_blocks();
    snapshot_.kv_cached_blocks = kv_->cached_blocks();
    snapshot_.kv = kv_->stats();
    snapshot_.cost = core_->cost_model();
    snapshot_.step_time_error = core_->prediction_errors();
    queue_snapshot_ = core_->queued_prefills();
    if (!core_->steps().empty() && (steps_snapshot_.empty() || steps_snapshot_.back().start_ms != core_->steps().back().start_ms)) {
      steps_snapshot_.push_back(core_->steps().back());
      if (steps_snapshot_.size() > 4096) steps_snapshot_.pop_front();
    }
  }
  // Shutdown: tasks still run (a load_adapter waits for its own), then whatever never reached the
  // core and everything in it finishes as cancelled.
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& t : tasks_) tasks.push_back(std::move(t));
    tasks_.clear();
  }
  for (auto& t : tasks) t();
  for (auto& p : adds) {
    try {
      core_->add(p.id, p.req, p.cb);
    } catch (const std::exception& e) {
      reject(p, e.what());
    }
  }
  try {
    core_->finish_in_flight();  // (their rows are on their way: taken before the workers stop)
  } catch (const std::exception& e) {  // (nothing leaves the thread, at shutdown either)
    std::fprintf(stderr, "firsttoken: the last step in flight failed at shutdown: %s\n", e.what());
    core_->fail_running(cat("generation failed: ", e.what()));
  }
  core_->cancel_all();
  if (profile::enabled()) {
    const KVCacheStats st = kv_->stats();
    profile::set_meta("prefix_queries", int64_t(st.prefix_queries));
    profile::set_meta("prefix_query_tokens", int64_t(st.prefix_query_tokens));
    profile::set_meta("prefix_hit_tokens", int64_t(st.prefix_hit_tokens));
    profile::set_meta("kv_evictions", int64_t(st.evictions));
    profile::set_meta("max_steps_in_flight", int64_t(core_->counters().max_steps_in_flight));
  }
  std::lock_guard<std::mutex> lk(mu_);
  snapshot_.counters = core_->counters();
  snapshot_.running = snapshot_.waiting = 0;
  snapshot_.kv_used_blocks = kv_->used_blocks();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  return snapshot_;
}

std::vector<StepRecord> Engine::recent_steps(size_t max) const {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t n = std::min(max, steps_snapshot_.size());
  return std::vector<StepRecord>(steps_snapshot_.end() - std::ptrdiff_t(n), steps_snapshot_.end());
}

EventCallback EventStream::callback() {
  std::shared_ptr<State> st = st_;
  return [st](const EngineEvent& ev) {
    std::lock_guard<std::mutex> lk(st->mu);
    st->events.push_back(ev);
    if (ev.kind == EngineEvent::Kind::Finished) {
      st->timings = *ev.timings;
      st->events.back().timings = nullptr;
      st->done = true;
    }
    st->cv.notify_one();
  };
}

bool EventStream::next(EngineEvent& ev, RequestTimings* timings) {
  if (finished_) return false;
  std::unique_lock<std::mutex> lk(st_->mu);
  st_->cv.wait(lk, [&] { return !st_->events.empty(); });
  ev = st_->events.front();
  st_->events.pop_front();
  if (ev.kind == EngineEvent::Kind::Finished) {
    finished_ = true;
    if (timings) *timings = st_->timings;
  }
  return true;
}

}  // namespace ft
