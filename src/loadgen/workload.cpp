#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"

namespace ft::loadgen {

std::vector<std::string> builtin_workload_names() { return {"short", "long", "mixed", "burst", "shared-prefix"}; }

std::optional<Workload> builtin_workload(const std::string& name) {
  using K = Arrivals::Kind;
  Workload w;
  w.name = name;
  if (name == "short") {  // chat-like short prompts, Poisson 1/s
    w.classes = {{"short", {K::Poisson, 1.0, 1.0, 0.0}, {45, 5}, {16, 0}, 0}};
  } else if (name == "long") {  // long documents, one every 20 s
    w.classes = {{"long", {K::Periodic, 0.05, 1.0, 0.0}, {2700, 50}, {16, 0}, 0}};
  } else if (name == "mixed") {  // the TTFT headline workload: long prompts among short ones
    w.classes = {{"long", {K::Periodic, 0.05, 1.0, 1.0}, {2700, 50}, {16, 0}, 0},
                 {"short", {K::Poisson, 1.0, 1.0, 0.0}, {45, 5}, {16, 0}, 0}};
  } else if (name == "burst") {  // two long documents together, every 30 s
    w.classes = {{"long-a", {K::Periodic, 1.0 / 30, 1.0, 0.0}, {2700, 50}, {16, 0}, 0},
                 {"long-b", {K::Periodic, 1.0 / 30, 1.0, 0.0}, {2700, 50}, {16, 0}, 0}};
  } else if (name == "shared-prefix") {  // one system prompt shared by every request
    w.classes = {{"shared-prefix", {K::Poisson, 1.0, 1.0, 0.0}, {600, 20}, {16, 0}, 512}};
  } else {
    return std::nullopt;
  }
  return w;
}

namespace {

LengthDist length_from_json(const nlohmann::json& j, const std::string& field) {
  LengthDist d;
  if (j.is_number_integer()) {
    d.mean = j.get<int64_t>();
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items())
      if (k != "mean" && k != "spread") fail("workload: unknown key '", field, ".", k, "'");
    if (!j.contains("mean") || !j["mean"].is_number_integer())
      fail("workload: '", field, ".mean' must be an integer");
    d.mean = j["mean"].get<int64_t>();
    if (j.contains("spread")) {
      if (!j["spread"].is_number_integer()) fail("workload: '", field, ".spread' must be an integer");
      d.spread = j["spread"].get<int64_t>();
    }
  } else {
    fail("workload: '", field, "' must be an integer or {\"mean\", \"spread\"}");
  }
  if (d.mean < 1 || d.spread < 0 || d.spread >= d.mean)
    fail("workload: '", field, "' needs mean >= 1 and 0 <= spread < mean");
  if (d.mean > kMaxRequestTokens - d.spread)  // mean + spread, without overflow
    fail("workload: '", field, "' must stay within ", kMaxRequestTokens, " tokens (mean + spread), got mean ", d.mean,
         " spread ", d.spread);
  return d;
}

double number(const nlohmann::json& j, const std::string& field) {
  if (!j.is_number()) fail("workload: '", field, "' must be a number");
  return j.get<double>();
}

// An optional string key of obj (its default when absent).
std::string string_or(const nlohmann::json& obj, const char* key, const std::string& field, std::string dflt) {
  if (!obj.contains(key)) return dflt;
  if (!obj[key].is_string()) fail("workload: '", field, "' must be a string");
  return obj[key].get<std::string>();
}

void check_duration(double d, const char* what) {
  if (!(d > 0 && d <= kMaxDurationS)) fail(what, " must be in (0, ", kMaxDurationS, "] seconds, got ", d);
}

}  // namespace

