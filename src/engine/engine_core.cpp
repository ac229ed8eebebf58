#include "engine/engine_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "profile/trace.h"

namespace ft {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::None: return "none";
    case Pooling::Mean: return "mean";
    case Pooling::Cls: return "cls";
    case Pooling::Last: return "last";
  }
  return "?";
}

namespace {

// A step's buffer that a much smaller step uses is given back past 64 MiB: one step of many
// logits rows (prompt logprobs: up to max_batch_tokens x n_vocab floats, ~1 GB on a 152K
// vocabulary) kept it for the rest of the process.
void trim_buffer(std::vector<float>& v) {
  constexpr size_t kKeptFloats = (size_t(64) << 20) / sizeof(float);
  if (v.capacity() > kKeptFloats && v.capacity() > 4 * v.size()) v.shrink_to_fit();
}
constexpr size_t kStepHistory = 4096;  // step records kept for the profiler/metrics

// Log-probabilities of the model's distribution (the logits after the request's LogitsProcessor,
// before penalties, temperature and filters), for the sampled token and the n most likely ones
// (tokens a processor masked out, -inf, are never among them). A NaN logit is no candidate, as
// in the sampler: it is left out of the normalization (it made every logprob NaN).
void fill_logprobs(const float* logits, int32_t V, int32_t token, int32_t n, float& logprob,
                   std::vector<std::pair<int32_t, float>>& top, int32_t* rank = nullptr) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < V; ++i) mx = std::max(mx, logits[i]);  // (NaN never wins: max(mx, NaN) = mx)
  double sum = 0;
  for (int32_t i = 0; i < V; ++i)
    if (!std::isnan(logits[i])) sum += std::exp(double(logits[i] - mx));
  const float log_z = mx + float(std::log(sum));
  logprob = logits[token] - log_z;
  if (rank) {
    int32_t above = 0;
    for (int32_t i = 0; i < V; ++i) above += logits[i] > logits[token];
    *rank = 1 + above;
  }
  top.clear();
  if (n <= 0) return;
  // Keep the n best in a small sorted list (n <= kMaxLogprobs).
  for (int32_t i = 0; i < V; ++i) {
    const float lp = logits[i] - log_z;
    if (!std::isfinite(lp)) continue;
    if (int32_t(top.size()) == n && lp <= top.back().second) continue;
    auto pos = std::find_if(top.begin(), top.end(), [&](const auto& e) { return lp > e.second; });
    top.insert(pos, {i, lp});
    if (int32_t(top.size()) > n) top.pop_back();
  }
}
}  // namespace

EngineCore::EngineCore(KVCache& kv, StepExecutor& exec, const SchedulerConfig& cfg, const CostModel& cost,
                       int64_t n_ctx, std::function<bool(int32_t)> is_eog, std::function<double()> now)
    : kv_(kv), exec_(exec), cfg_(cfg), cost_(cost), n_ctx_(n_ctx), is_eog_(std::move(is_eog)), now_(std::move(now)) {
  started_ms_ = now_();
  cfg_.block_size = kv.config().block_size;
}

void EngineCore::set_speculation(const SpecConfig& spec, Drafter* drafter) {
  if (spec.enabled()) spec.validate();
  if (spec.method == SpecMethod::Draft && !drafter) fail("speculative decoding with a draft model needs one");
  spec_ = spec;
  drafter_ = spec.method == SpecMethod::Draft ? drafter : nullptr;
}

int32_t EngineCore::spec_k(Req& r) const {
  if (!r.speculate) return 0;
  int32_t k = spec_.k;
  if (spec_.k_auto) {
    // One more scored position costs per_token of a decode step's base + per_token.
    const CostModel& c = cost_.model();
    const double step = c.predict(1, double(r.tokens.size()));
    const double rel = step > 0 ? (c.per_token_ms + c.per_attn_ms * double(r.tokens.size())) / step : 1;
    k = auto_spec_k(r.t.spec.alpha, rel, spec_.k);
    // Drafts that stopped paying are tried again now and then (the running rate only moves with
    // verifications).
    if (k == 0 && r.steps_without_draft >= 16) k = 1;
  }
  // Every token it may still emit (drafts accepted + one of the target's) and every position.
  k = int32_t(std::min<int64_t>({k, r.max_tokens - r.n_generated - 1, n_ctx_ - int64_t(r.tokens.size())}));
  return std::max(k, 0);
}

void EngineCore::validate(const EngineRequest& r) const {
  const int64_t n = int64_t(r.prompt.size());
  if (n == 0) fail("the prompt is empty");
  const int32_t V = exec_.n_tokens();
  for (int32_t t : r.prompt)
    if (t < 0 || t >= V) fail("prompt token id ", t, " is out of range [0, ", V, ")");
  const bool embeds = r.pooling != Pooling::None;
  if (embeds) {
    if (exec_.n_embd() <= 0) fail("this engine computes no embeddings");
    if (!r.forks.empty() || r.logprobs >= 0 || r.prompt_logprobs >= 0 || r.logits_processor)
      fail("an embedding samples nothing: no choices, logprobs or logits processor");
  } else if (r.max_tokens < 1) {
    fail("max_tokens must be at least 1, got ", r.max_tokens);
  }
  const int64_t generated = embeds ? 0 : r.max_tokens;
  if (r.adapter && cfg_.max_active_adapters < 1)
    fail("LoRA adapters are off (max_active_adapters is 0); the request names adapter ", r.adapter->path());
  if (r.logprobs > kMaxLogprobs) fail("logprobs must be at most ", kMaxLogprobs, ", got ", r.logprobs);
  if (r.prompt_logprobs > kMaxLogprobs) fail("prompt_logprobs must be at most ", kMaxLogprobs, ", got ", r.prompt_logprobs);
  ft::validate(r.sampling);
  if (n > n_ctx_ || generated > n_ctx_ - n)  // no n + max_tokens: max_tokens may be near INT64_MAX
    fail("the prompt (", n, " tokens)", embeds ? "" : cat(" plus max_tokens (", r.max_tokens, ")"),
         " exceeds the context length of ", n_ctx_, " tokens");
  const int32_t need = KVCache::blocks_for(n + generated, kv_.config().block_size);
  if (need > kv_.total_blocks())
    fail("the request needs ", need, " KV cache blocks (", n + generated, " tokens) but the cache has only ",
         kv_.total_blocks(), "; it can never fit");
}

