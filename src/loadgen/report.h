// What a load-generator run measured: one record per request, per-class statistics (TTFT, TPOT,
// ITL, end-to-end; counts, errors by kind, throughput, goodput under SLOs), the text report and
// the JSON results. Pure functions.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loadgen/workload.h"

namespace ft::loadgen {

struct RequestRecord {
  int32_t class_index = 0;
  double scheduled_s = 0;   // planned arrival (open loop), from the start of the run
  double start_s = 0;       // when the request was sent (connect started)
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 0;
  double ttft_s = -1;       // first chunk with text; -1 = none
  double e2e_s = -1;        // last byte of the response; -1 = not finished
  std::vector<double> itl_s;  // gaps between consecutive chunks with text
  int64_t chunks = 0;         // chunks with text
  int64_t output_tokens = 0;  // usage.completion_tokens when reported, else chunks
  std::string error;          // "" = completed; else its kind: "http_429", "connection", "timeout", "stream"
  std::string error_message;
  bool ok() const { return error.empty(); }
  // (e2e - ttft) / (output_tokens - 1); nullopt with fewer than 2 tokens or on error.
  std::optional<double> tpot_s() const;
};

// Service-level objectives in ms; a request meets them when it completed and every set bound holds.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, itl_ms, e2e_ms;  // itl: the request's worst gap
  bool any() const { return ttft_ms || tpot_ms || itl_ms || e2e_ms; }
};
// "ttft:500,tpot:100" (keys ttft, tpot, itl, e2e; values in ms > 0). Throws ft::Error.
Slo parse_slo(const std::string& spec);
bool meets_slo(const RequestRecord& r, const Slo& slo);

struct ClassStats {
  std::string name;
  size_t sent = 0, completed = 0, slo_met = 0;
  std::map<std::string, size_t> errors;  // kind -> count
  Summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
  int64_t output_tokens = 0;
  double output_tokens_per_s = 0, requests_per_s = 0, goodput_rps = 0;
};
// One entry per class (in class order) and a last one named "all". wall_s: the run's length
// (rates divide by it).
std::vector<ClassStats> class_stats(const std::vector<RequestRecord>& records,
                                    const std::vector<std::string>& class_names, double wall_s,
                                    const Slo& slo);

nlohmann::json summary_json(const Summary& s);
nlohmann::json class_stats_json(const ClassStats& c);
nlohmann::json record_json(const RequestRecord& r, const std::vector<std::string>& class_names);
// Fixed-width table: one block of rows per class.
std::string format_report(const std::vector<ClassStats>& stats, double wall_s, const Slo& slo);

}  // namespace ft::loadgen
