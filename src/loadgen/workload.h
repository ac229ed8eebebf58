// Load-generator workloads and latency statistics for `firsttoken bench serve` (pure functions,
// no I/O): request classes with arrival processes and prompt/output length distributions, a
// seeded plan of arrivals, and the summaries the report prints (mean, p50/p90/p99, max, goodput).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ft::loadgen {

// Limits of a workload, checked before anything is planned (the whole plan, and every request's
// body, are made up front): a request's prompt or output tokens (mean + spread), the seconds of
// arrivals (workload duration_s, --duration), and the requests one run plans or sends
// (plan_arrivals, --max-requests).
inline constexpr int64_t kMaxRequestTokens = int64_t(1) << 24;
inline constexpr double kMaxDurationS = 1e6;
inline constexpr int64_t kMaxPlannedRequests = int64_t(1) << 20;
// The prompt tokens of all the requests one run sends (run_loadgen makes every body up front).
inline constexpr int64_t kMaxRunPromptTokens = int64_t(1) << 27;

// Integer lengths: uniform in [mean - spread, mean + spread] (spread 0 = fixed), at least 1.
struct LengthDist {
  int64_t mean = 1;
  int64_t spread = 0;
};

struct Arrivals {
  enum class Kind { Poisson, Gamma, Periodic };
  Kind kind = Kind::Poisson;
  double rate_per_s = 1.0;   // mean arrivals per second
  double burstiness = 1.0;   // Gamma shape: 1 = Poisson, < 1 burstier, > 1 more regular
  double start_s = 0.0;      // first arrival (Periodic) or earliest arrival (others)
};

struct RequestClass {
  std::string name;
  Arrivals arrivals;
  LengthDist prompt_tokens;
  LengthDist output_tokens;
  int64_t shared_prefix_tokens = 0;  // leading tokens every request of the class shares
};

struct Workload {
  std::string name;
  std::vector<RequestClass> classes;
  double duration_s = 60;
};

// Built-in workloads: short, long, mixed, burst, shared-prefix (see workload.cpp for their numbers).
std::optional<Workload> builtin_workload(const std::string& name);
std::vector<std::string> builtin_workload_names();
// A workload from JSON: {"name", "duration_s", "classes": [{"name", "arrival": {"type":
// "poisson"|"gamma"|"periodic", "rate", "burstiness", "start_s"}, "prompt_tokens": N | {"mean",
// "spread"}, "output_tokens": ..., "shared_prefix_tokens"}]}. Throws ft::Error naming the field
// (a wrong type, a value out of range: lengths up to kMaxRequestTokens, duration_s up to
// kMaxDurationS, start_s in [0, kMaxDurationS]: at or past the run's duration, no arrivals).
Workload workload_from_json(const nlohmann::json& j);

struct PlannedRequest {
  double at_s = 0;
  int32_t class_index = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
};
// Every arrival in [0, duration), time order; deterministic for a seed. Throws ft::Error when
// duration_s is not in (0, kMaxDurationS], a start_s not in [0, duration_s), or the plan would
// exceed kMaxPlannedRequests (naming the class's rate x duration).
std::vector<PlannedRequest> plan_arrivals(const Workload& w, uint64_t seed);

struct Summary {
  size_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
// Percentiles by linear interpolation between order statistics (numpy's default).
Summary summarize(std::vector<double> values);

}  // namespace ft::loadgen