void EngineCore::add(uint64_t id, EngineRequest in, EventCallback cb) {
  validate(in);
  for (uint64_t k = 0; k <= in.forks.size(); ++k) {
    bool taken = reqs_.count(id + k) != 0;
    for (const auto& [pid, p] : reqs_)
      for (const Req::PendingFork& f : p.forks) taken |= f.id == id + k;
    if (taken) fail("duplicate request id ", id + k);
  }
  Req r;  // built aside: a throw leaves no half-made request behind
  r.id = id;
  r.seq = int32_t(id & 0x7fffffff);
  r.n_prompt = int64_t(in.prompt.size());
  r.tokens = std::move(in.prompt);
  r.pooling = in.pooling;
  r.max_tokens = r.pooling == Pooling::None ? in.max_tokens : 0;
  r.tokens.reserve(size_t(r.n_prompt + r.max_tokens));
  r.ignore_eos = in.ignore_eos;
  r.logprobs = in.logprobs;
  r.prompt_logprobs = in.prompt_logprobs;
  r.sampler = std::make_unique<Sampler>(in.sampling, exec_.n_tokens());
  r.sampler->add_prompt(r.tokens);
  r.processor = std::move(in.logits_processor);
  r.adapter = std::move(in.adapter);
  r.salt = prefix_salt(r.adapter ? r.adapter->uid() : 0, in.cache_salt);
  // A processor sees one row at a time, in order; a stateful sampler draws every token itself.
  r.speculate = spec_.enabled() && !r.processor && !r.sampler->stateful() && r.pooling == Pooling::None;
  r.cb = std::move(cb);
  for (size_t k = 0; k < in.forks.size(); ++k) r.forks.push_back({id + 1 + k, std::move(in.forks[k])});
  r.t.arrival_ms = in.arrival_ms >= 0 ? in.arrival_ms : now_();
  r.deadline_ms = r.t.arrival_ms +
                  (in.ttft_slo_ms > 0 ? in.ttft_slo_ms : default_ttft_slo_ms(cfg_, cost_.model(), r.n_prompt));
  r.priority = in.priority;
  r.t.tokenize_ms = in.tokenize_ms;
  if (profile::enabled()) r.trace_arrival_ns = in.trace_arrival_ns > 0 ? in.trace_arrival_ns : profile::now_ns();
  if (reqs_.empty() && idle_since_ >= 0) {
    r.follow_up = r.t.arrival_ms >= idle_since_ && r.t.arrival_ms - idle_since_ < cfg_.follow_up_ms;
    // The same client's next request: when the request it follows is the only arrival in the
    // window, that one was the client's first, not another client's (one client at a time shows
    // no traffic at all). With others in the window it stays: it may have been anyone's.
    const double now = now_();
    std::erase_if(past_arrivals_, [&](double a) { return now - a > cfg_.arrival_window_ms; });
    if (r.follow_up && past_arrivals_.size() == 1 && past_arrivals_.back() == idle_by_arrival_) past_arrivals_.clear();
    follow_ups_.emplace_back(idle_since_, std::min(cfg_.follow_up_ms, std::max(0.0, now - idle_since_)));
    idle_since_ = -1;
  }
  reqs_.emplace(id, std::move(r));
}

void EngineCore::emit(Req& r, const EngineEvent& ev) {
  if (!r.cb) return;
  try {
    r.cb(ev);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "firsttoken: request %llu: event callback failed: %s\n", (unsigned long long)r.id, e.what());
  } catch (...) {
    std::fprintf(stderr, "firsttoken: request %llu: event callback failed\n", (unsigned long long)r.id);
  }
}

void EngineCore::finish(Req& r, FinishReason why, const std::string& error, bool request_error) {
  if (r.in_flight)  // (cancelled, or failed, mid-flight: that step's rows for it are dropped)
    for (Flight& f : in_flight_) {
      for (RowGroup& g : f.groups)
        if (g.r == &r) g.r = nullptr;
      for (PromptRows& p : f.prompt_rows)
        if (p.r == &r) p.r = nullptr;
      for (PromptRows& p : f.hidden_rows)
        if (p.r == &r) p.r = nullptr;
    }
  kv_.release(r.seq);
  r.adapter.reset();  // before the event: a client told it finished may unload the adapter at once
  if (drafter_) drafter_->release(r.seq);
  const bool counted = !r.forked && !r.follow_up;
  if (counted) past_arrivals_.push_back(r.t.arrival_ms);
  r.t.finish_ms = now_();
  ++counters_.finished;
  if (why == FinishReason::Cancelled) ++counters_.cancelled;
  if (!r.forked) counters_.prompt_tokens += uint64_t(r.n_prompt);  // (a request's n choices share one prompt)
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::Finished;
  ev.id = r.id;
  ev.reason = why;
  ev.error = error;
  ev.request_error = request_error;
  ev.n_prompt = r.n_prompt;
  ev.n_generated = r.n_generated;
  if (r.pooling != Pooling::None && why == FinishReason::Stop) {
    ev.embedding.resize(r.pool.size());
    for (size_t d = 0; d < r.pool.size(); ++d) ev.embedding[d] = float(r.pool[d] / double(r.pooled));
  }
  ev.timings = &r.t;
  emit(r, ev);
  for (Req::PendingFork& f : r.forks) finish_fork(f, r, why, error);  // it never reached its first token
  if (profile::enabled() && r.trace_arrival_ns > 0) {
    // The request's track: arrival -> first scheduled (queue) -> first token (prefill) -> finish.
    const int64_t t_end = profile::now_ns();
    const int64_t t_sched = r.trace_scheduled_ns > 0 ? r.trace_scheduled_ns : t_end;
    const int64_t t_first = r.trace_first_token_ns > 0 ? r.trace_first_token_ns : t_end;
    profile::Args a;
    a.i("req", int64_t(r.id)).i("prompt", r.n_prompt).i("cached", r.t.cached_tokens).i("generated", r.n_generated);
    a.i("prefill_steps", r.t.prefill_steps).i("preemptions", r.t.preemptions).s("finish", finish_reason_name(why));
    if (r.t.spec.drafts > 0)
      a.i("spec_drafts", r.t.spec.drafts).i("spec_draft_tokens", r.t.spec.draft_tokens).i("spec_accepted", r.t.spec.accepted_tokens);
    profile::async_span("request", "request", r.id, r.trace_arrival_ns, t_end, a);
    profile::async_span("queue", "request", r.id, r.trace_arrival_ns, t_sched);
    if (r.trace_scheduled_ns > 0) profile::async_span("prefill", "request", r.id, t_sched, t_first);
    if (r.trace_first_token_ns > 0) profile::async_span("decode", "request", r.id, t_first, t_end);
  }
  const double counted_arrival = counted ? r.t.arrival_ms : -1;
  reqs_.erase(r.id);  // (r is gone)
  if (reqs_.empty()) {
    idle_since_ = now_();
    idle_by_arrival_ = counted_arrival;
  }
}

