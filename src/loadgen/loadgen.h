// An asynchronous load generator for any OpenAI-compatible server: one io_context thread, one
// HTTP/1.1 connection per request (Boost.Beast), streamed responses parsed as they arrive and
// each SSE chunk timestamped on arrival.
//
// Open loop (concurrency 0): requests start at the plan's absolute times (plan_arrivals) whatever
// the responses do. Closed loop (concurrency N): N requests in flight, the next one starts when
// one finishes, taking the plan's lengths in order (cycling) until max_requests (default: the
// plan's count) or the duration.
//
// Prompts: token-id arrays of exact lengths for /v1/completions (ids drawn in token_lo..token_hi;
// a class's shared_prefix_tokens leading ids are the same for all its requests of the run); for
// chat or text_prompts, a repeated word, so lengths are approximate. Every run draws a fresh salt
// for the prompt contents, so no two runs (nor two classes) share a prefix in the server's prefix
// cache; arrivals and lengths depend on the seed alone. Outputs have exact lengths:
// max_tokens + ignore_eos; usage.completion_tokens (stream_options.include_usage) is preferred to
// the count of chunks with text.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loadgen/report.h"
#include "loadgen/sse.h"
#include "loadgen/workload.h"

namespace ft::loadgen {

// The longest per-request timeout (--timeout), in seconds.
inline constexpr double kMaxTimeoutS = 1e6;

struct LoadgenOptions {
  ServerUrl url;
  std::string model;                    // "" = the first of GET /v1/models
  bool chat = false;                    // /v1/chat/completions instead of /v1/completions
  bool text_prompts = false;            // completions with text prompts (approximate lengths)
  Workload workload;
  uint64_t seed = 0;
  int concurrency = 0;                  // 0 = open loop
  int64_t max_requests = 0;             // 0 = no cap (open loop: the plan; closed loop: the plan's count); <= kMaxPlannedRequests
  double timeout_s = 120;               // per request, connect to last byte; (0, kMaxTimeoutS]
  double connect_timeout_s = 10;
  int32_t token_lo = 100, token_hi = 255;  // prompt token ids, inclusive
  bool progress = true;                 // the one-line progress bar on stderr
  double progress_tick_s = 0.25;        // its refresh (the run's own timer, on or off)
  uint64_t prompt_salt = 0;             // 0 = a random one per run
};

struct LoadgenResult {
  std::string model;
  uint64_t prompt_salt = 0;
  std::vector<RequestRecord> records;  // in start order
  double wall_s = 0;                   // first start to last finish
};

// Throws ft::Error when the server cannot be reached (or --model is needed and /v1/models fails).
LoadgenResult run_loadgen(const LoadgenOptions& opt);

// A blocking request with a deadline (connect + whole response). Throws ft::Error on a connection
// failure or timeout, naming the URL.
struct HttpReply {
  int status = 0;
  std::string body;
};
HttpReply http_request(const ServerUrl& url, const std::string& method, const std::string& path,
                       const std::string& body, double timeout_s);

// The prompt of a planned request: token ids (exact length; the class's shared prefix first), a
// function of (salt, class, request index).
std::vector<int32_t> prompt_token_ids(const PlannedRequest& p, const RequestClass& c, uint64_t salt,
                                      uint64_t request_index, int32_t lo, int32_t hi);
// A text of about n tokens (a repeated word).
std::string prompt_text(int64_t n);

}  // namespace ft::loadgen