Workload workload_from_json(const nlohmann::json& j) {
  if (!j.is_object()) fail("workload: expected a JSON object");
  Workload w;
  for (const auto& [k, v] : j.items())
    if (k != "name" && k != "duration_s" && k != "classes") fail("workload: unknown key '", k, "'");
  w.name = string_or(j, "name", "name", "custom");
  if (j.contains("duration_s")) w.duration_s = number(j["duration_s"], "duration_s");
  check_duration(w.duration_s, "workload: 'duration_s'");
  if (!j.contains("classes") || !j["classes"].is_array() || j["classes"].empty())
    fail("workload: 'classes' must be a non-empty array");
  for (size_t i = 0; i < j["classes"].size(); ++i) {
    const auto& c = j["classes"][i];
    const std::string at = "classes[" + std::to_string(i) + "]";
    if (!c.is_object()) fail("workload: '", at, "' must be an object");
    for (const auto& [k, v] : c.items())
      if (k != "name" && k != "arrival" && k != "prompt_tokens" && k != "output_tokens" &&
          k != "shared_prefix_tokens")
        fail("workload: unknown key '", at, ".", k, "'");
    RequestClass rc;
    rc.name = string_or(c, "name", at + ".name", "class" + std::to_string(i));
    if (!c.contains("arrival") || !c["arrival"].is_object()) fail("workload: '", at, ".arrival' must be an object");
    const auto& a = c["arrival"];
    for (const auto& [k, v] : a.items())
      if (k != "type" && k != "rate" && k != "burstiness" && k != "start_s")
        fail("workload: unknown key '", at, ".arrival.", k, "'");
    const std::string type = string_or(a, "type", at + ".arrival.type", "poisson");
    if (type == "poisson") rc.arrivals.kind = Arrivals::Kind::Poisson;
    else if (type == "gamma") rc.arrivals.kind = Arrivals::Kind::Gamma;
    else if (type == "periodic") rc.arrivals.kind = Arrivals::Kind::Periodic;
    else fail("workload: '", at, ".arrival.type' must be poisson, gamma or periodic, got '", type, "'");
    if (!a.contains("rate")) fail("workload: '", at, ".arrival.rate' is required");
    rc.arrivals.rate_per_s = number(a["rate"], at + ".arrival.rate");
    if (!(rc.arrivals.rate_per_s > 0)) fail("workload: '", at, ".arrival.rate' must be > 0");
    if (a.contains("burstiness")) rc.arrivals.burstiness = number(a["burstiness"], at + ".arrival.burstiness");
    if (!(rc.arrivals.burstiness > 0)) fail("workload: '", at, ".arrival.burstiness' must be > 0");
    if (a.contains("start_s")) rc.arrivals.start_s = number(a["start_s"], at + ".arrival.start_s");
    // (>= the run's duration: no arrivals; that duration may be --duration's, set after this)
    if (!(rc.arrivals.start_s >= 0 && rc.arrivals.start_s <= kMaxDurationS))
      fail("workload: '", at, ".arrival.start_s' must be in [0, ", kMaxDurationS, "] seconds, got ", rc.arrivals.start_s);
    if (!c.contains("prompt_tokens")) fail("workload: '", at, ".prompt_tokens' is required");
    rc.prompt_tokens = length_from_json(c["prompt_tokens"], at + ".prompt_tokens");
    if (!c.contains("output_tokens")) fail("workload: '", at, ".output_tokens' is required");
    rc.output_tokens = length_from_json(c["output_tokens"], at + ".output_tokens");
    if (c.contains("shared_prefix_tokens")) {
      if (!c["shared_prefix_tokens"].is_number_integer()) fail("workload: '", at, ".shared_prefix_tokens' must be an integer");
      rc.shared_prefix_tokens = c["shared_prefix_tokens"].get<int64_t>();
      if (rc.shared_prefix_tokens < 0 || rc.shared_prefix_tokens >= rc.prompt_tokens.mean - rc.prompt_tokens.spread)
        fail("workload: '", at, ".shared_prefix_tokens' must be below the shortest prompt");
    }
    w.classes.push_back(rc);
  }
  return w;
}

std::vector<PlannedRequest> plan_arrivals(const Workload& w, uint64_t seed) {
  check_duration(w.duration_s, "bench: the workload's duration");
  std::vector<PlannedRequest> out;
  for (size_t ci = 0; ci < w.classes.size(); ++ci) {
    const RequestClass& c = w.classes[ci];
    if (!(c.arrivals.start_s >= 0 && std::isfinite(c.arrivals.start_s)))
      fail("bench: class '", c.name, "': start_s must be finite and >= 0, got ", c.arrivals.start_s);
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + ci + 1);
    auto uniform01 = [&] { return double(rng() >> 11) * 0x1.0p-53; };
    auto length = [&](const LengthDist& d) {
      return d.spread == 0 ? d.mean : d.mean - d.spread + int64_t(rng() % uint64_t(2 * d.spread + 1));
    };
    // Gamma inter-arrival times with shape k and mean 1/rate (k = 1: exponential = Poisson).
    const double k = c.arrivals.kind == Arrivals::Kind::Gamma ? c.arrivals.burstiness : 1.0;
    std::gamma_distribution<double> gap(k, 1.0 / (k * c.arrivals.rate_per_s));
    double t = c.arrivals.start_s;
    for (;;) {
      if (c.arrivals.kind != Arrivals::Kind::Periodic) {
        // Draw through our own uniform source for the exponential case (portable across
        // standard libraries); gamma with shape != 1 uses the library distribution.
        t += k == 1.0 ? -std::log(1.0 - uniform01()) / c.arrivals.rate_per_s : gap(rng);
      }
      if (t >= w.duration_s) break;
      if (int64_t(out.size()) >= kMaxPlannedRequests)
        fail("bench: the workload plans more than ", kMaxPlannedRequests, " requests (class '", c.name, "': rate ",
             c.arrivals.rate_per_s, "/s x duration ", w.duration_s, " s): lower the rate or the duration");
      out.push_back({t, int32_t(ci), length(c.prompt_tokens), length(c.output_tokens)});
      if (c.arrivals.kind == Arrivals::Kind::Periodic) t += 1.0 / c.arrivals.rate_per_s;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.at_s < b.at_s; });
  return out;
}

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  auto pct = [&](double p) {
    const double pos = p / 100.0 * double(v.size() - 1);
    const size_t lo = size_t(std::floor(pos));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
  };
  s.p50 = pct(50);
  s.p90 = pct(90);
  s.p99 = pct(99);
  s.max = v.back();
  return s;
}

}  // namespace ft::loadgen