void EngineCore::finish_fork(Req::PendingFork& f, const Req& parent, FinishReason why, const std::string& error) {
  ++counters_.finished;
  if (why == FinishReason::Cancelled) ++counters_.cancelled;
  RequestTimings t = parent.t;
  t.finish_ms = now_();
  EngineEvent ev;
  ev.kind = EngineEvent::Kind::Finished;
  ev.id = f.id;
  ev.reason = why;
  ev.error = error;
  ev.n_prompt = parent.n_prompt;
  ev.timings = &t;
  if (!f.f.cb) return;
  try {
    f.f.cb(ev);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "firsttoken: request %llu: event callback failed: %s\n", (unsigned long long)f.id, e.what());
  } catch (...) {
    std::fprintf(stderr, "firsttoken: request %llu: event callback failed\n", (unsigned long long)f.id);
  }
}

void EngineCore::cancel(uint64_t id) {
  auto it = reqs_.find(id);
  if (it != reqs_.end()) return finish(it->second, FinishReason::Cancelled);
  for (auto& [pid, p] : reqs_)
    for (auto f = p.forks.begin(); f != p.forks.end(); ++f)
      if (f->id == id) {
        Req::PendingFork gone = std::move(*f);
        p.forks.erase(f);
        return finish_fork(gone, p, FinishReason::Cancelled);
      }
}

std::vector<EngineCore::Req*> EngineCore::spawn_forks(Req& r) {
  std::vector<Req*> out;
  int32_t running = n_running();
  for (Req::PendingFork& pf : r.forks) {
    Req c;
    c.id = pf.id;
    c.seq = int32_t(pf.id & 0x7fffffff);
    c.tokens = r.tokens;  // the prompt (its first token is not pushed yet)
    c.tokens.reserve(r.tokens.capacity());
    c.n_prompt = r.n_prompt;
    c.max_tokens = r.max_tokens;
    c.ignore_eos = r.ignore_eos;
    c.logprobs = r.logprobs;
    c.deadline_ms = r.deadline_ms;
    c.priority = r.priority;
    SamplingParams sp = r.sampler->params();
    sp.seed = pf.f.seed;
    c.sampler = std::make_unique<Sampler>(sp, exec_.n_tokens());
    c.sampler->add_prompt(c.tokens);
    c.processor = std::move(pf.f.logits_processor);
    c.adapter = r.adapter;
    c.salt = r.salt;
    c.speculate = spec_.enabled() && !c.processor && !c.sampler->stateful();
    c.forked = true;
    c.cb = std::move(pf.f.cb);
    c.t = r.t;
    c.trace_arrival_ns = r.trace_arrival_ns;
    c.trace_scheduled_ns = r.trace_scheduled_ns;
    // No room: it waits, and recomputes its prompt (and first token) as a preempted request does.
    if (running < cfg_.max_num_seqs && kv_.fork(r.seq, c.seq, r.n_computed)) {
      c.n_computed = r.n_computed;
      c.admitted = true;
      c.admit_order = ++admit_counter_;
      ++running;
    }
    ++counters_.forks;
    out.push_back(&reqs_.emplace(c.id, std::move(c)).first->second);
  }
  r.forks.clear();
  return out;
}

void EngineCore::cancel_all() {
  while (!reqs_.empty()) finish(reqs_.begin()->second, FinishReason::Cancelled);
}

void EngineCore::fail_running(const std::string& why) {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : reqs_)  // (the others hold no KV)
    if (r.admitted || r.in_flight || std::find(step_admits_.begin(), step_admits_.end(), id) != step_admits_.end())
      ids.push_back(id);
  step_admits_.clear();
  for (uint64_t id : ids)
    if (auto it = reqs_.find(id); it != reqs_.end()) finish(it->second, FinishReason::Error, why);
}

void EngineCore::preempt(Req& r) {
  kv_.release(r.seq);
  if (drafter_) drafter_->release(r.seq);
  r.admitted = false;
  r.n_computed = 0;
  r.pool.clear();  // (recomputed from the start)
  r.pooled = 0;
  ++r.t.preemptions;
  ++counters_.preemptions;
}

// The forward pass works per run of one LoRA adapter (Batch::lora): decodes of one adapter go
// together (stable: the plan's order within each adapter stays), base ones first.
void EngineCore::group_decodes_by_adapter(StepPlan& plan) const {
  auto uid = [&](uint64_t id) {
    const Req& r = reqs_.at(id);
    return r.adapter ? r.adapter->uid() : 0;
  };
  bool any = false;
  for (uint64_t id : plan.decode) any |= uid(id) != 0;
  if (!any) return;
  std::vector<std::pair<uint64_t, int32_t>> d;
  for (size_t i = 0; i < plan.decode.size(); ++i)
    d.emplace_back(plan.decode[i], i < plan.decode_draft.size() ? plan.decode_draft[i] : 0);
  std::stable_sort(d.begin(), d.end(), [&](const auto& a, const auto& b) { return uid(a.first) < uid(b.first); });
  for (size_t i = 0; i < d.size(); ++i) {
    plan.decode[i] = d[i].first;
    if (i < plan.decode_draft.size()) plan.decode_draft[i] = d[i].second;
  }
}

int32_t EngineCore::n_running() const {
  int32_t n = 0;
  for (const auto& [id, r] : reqs_) n += r.admitted;
  return n;
}

int32_t EngineCore::n_waiting() const { return int32_t(reqs_.size()) - n_running(); }

