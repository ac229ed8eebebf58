// Prometheus metrics of the server (text exposition format 0.0.4). Names follow vLLM's with the
// prefix "firsttoken:" (README lists them). Histograms/counters owned here are updated from the
// per-request RequestTimings of each Finished event; gauges and engine counters come from an
// Engine::metrics() snapshot at scrape time.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace ft::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends "# HELP/# TYPE" and the _bucket/_sum/_count lines (buckets cumulative, le="+Inf" last).
  void render(std::string& out, const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Appends a histogram's "# HELP/# TYPE" and _bucket/_sum/_count lines (buckets cumulative,
// le="+Inf" last); counts are per bucket, one more than bounds (the last: above every bound).
void render_histogram(std::string& out, const std::string& name, const std::string& help,
                      std::span<const double> bounds, std::span<const uint64_t> counts, double sum, uint64_t count);

// Appends a gauge's "# HELP/# TYPE" and value lines.
void render_gauge(std::string& out, const std::string& name, const std::string& help, double v);

// Latency buckets in seconds, 1 ms .. 60 s.
std::vector<double> latency_buckets();

// One listener's connections (HTTP or binary): open now, and refused at accept (over the cap);
// `refusing`: refused ones still being answered (HTTP's 503), themselves capped (listener.cpp).
struct ListenerStats {
  std::atomic<int64_t> open{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<int64_t> refusing{0};
  std::atomic<uint64_t> accept_errors{0};  // in a row (reset by an accept that succeeds)
};

class ServerMetrics {
 public:
  ServerMetrics();
  ListenerStats http, binary;
  std::atomic<uint64_t> frame_timeouts{0};  // binary frames that did not arrive in time (connection closed)
  // One finished request (finish: "stop" | "length" | "abort"); n_generated counts its tokens.
  void observe_finished(const RequestTimings& t, const std::string& finish, int64_t n_prompt, int64_t n_generated);
  void count_rejected();  // 429
  void count_error();     // 4xx/5xx bodies other than 429
  std::string render(const EngineMetrics& m) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, queue_, prefill_, decode_, itl_, e2e_, tokenize_;
  uint64_t success_stop_ = 0, success_length_ = 0, success_abort_ = 0;
  uint64_t rejected_ = 0, errors_ = 0;
};

}  // namespace ft::server
