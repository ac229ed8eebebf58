#include "server/metrics.h"

#include <cstdio>

#include "core/error.h"

namespace ft::server {

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

static std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

void render_histogram(std::string& out, const std::string& name, const std::string& help,
                      std::span<const double> bounds, std::span<const uint64_t> counts, double sum, uint64_t count) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cum += counts[i];
    out += name + "_bucket{le=\"" + num(bounds[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + num(sum) + "\n" + name + "_count " + std::to_string(count) + "\n";
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  render_histogram(out, name, help, bounds_, counts_, sum_, count_);
}

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5,   5.0,    7.5,   10.0, 20.0, 40.0, 60.0};
}

ServerMetrics::ServerMetrics()
    : ttft_(latency_buckets()), queue_(latency_buckets()), prefill_(latency_buckets()), decode_(latency_buckets()),
      itl_(latency_buckets()), e2e_(latency_buckets()), tokenize_(latency_buckets()) {}

void ServerMetrics::observe_finished(const RequestTimings& t, const std::string& finish, int64_t, int64_t) {
  std::lock_guard<std::mutex> lk(mu_);
  (finish == "stop" ? success_stop_ : finish == "length" ? success_length_ : success_abort_)++;
  tokenize_.observe(t.tokenize_ms / 1e3);
  if (t.first_scheduled_ms >= 0) queue_.observe(t.queue_ms() / 1e3);
  if (t.first_token_ms >= 0) {
    ttft_.observe(t.ttft_ms() / 1e3);
    prefill_.observe(t.prefill_ms() / 1e3);
    decode_.observe(t.decode_ms() / 1e3);
  }
  for (size_t i = 1; i < t.token_ms.size(); ++i) itl_.observe((t.token_ms[i] - t.token_ms[i - 1]) / 1e3);
  if (t.finish_ms >= 0) e2e_.observe((t.finish_ms - t.arrival_ms) / 1e3);
}

void ServerMetrics::count_rejected() {
  std::lock_guard<std::mutex> lk(mu_);
  ++rejected_;
}

void ServerMetrics::count_error() {
  std::lock_guard<std::mutex> lk(mu_);
  ++errors_;
}

void render_gauge(std::string& out, const std::string& name, const std::string& help, double v) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + " " + num(v) + "\n";
}