std::vector<QueuedPrefill> EngineCore::queued_prefills() const {
  std::vector<QueuedPrefill> q;
  for (const auto& [id, r] : reqs_) {
    const int64_t pending = int64_t(r.tokens.size()) - r.n_computed;
    if (r.n_generated > 0 && pending <= 1) continue;  // decoding
    q.push_back({r.priority, r.deadline_ms, predict_prefill_ms(cost_.model(), r.n_computed, pending)});
  }
  return q;
}

bool EngineCore::step() {
  if (idle()) return false;
  const int64_t p0 = profile::enabled() ? profile::now_ns() : 0;
  const size_t limit = size_t(std::max(1, exec_.max_in_flight()));
  const bool began = in_flight_.size() < limit && !reqs_.empty() && begin_step(now_(), p0);
  if (began && in_flight_.size() < limit) {  // room for another: it begins before this one's rows are waited for
    if (p0) profile::complete("step", "engine", p0, profile::now_ns(), profile::Args().i("in_flight", int64_t(in_flight_.size())));
    return true;
  }
  if (in_flight_.empty()) return false;
  finish_step(p0, began && in_flight_.size() == 1);
  return true;
}

void EngineCore::finish_in_flight() {
  while (!in_flight_.empty()) finish_step(0, false);
}

void EngineCore::between_blocks(double done) {
  const int64_t cap = exec_.between_max_batch();
  if (!running_ || between_ || cap <= 0 || !in_flight_.empty() || !(done > 0 && done < 1) ||
      between_ms_ >= cfg_.step_latency_target_ms || running_left_waiting_)
    return;
  running_done_ = done;
  bool waits = false;  // (the plan is made only when someone could be in it)
  for (const auto& [id, r] : reqs_)
    waits |= !r.in_flight && between_sized(r, cap);
  if (!waits) return;
  const double t0 = now_();
  const int64_t p0 = profile::enabled() ? profile::now_ns() : 0;
  between_ = true;
  struct Reset {
    EngineCore& c;
    double t0;
    ~Reset() {
      c.between_ = false;
      c.between_ms_ += c.now_() - t0;
    }
  } reset{*this, t0};
  if (!begin_step(t0, p0, true)) return;
  ++counters_.between_steps;
  finish_step(p0, true);
}

