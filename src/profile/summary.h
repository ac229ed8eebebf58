// `firsttoken profile FILE`: reads a trace written by the tracer (trace.h) and computes what an
// engineer looks at first: where the engine thread's time goes (op types by share, with achieved
// GFLOP/s and GB/s), the idle gaps between ops inside a forward pass and between steps, the
// shape of the steps, memory, and the per-request phases.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ft::profile {

struct Dist {  // of durations, ms
  int64_t count = 0;
  double sum = 0, mean = 0, p50 = 0, p99 = 0, max = 0;
};
Dist make_dist(std::vector<double> v);

struct OpRow {
  std::string name;  // span name: "gemm.wq+wk+wv", "attention", "sampling", ...
  std::string cat;   // "op" (a backend call) or "engine" (scheduling, sampling, emitting)
  int64_t calls = 0;
  double total_ms = 0;
  double share = 0;  // of the engine's time inside steps
  double flops = 0, bytes = 0;
  double gflops() const { return total_ms > 0 ? flops / (total_ms * 1e6) : 0; }
  double gbps() const { return total_ms > 0 ? bytes / (total_ms * 1e6) : 0; }
};

struct StepGap {
  double at_ms = 0;  // end of the step before, on the trace clock
  double ms = 0;
  bool pending = false;  // requests were running or waiting when it began
};

struct Summary {
  double wall_ms = 0;  // first to last event
  int engine_tid = -1;
  // Steps.
  int64_t steps = 0;
  double step_ms = 0;              // sum of step durations (engine busy; a step between blocks counts in its outer one)
  int64_t between_steps = 0;       // of the steps, run between the blocks of another (EngineCore::between_blocks)
  double between_ms = 0;           // their durations
  double engine_window_ms = 0;     // first step start to last step end
  double tokens_per_step = 0, decode_per_step = 0, prefill_per_step = 0;
  Dist step_dur;
  double forward_ms = 0;
  double predict_abs_err = 0;  // mean |predicted - measured| / measured of the forward, where predicted
  Dist comm_per_step;          // MPI time per step (spans of category "comm"; count 0 when none)
  // Ops inside steps, by total time, then the gap row.
  std::vector<OpRow> ops;
  double outside_steps_ms = 0;  // op time outside any step (calibration at start-up)
  std::vector<int> layers;      // layer args seen on op spans inside steps
  // Idle gaps.
  Dist op_gaps;                  // inside forward passes: before the first op, between ops, after the last
  Dist step_gaps;                // between consecutive steps
  Dist step_gaps_pending;        // of those: with requests running or waiting
  std::vector<StepGap> largest_step_gaps;
  // Memory and counters.
  std::map<std::string, nlohmann::json> meta;
  double kv_used_max = 0, kv_used_mean = 0, kv_cached_max = 0, kv_cached_mean = 0;
  int64_t kv_samples = 0;
  // Requests (ms).
  Dist tokenize, queue, prefill, decode, ttft;
  // HTTP worker threads.
  Dist http_parse, http_write, http_emit;
  int64_t dropped_events = 0;
};

// Throws ft::Error when the document is not a trace.
Summary summarize(const nlohmann::json& trace);
std::string format_summary(const Summary& s, int top_n = 3);

}  // namespace ft::profile