std::string ServerMetrics::render(const EngineMetrics& m) const {
  std::string out;
  auto gauge = [&](const std::string& name, const std::string& help, double v) { render_gauge(out, name, help, v); };
  auto counter = [&](const std::string& name, const std::string& help, double v) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + num(v) + "\n";
  };
  gauge("firsttoken:num_requests_running", "Requests holding KV cache and being computed.", m.running);
  gauge("firsttoken:num_requests_waiting", "Requests waiting to be scheduled.", m.waiting);
  gauge("firsttoken:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).",
        m.kv_total_blocks > 0 ? double(m.kv_used_blocks) / double(m.kv_total_blocks) : 0.0);
  gauge("firsttoken:kv_cache_used_blocks", "KV cache blocks in use by requests.", m.kv_used_blocks);
  gauge("firsttoken:kv_cache_cached_blocks", "Freed KV cache blocks kept for prefix reuse.", m.kv_cached_blocks);
  gauge("firsttoken:kv_cache_total_blocks", "KV cache blocks in all.", m.kv_total_blocks);
  gauge("firsttoken:kv_cache_capacity_tokens", "Positions the whole KV cache holds.", double(m.kv_capacity_tokens));
  gauge("firsttoken:kv_cache_bytes", "KV cache memory in bytes (as stored: f16, bf16, q8_0 or f32).", double(m.kv_bytes));
  counter("firsttoken:prompt_tokens_total", "Prompt tokens of finished requests.", double(m.counters.prompt_tokens));
  counter("firsttoken:generation_tokens_total", "Generated tokens.", double(m.counters.generated_tokens));
  counter("firsttoken:prefill_tokens_total",
          "Prompt positions computed by prefill (a recompute counts again; prefix-cache hits and the choices "
          "forked from one prefill do not).",
          double(m.counters.prefill_tokens));
  counter("firsttoken:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          double(m.kv.prefix_query_tokens));
  counter("firsttoken:prefix_cache_hits_total", "Prompt tokens served by the prefix cache.",
          double(m.kv.prefix_hit_tokens));
  counter("firsttoken:num_preemptions_total", "Requests preempted (KV freed, recomputed later).",
          double(m.counters.preemptions));
  counter("firsttoken:engine_steps_total", "Engine steps (forward passes).", double(m.counters.steps));
  counter("firsttoken:engine_between_block_steps_total",
          "Engine steps run between two blocks of a longer one (short prompts' first tokens; of engine_steps_total).",
          double(m.counters.between_steps));
  gauge("firsttoken:engine_max_steps_in_flight",
        "The most engine steps in flight at once since start (pipeline parallel: up to pp_size, decode steps "
        "overlapped across stages; else 1).",
        double(m.counters.max_steps_in_flight));
  // Speculative decoding (vLLM's spec_decode_* family; zero while it is off).
  const EngineCounters& c = m.counters;
  counter("firsttoken:spec_decode_num_drafts_total", "Speculative verifications (a decode that scored draft tokens).",
          double(c.spec_drafts));
  counter("firsttoken:spec_decode_num_draft_tokens_total", "Draft tokens scored by the target model.",
          double(c.spec_draft_tokens));
  counter("firsttoken:spec_decode_num_accepted_tokens_total", "Draft tokens the target accepted.",
          double(c.spec_accepted_tokens));
  gauge("firsttoken:spec_decode_draft_acceptance_rate", "Accepted / scored draft tokens since start (0 before any).",
        c.spec_draft_tokens ? double(c.spec_accepted_tokens) / double(c.spec_draft_tokens) : 0.0);
  gauge("firsttoken:spec_decode_mean_accepted_tokens",
        "Mean tokens emitted per verification: accepted drafts + the target's own (0 before any).",
        c.spec_drafts ? 1.0 + double(c.spec_accepted_tokens) / double(c.spec_drafts) : 0.0);
  out += "# HELP firsttoken:spec_decode_num_accepted_tokens_per_pos_total Accepted draft tokens by draft position "
         "(0-based).\n# TYPE firsttoken:spec_decode_num_accepted_tokens_per_pos_total counter\n";
  for (size_t i = 0; i < c.spec_accepted_per_pos.size(); ++i)
    if (i == 0 || c.spec_accepted_per_pos[i] > 0)
      out += cat("firsttoken:spec_decode_num_accepted_tokens_per_pos_total{position=\"", i, "\"} ",
                 c.spec_accepted_per_pos[i], "\n");
  counter("firsttoken:request_rejected_late_total",
          "Requests rejected with 429 because their predicted TTFT missed their deadline (--reject-late).",
          double(m.rejected_late));
  render_histogram(out, "firsttoken:step_time_prediction_error_ratio",
                   "Per step: |predicted - measured| / measured forward time (the scheduler's cost model).",
                   PredictionErrorHistogram::kBounds, m.step_time_error.counts, m.step_time_error.sum,
                   m.step_time_error.count);
  // Per listener: one family each, a sample per listener.
  const std::pair<const char*, const ListenerStats*> listeners[] = {{"http", &http}, {"binary", &binary}};
  out += "# HELP firsttoken:connections_open Open connections.\n# TYPE firsttoken:connections_open gauge\n";
  for (const auto& [name, l] : listeners)
    out += cat("firsttoken:connections_open{listener=\"", name, "\"} ", l->open.load(), "\n");
  out += "# HELP firsttoken:connections_refused_total Connections closed at accept: the listener had "
         "--max-connections open.\n# TYPE firsttoken:connections_refused_total counter\n";
  for (const auto& [name, l] : listeners)
    out += cat("firsttoken:connections_refused_total{listener=\"", name, "\"} ", l->refused.load(), "\n");
  counter("firsttoken:binary_frame_timeouts_total",
          "Binary-protocol connections closed because a frame did not arrive within --frame-timeout.",
          double(frame_timeouts.load()));
  std::lock_guard<std::mutex> lk(mu_);
  counter("firsttoken:request_rejected_total", "Requests rejected with 429 (queue full, or late).", double(rejected_));
  counter("firsttoken:request_errors_total", "Requests answered with an error status other than 429.", double(errors_));
  out += "# HELP firsttoken:request_success_total Finished requests by finish reason.\n"
         "# TYPE firsttoken:request_success_total counter\n";
  out += "firsttoken:request_success_total{finished_reason=\"stop\"} " + std::to_string(success_stop_) + "\n";
  out += "firsttoken:request_success_total{finished_reason=\"length\"} " + std::to_string(success_length_) + "\n";
  out += "firsttoken:request_success_total{finished_reason=\"abort\"} " + std::to_string(success_abort_) + "\n";
  ttft_.render(out, "firsttoken:time_to_first_token_seconds", "Time from arrival to the first generated token.");
  queue_.render(out, "firsttoken:request_queue_time_seconds", "Time from arrival to the first scheduled step.");
  prefill_.render(out, "firsttoken:request_prefill_time_seconds", "Time from the first scheduled step to the first token.");
  decode_.render(out, "firsttoken:request_decode_time_seconds", "Time from the first token to the last.");
  itl_.render(out, "firsttoken:time_per_output_token_seconds", "Inter-token latency.");
  e2e_.render(out, "firsttoken:e2e_request_latency_seconds", "Time from arrival to finish.");
  tokenize_.render(out, "firsttoken:request_tokenize_time_seconds", "Time spent tokenizing the prompt (HTTP worker).");
  return out;
}

}  // namespace ft::server