bool EngineCore::begin_step(double t0, int64_t p0, bool between) {
  const bool prof = p0 != 0;
  const int32_t limit = std::max(1, exec_.max_in_flight());
  // The decoding requests not in flight that this step may carry: a group of ceil(decoding /
  // limit), in id order; the others (and every request in flight) are left out of the plan, and
  // their running slots out of its max_num_seqs.
  int64_t n_decoding = 0;
  for (const auto& [id, r] : reqs_) n_decoding += r.admitted && r.n_generated > 0;
  int64_t group = (n_decoding + limit - 1) / limit;
  int32_t hidden = 0;
  // Between blocks: the running step's requests are in flight; decodes and prompts longer than
  // the executor takes there wait for the next step.
  const int64_t between_cap = between ? exec_.between_max_batch() : 0;
  // ... and so do LoRA requests, unless their adapter runs already and none waits for a slot
  // (scheduler.h step 3's cap and order, over the requests in flight too).
  std::vector<const LoraAdapter*> adapters;
  bool slot_waits = false;
  if (between) {
    for (const auto& [id, r] : reqs_)
      if (r.admitted && r.adapter && std::find(adapters.begin(), adapters.end(), r.adapter.get()) == adapters.end())
        adapters.push_back(r.adapter.get());
    for (const auto& [id, r] : reqs_)
      slot_waits |= !r.admitted && r.adapter && std::find(adapters.begin(), adapters.end(), r.adapter.get()) == adapters.end();
  }
  auto adapter_waits = [&](const Req& r) {
    return r.adapter && (slot_waits || std::find(adapters.begin(), adapters.end(), r.adapter.get()) == adapters.end());
  };

  SchedulerInput in;
  in.now_ms = t0;
  in.free_blocks = kv_.free_blocks();
  in.cost = cost_.model();
  if (!between && t0 - last_forward_end_ms_ >= kWarmUpIdleMs) busy_since_ms_ = t0;
  in.cost.cold = warm_up_coldness(t0 - busy_since_ms_);
  in.cfg = cfg_;
  in.drafts_from_model = spec_.method == SpecMethod::Draft;
  if (between) in.cfg.max_batch_tokens = std::min<int64_t>(in.cfg.max_batch_tokens, between_cap);
  else if (limit == 1) in.step_blocks = exec_.step_blocks();
  std::erase_if(past_arrivals_, [&](double a) { return t0 - a > cfg_.arrival_window_ms; });
  in.past_arrivals_ms.assign(past_arrivals_.begin(), past_arrivals_.end());
  in.observed_since_ms = started_ms_;
  const double observed_from = std::max(started_ms_, t0 - cfg_.arrival_window_ms);
  while (!follow_ups_.empty() && follow_ups_.front().first < observed_from) follow_ups_.pop_front();
  for (const auto& [from, ms] : follow_ups_) in.unobserved_ms += ms;
  in.requests.reserve(reqs_.size());
  for (const auto& [id, r] : reqs_) {
    const bool dec = decoding(r);
    if (r.in_flight || (between && (!between_sized(r, between_cap) || adapter_waits(r))) ||
        (dec && group-- <= 0)) {
      hidden += r.admitted ? 1 + int32_t(r.forks.size()) : 0;
      continue;
    }
    SchedRequest s;
    s.id = id;
    s.n_tokens = int64_t(r.tokens.size());
    s.n_computed = r.n_computed;
    s.n_generated = r.n_generated;
    s.admitted = r.admitted;
    if (r.admitted) {
      s.blocks_held = KVCache::blocks_for(kv_.capacity(r.seq), cfg_.block_size);
      s.blocks_shared = kv_.shared_blocks(r.seq);
    } else if (!computes_whole_prompt(r)) {  // what admission would attach: at least the last token is computed (its logits)
      const KVCache::PrefixHit hit = kv_.prefix_hit(r.tokens, s.n_tokens - 1, r.salt, r.prefix_memo);
      s.n_computed = hit.tokens;
      s.hit_blocks = hit.blocks;
      s.hit_idle_blocks = hit.idle_blocks;
    }
    s.arrival_ms = r.t.arrival_ms;
    s.deadline_ms = r.deadline_ms;
    s.priority = r.priority;
    s.admit_order = r.admit_order;
    s.adapter = r.adapter ? r.adapter->uid() : 0;
    s.n_forks = int32_t(r.forks.size());
    s.first_tokens = first_tokens(r);
    if (r.speculate && s.decoding()) {
      Req& m = reqs_.at(id);
      const int32_t k = spec_k(m);
      if (spec_.method == SpecMethod::Ngram) {
        m.draft = k > 0 ? ngram_draft(m.tokens, k, spec_.ngram_min, spec_.ngram_max) : std::vector<int32_t>{};
        s.n_draft = int32_t(m.draft.size());
      } else {
        s.n_draft = k;  // the draft model proposes after the plan, for what it grants
      }
    }
    in.requests.push_back(s);
  }
  in.cfg.max_num_seqs = std::max(0, in.cfg.max_num_seqs - hidden);
  StepPlan plan = plan_step(in);
  if (between) {
    // Prefill only, and it gives someone a first token (or it waits for the next step); and
    // sooner than the running step would end: what it delays each first token of that step by
    // is less than the wait it saves (a short prompt arriving in a short prompt's step waits).
    // The running step's time left: at the rate of its blocks so far.
    bool finishes = false;
    for (const PrefillChunk& c : plan.prefill)
      for (const SchedRequest& s : in.requests) finishes |= s.id == c.id && c.n_tokens == s.pending();
    const double left_ms = (t0 - running_start_ms_ - between_ms_) * (1 - running_done_) / running_done_;
    if (!finishes || !plan.preempt.empty() || !plan.decode.empty() ||
        (running_firsts_ > 0 && plan.predicted_ms * double(running_firsts_) >= left_ms))
      return false;
  }
  if (!between) {
    const int64_t cap = exec_.between_max_batch();
    running_left_waiting_ = false;
    for (const auto& [id, r] : reqs_)
      running_left_waiting_ |= !r.in_flight && between_sized(r, cap) && (!r.adapter || r.admitted) &&
                               std::none_of(plan.prefill.begin(), plan.prefill.end(),
                                            [&](const PrefillChunk& c) { return c.id == id; });
  }
  group_decodes_by_adapter(plan);
  step_admits_ = plan.admit;

  StepRecord rec;
  rec.start_ms = t0;
  rec.predicted_ms = plan.predicted_ms;
  rec.cold = in.cost.cold;
  rec.step_cap_ms = plan.step_cap_ms;
  rec.prefill_budget = plan.prefill_budget;
  rec.n_preempted = int32_t(plan.preempt.size());
  // The plan fits the pool it was made against; a reservation that fails is a bug in it.
  auto reserve = [&](const Req& r, int64_t n_positions, const char* what) {
    if (!kv_.reserve(r.seq, n_positions))
      fail("engine: the step plan does not fit the KV cache (", what, " of request ", r.id, ": ", n_positions,
           " positions, ", kv_.free_blocks(), " free blocks)");
  };
  for (uint64_t id : plan.preempt) preempt(reqs_.at(id));
  // Every admission attaches its cached prefix before any block is taken, so no reservation in
  // this step evicts a block the plan counted as a hit.
  for (uint64_t id : plan.admit) {
    Req& r = reqs_.at(id);
    // A prompt being scored attaches nothing (max 0), but its blocks still publish under its salt.
    r.n_computed = kv_.attach_prefix(r.seq, r.tokens, computes_whole_prompt(r) ? 0 : int64_t(r.tokens.size()) - 1, r.salt);
    if (r.t.preemptions == 0) r.t.cached_tokens = r.n_computed;
  }
  for (uint64_t id : plan.admit) {
    Req& r = reqs_.at(id);
    reserve(r, int64_t(r.tokens.size()) + first_tokens(r), "admission");
    r.admitted = true;
    r.admit_order = ++admit_counter_;
  }

  // Speculative drafts for the decodes granted some: n-gram drafts are cut to the grant; the
  // draft model proposes now, for the grants alone (fewer while its cache catches up).
  std::vector<Drafter::Job> jobs;
  for (size_t i = 0; i < plan.decode.size(); ++i) {
    Req& r = reqs_.at(plan.decode[i]);
    const int32_t g = i < plan.decode_draft.size() ? plan.decode_draft[i] : 0;
    if (spec_.method == SpecMethod::Draft && g > 0) {
      const int64_t remaining = std::min(r.max_tokens - r.n_generated, n_ctx_ - int64_t(r.tokens.size()) + 1);
      jobs.push_back({r.seq, r.tokens, g, remaining, &r.sampler->params(), &r.draft, r.sampler->position()});
    } else if (int32_t(r.draft.size()) > g) {
      r.draft.resize(size_t(g));
    }
  }
  SpecTimes& st = counters_.spec_times;
  double propose_ms = 0;
  if (!jobs.empty()) {
    for (Drafter::Job& j : jobs) j.draft->clear();
    const int64_t pd0 = prof ? profile::now_ns() : 0;
    const double td0 = now_();
    const double fwd0 = st.catch_up_ms + st.draft_forward_ms;
    drafter_->propose(jobs, plan.predicted_ms, st);  // at most about doubles the step (scheduler.h's kSpecStretch)
    propose_ms = now_() - td0;
    st.draft_other_ms += std::max(0.0, propose_ms - (st.catch_up_ms + st.draft_forward_ms - fwd0));
    if (prof) profile::complete("draft", "engine", pd0, profile::now_ns(), profile::Args().i("requests", int64_t(jobs.size())));
  }

  // The flattened batch: decodes (each with its drafts) first, then prefill chunks.
  Flight f;
  if (!spare_flights_.empty()) {
    f = std::move(spare_flights_.back());
    spare_flights_.pop_back();
  }
  f.groups.clear();
  f.prompt_rows.clear();
  f.hidden_rows.clear();
  std::vector<RowGroup>& groups = f.groups;
  std::vector<PromptRows>& prompt_rows = f.prompt_rows;
  Batch& batch = between ? between_batch_ : batch_;
  batch.clear();
  size_t n_rows = 0, n_hidden = 0;
  std::vector<Req*> decodes;
  int64_t draft_rows = 0;
  double draft_pairs = 0;  // of plan.attn_pairs, the granted drafts'
  for (size_t i = 0; i < plan.decode.size(); ++i) {
    Req& r = reqs_.at(plan.decode[i]);
    const int32_t g = int32_t(r.draft.size());
    draft_rows += g;
    if (i < plan.decode_draft.size()) draft_pairs += draft_attn_pairs(r.n_computed, plan.decode_draft[i]);
    if (g == 0) ++r.steps_without_draft; else r.steps_without_draft = 0;
    reserve(r, r.n_computed + 1 + g, "decode");
    batch.add(r.tokens[size_t(r.n_computed)], int32_t(r.n_computed), r.seq, true, r.adapter.get());
    for (int32_t j = 0; j < g; ++j)
      batch.add(r.draft[size_t(j)], int32_t(r.n_computed + 1 + j), r.seq, true, r.adapter.get());
    groups.push_back({&r, n_rows, g + 1});
    n_rows += size_t(g) + 1;
    decodes.push_back(&r);
  }
  rec.n_decode = int32_t(decodes.size());
  std::vector<std::pair<Req*, int64_t>> chunks;
  for (const PrefillChunk& c : plan.prefill) {
    Req& r = reqs_.at(c.id);
    const int64_t n = int64_t(r.tokens.size());
    int64_t len = c.n_tokens;
    if (len < 1 || len > n - r.n_computed)
      fail("engine: the step plan's chunk of request ", r.id, " (", len, " tokens) is not within its ",
           n - r.n_computed, " pending tokens");
    const bool scoring = scoring_prompt(r);
    if (scoring) len = std::min(len, kPromptLogprobsRows);
    reserve(r, r.n_computed + len, "prefill");
    for (int64_t i = 0; i < len; ++i) {
      const int64_t pos = r.n_computed + i;
      const bool last = pos == n - 1;
      if (r.pooling != Pooling::None) {
        // An embedding's rows: those it pools, and always its last position (whose row ends it).
        const bool take = pools(r, pos) || last;
        batch.add(r.tokens[size_t(pos)], int32_t(pos), r.seq, take ? kOutHidden : kOutNone, r.adapter.get());
        if (!take) continue;
        if (f.hidden_rows.empty() || f.hidden_rows.back().r != &r || f.hidden_rows.back().pos + f.hidden_rows.back().n != pos)
          f.hidden_rows.push_back({&r, n_hidden, pos, 0});
        ++f.hidden_rows.back().n;
        ++n_hidden;
        continue;
      }
      // A prompt position not scored yet (what a preempted request scored is kept): its row
      // predicts the token at pos + 1.
      const bool score = scoring && pos >= int64_t(r.prompt_lp.size()) && pos < r.n_prompt - 1;
      batch.add(r.tokens[size_t(pos)], int32_t(pos), r.seq, last || score, r.adapter.get());
      if (score) {
        if (prompt_rows.empty() || prompt_rows.back().r != &r) prompt_rows.push_back({&r, n_rows, pos, 0});
        ++prompt_rows.back().n;
        ++n_rows;
      }
      if (last) groups.push_back({&r, n_rows++, 1});
    }
    if (r.t.first_scheduled_ms < 0) {
      r.t.first_scheduled_ms = t0;
      r.trace_scheduled_ns = p0;
    }
    ++r.t.prefill_steps;
    counters_.prefill_tokens += uint64_t(len);
    chunks.emplace_back(&r, len);
    rec.chunks.push_back(len);
  }
  if (batch.size() == 0) return false;
  f.logits.resize(n_rows * size_t(exec_.n_vocab()));
  f.hidden.resize(n_hidden * size_t(exec_.n_embd()));

  const double tf = now_();
  const int64_t pf0 = prof ? profile::now_ns() : 0;
  if (between) {
    exec_.forward_between(batch, kv_, f.logits.data(), f.hidden.data());
  } else {
    // Steps run between its blocks leave its requests out (in flight until it began) and their
    // time out of its forward's.
    running_firsts_ = 0;
    for (Req* r : decodes) r->in_flight = true;
    for (auto& [r, len] : chunks) {
      r->in_flight = true;
      running_firsts_ += r->n_computed + len == int64_t(r->tokens.size());
    }
    running_start_ms_ = tf;
    between_ms_ = 0;
    running_ = true;
    struct Reset {
      bool& running;
      ~Reset() { running = false; }
    } reset{running_};
    exec_.begin(batch, kv_, f.logits.data(), f.hidden.data());
    for (auto& [r, len] : chunks) r->in_flight = false;  // (those with rows are again, below)
  }
  if (prof && limit > 1) profile::complete("forward", "engine", pf0, profile::now_ns(), profile::Args().i("tokens", batch.size()));
  f.begin_ms = now_() - tf - (between ? 0 : between_ms_);
  f.between = between;
  rec.between = between;
  f.p_forward = pf0;
  st.schedule_ms += std::max(0.0, tf - t0 - propose_ms);
  if (prof) profile::complete("schedule", "engine", p0, pf0);

  // Advance what was computed and publish newly full blocks for prefix reuse (a speculating
  // decode publishes after verification: only then is it known which of its positions stand).
  // A request with rows in this step stays out of the plans until it finishes; a prompt chunk
  // without (not its last) does not: its next chunk may follow in the next step.
  for (Req* r : decodes) {
    ++r->n_computed;
    if (r->draft.empty()) kv_.publish(r->seq, r->tokens, r->n_computed);
  }
  for (auto& [r, len] : chunks) {
    r->n_computed += len;
    kv_.publish(r->seq, r->tokens, r->n_computed);
  }
  for (RowGroup& g : groups) g.r->in_flight = true;
  for (PromptRows& p : prompt_rows) p.r->in_flight = true;
  for (PromptRows& p : f.hidden_rows) p.r->in_flight = true;
  f.rec = std::move(rec);
  f.n_rows = n_rows;
  f.tokens = batch.size();
  f.draft_rows = draft_rows;
  f.draft_pairs = draft_pairs;
  f.attn_pairs = plan.attn_pairs;
  in_flight_.push_back(std::move(f));
  counters_.max_steps_in_flight = std::max<uint64_t>(counters_.max_steps_in_flight, in_flight_.size());
  return true;
}

void EngineCore::finish_step(int64_t p_step, bool merged) {
  const bool prof = p_step != 0;
  Flight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  StepRecord& rec = f.rec;
  SpecTimes& st = counters_.spec_times;
  std::vector<RowGroup>& groups = f.groups;
  std::vector<PromptRows>& prompt_rows = f.prompt_rows;
  const size_t n_rows = f.n_rows;
  for (RowGroup& g : groups)
    if (g.r) g.r->in_flight = false;
  for (PromptRows& p : prompt_rows)
    if (p.r) p.r->in_flight = false;
  for (PromptRows& p : f.hidden_rows)
    if (p.r) p.r->in_flight = false;
  // Back to the spare list whatever happens below (its buffers are reused).
  struct Spare {
    EngineCore& c;
    Flight& f;
    ~Spare() {
      trim_buffer(f.logits);
      trim_buffer(f.hidden);
      c.spare_flights_.push_back(std::move(f));
    }
  } spare{*this, f};

  const double tw = now_();
  const int64_t pw0 = prof ? profile::now_ns() : 0;
  if (!f.between) exec_.finish(f.logits.data(), f.hidden.data());
  const int64_t pf1 = prof ? profile::now_ns() : 0;
  const double t1 = now_();
  last_forward_end_ms_ = std::max(last_forward_end_ms_, t1);
  if (prof) profile::complete("forward", "engine", merged ? f.p_forward : pw0, pf1, profile::Args().i("tokens", f.tokens));
  // The forward's time: both halves (overlapped, the second is the wait for the later stages'
  // part, less what this rank ran meanwhile).
  rec.forward_ms = f.begin_ms + (t1 - tw);
  ++counters_.steps;
  if (f.draft_rows > 0) {
    st.verify_forward_ms += rec.forward_ms;
    ++st.verify_steps;
  } else {
    st.plain_forward_ms += rec.forward_ms;
    ++st.plain_steps;
  }
  if (rec.forward_ms > 0) {
    errors_.observe(std::abs(rec.predicted_ms - rec.forward_ms) / rec.forward_ms);
    // Draft rows are learned as free: on a memory-bound decode they nearly are (scoring 5
    // positions ~1.2x one), and counted as tokens they would pull the fitted cost per token
    // below a prefill chunk's, so chunks would outgrow their step cap (and arrivals wait).
    cost_.observe(f.tokens - f.draft_rows, f.attn_pairs - f.draft_pairs, rec.forward_ms, rec.cold);
  }

  // Sample one token for every row group (a speculating decode: verify its drafts in order, then
  // one token of the target's own), then emit them and finish what is done. A group whose sampling
  // fails (no finite logit) fails its request alone. The sampler sees [0, n_tokens) of each row.
  const int64_t ps0 = prof ? profile::now_ns() : 0;
  const double ts0 = now_();
  const size_t V = size_t(exec_.n_vocab());
  const size_t NT = size_t(exec_.n_tokens());
  for (const PromptRows& p : prompt_rows)
    for (int64_t k = 0; p.r && k < p.n; ++k) {
      const int32_t next = p.r->tokens[size_t(p.pos + k + 1)];
      TokenLogprobs& t = p.r->prompt_lp.emplace_back();
      t.token = next;
      fill_logprobs(f.logits.data() + (p.first + size_t(k)) * V, int32_t(NT), next, p.r->prompt_logprobs, t.logprob, t.top,
                    &t.rank);
    }
  // Embeddings: their rows pooled (sums in double, in position order); one whose last position
  // came finishes.
  std::vector<uint64_t> embedded;
  const size_t E = size_t(exec_.n_embd());
  for (const PromptRows& h : f.hidden_rows) {
    if (!h.r) continue;
    Req& r = *h.r;
    if (r.pool.empty()) r.pool.assign(E, 0.0);
    for (int64_t k = 0; k < h.n; ++k) {
      const int64_t pos = h.pos + k;
      if (!pools(r, pos)) continue;
      const float* row = f.hidden.data() + (h.first + size_t(k)) * E;
      for (size_t d = 0; d < E; ++d) r.pool[d] += double(row[d]);
      ++r.pooled;
    }
    if (h.pos + h.n == r.n_prompt) {
      r.t.first_token_ms = t1;  // (its result: the TTFT metrics count it as a first token)
      r.trace_first_token_ns = prof ? pf1 : 0;
      embedded.push_back(r.id);
    }
  }
  struct Emit {
    Req* r;
    const float* logits;  // its row (after the request's processor)
    int32_t tok;
  };
  std::vector<Emit> emits;
  emits.reserve(n_rows);
  struct Failed {
    uint64_t id;
    std::string why;
    bool request_error;  // a RequestError (the request's own input)
  };
  std::vector<Failed> failed;
  auto sample_row = [&](Req& r, float* row_logits) {
    if (r.processor) r.processor->apply(row_logits, exec_.n_tokens(), r.n_generated);
    const int32_t tok = r.sampler->sample(row_logits);
    r.sampler->accept(tok);
    if (r.processor) r.processor->accept(tok);
    emits.push_back({&r, row_logits, tok});
  };
  // Requests at their first token with forks: each fork samples from a copy of the raw row.
  size_t n_fork_rows = 0, fork_row = 0;
  for (const RowGroup& g : groups)
    if (g.r && g.n == 1) n_fork_rows += g.r->forks.size();
  if (fork_logits_.size() < n_fork_rows * V) fork_logits_.resize(n_fork_rows * V);
  else if (n_fork_rows * V < fork_logits_.size() / 4) {
    fork_logits_.resize(n_fork_rows * V);
    trim_buffer(fork_logits_);
  }
  for (const RowGroup& g : groups) {
    if (!g.r) continue;
    Req& r = *g.r;
    std::vector<Req*> forks;
    if (g.n == 1 && !r.forks.empty()) {
      for (size_t k = 0; k < r.forks.size(); ++k)
        std::copy_n(f.logits.data() + g.first * V, V, fork_logits_.data() + (fork_row + k) * V);
      forks = spawn_forks(r);
    }
    const size_t mark = emits.size();
    try {
      if (g.n == 1) {
        sample_row(r, f.logits.data() + g.first * V);
      } else {
        const int32_t n_draft = g.n - 1;
        int32_t accepted = 0;
        for (int32_t i = 0; i < g.n; ++i) {
          const float* row_logits = f.logits.data() + (g.first + size_t(i)) * V;
          bool ok = false;
          int32_t tok;
          if (i < n_draft) {
            tok = r.sampler->verify(row_logits, r.draft[size_t(i)], ok);
          } else {
            tok = r.sampler->sample(row_logits);
          }
          r.sampler->accept(tok);
          emits.push_back({&r, row_logits, tok});
          if (!ok) break;
          ++accepted;
        }
        // The accepted drafts' K/V stand (computed after the right tokens); the rest are
        // abandoned in place: the capacity past the new pending token is given back.
        r.n_computed += accepted;
        kv_.truncate(r.seq, r.n_computed + 1);
        r.t.spec.observe(n_draft, accepted);
        ++counters_.spec_drafts;
        counters_.spec_draft_tokens += uint64_t(n_draft);
        counters_.spec_accepted_tokens += uint64_t(accepted);
        for (int32_t i = 0; i < accepted; ++i) ++counters_.spec_accepted_per_pos[size_t(i)];
      }
    } catch (const std::exception& e) {
      emits.resize(mark);
      failed.push_back({r.id, e.what(), dynamic_cast<const RequestError*>(&e) != nullptr});
    }
    for (Req* c : forks) {
      try {
        sample_row(*c, fork_logits_.data() + fork_row++ * V);
      } catch (const std::exception& e) {
        failed.push_back({c->id, e.what(), dynamic_cast<const RequestError*>(&e) != nullptr});
      }
    }
  }
  const int64_t ps1 = prof ? profile::now_ns() : 0;
  const double ts1 = now_();
  st.sample_ms += ts1 - ts0;
  std::vector<std::pair<uint64_t, FinishReason>> done;
  const Req* stopped = nullptr;  // the request whose later drafted tokens are dropped
  for (const Emit& e : emits) {
    Req& r = *e.r;
    if (&r == stopped) continue;
    const float* logits = e.logits;
    const int32_t tok = e.tok;
    r.tokens.push_back(tok);
    ++r.n_generated;
    ++counters_.generated_tokens;
    if (r.t.first_token_ms < 0) {
      r.t.first_token_ms = t1;
      r.trace_first_token_ns = prof ? pf1 : 0;
    }
    r.t.token_ms.push_back(t1);
    EngineEvent ev;
    ev.kind = EngineEvent::Kind::Token;
    ev.id = r.id;
    ev.token = tok;
    if (r.logprobs >= 0) fill_logprobs(logits, exec_.n_tokens(), tok, r.logprobs, ev.logprob, ev.top_logprobs);
    if (r.n_generated == 1 && r.prompt_logprobs >= 0) ev.prompt_logprobs = std::move(r.prompt_lp);
    emit(r, ev);
    if (!r.ignore_eos && is_eog_ && is_eog_(tok)) {
      done.emplace_back(r.id, FinishReason::Stop);
      stopped = &r;
    } else if (r.n_generated >= r.max_tokens || int64_t(r.tokens.size()) >= n_ctx_) {
      done.emplace_back(r.id, FinishReason::Length);
      stopped = &r;
    }
  }
  for (const RowGroup& g : groups)
    if (g.r && g.n > 1) {
      g.r->draft.clear();
      kv_.publish(g.r->seq, g.r->tokens, g.r->n_computed);
    }
  for (auto& [id, why] : done) finish(reqs_.at(id), why);
  for (uint64_t id : embedded) finish(reqs_.at(id), FinishReason::Stop);
  for (const Failed& f : failed)
    finish(reqs_.at(f.id), FinishReason::Error, f.request_error ? f.why : cat("generation failed: ", f.why), f.request_error);

  st.emit_ms += now_() - ts1;
  rec.n_running = n_running();
  rec.n_waiting = n_waiting();
  rec.kv_used_blocks = kv_.used_blocks();
  if (prof) {
    // step = schedule (plan, KV reservations) + forward + kv_publish (full blocks for prefix
    // reuse) + sampling + emit (callbacks, finishes).
    const int64_t p1 = profile::now_ns();
    int64_t prefill_tokens = 0;
    std::string chunks = "[";
    for (size_t i = 0; i < rec.chunks.size(); ++i) {
      prefill_tokens += rec.chunks[i];
      if (i) chunks += ',';
      chunks.append(std::to_string(rec.chunks[i]));
    }
    chunks += ']';
    profile::complete("kv_publish", "engine", pf1, ps0);
    profile::complete("sampling", "engine", ps0, ps1, profile::Args().i("rows", int64_t(n_rows)));
    profile::complete("emit", "engine", ps1, p1);
    profile::Args a;
    a.i("tokens", f.tokens).i("n_decode", rec.n_decode).i("prefill_tokens", prefill_tokens);
    a.d("predicted_ms", rec.predicted_ms).d("forward_ms", rec.forward_ms);
    a.d("attn_pairs", f.attn_pairs - f.draft_pairs);  // (with tokens less drafts: what the cost model learns from)
    if (std::isfinite(rec.step_cap_ms) && rec.step_cap_ms > 0) a.d("step_cap_ms", rec.step_cap_ms);
    a.i("running", rec.n_running).i("waiting", rec.n_waiting).i("preempted", rec.n_preempted);
    if (!merged) a.i("in_flight", int64_t(in_flight_.size()) + 1);  // (overlapped: this turn began another step)
    if (rec.between) a.i("between_blocks", 1);
    if (rec.cold >= 0.01) a.d("cold", rec.cold);
    profile::complete("step", "engine", p_step, p1, a, "chunks", chunks);
    profile::counter("kv_blocks", p1,
                     profile::Args().i("used", kv_.used_blocks()).i("prefix_cached", kv_.cached_blocks())
                         .i("free", kv_.free_blocks() - kv_.cached_blocks()));
    profile::counter("requests", p1, profile::Args().i("running", rec.n_running).i("waiting", rec.n_waiting));
  }
  steps_.push_back(std::move(rec));
  if (steps_.size() > kStepHistory) steps_.pop_front();
}

}  // namespace ft
