#include "loadgen/report.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ft::loadgen {

std::optional<double> RequestRecord::tpot_s() const {
  if (!ok() || output_tokens < 2 || ttft_s < 0 || e2e_s < 0) return std::nullopt;
  return (e2e_s - ttft_s) / double(output_tokens - 1);
}

Slo parse_slo(const std::string& spec) {
  Slo s;
  if (spec.empty()) fail("--slo: empty (expected e.g. ttft:500,tpot:100)");
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      fail("--slo: '", item, "' is not KEY:MS (expected e.g. ttft:500,tpot:100)");
    const std::string key = item.substr(0, colon), val = item.substr(colon + 1);
    double ms = 0;
    size_t used = 0;
    try {
      ms = std::stod(val, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != val.size() || !(ms > 0))
      fail("--slo: '", item, "': the value must be a number of milliseconds > 0");
    if (key == "ttft") s.ttft_ms = ms;
    else if (key == "tpot") s.tpot_ms = ms;
    else if (key == "itl") s.itl_ms = ms;
    else if (key == "e2e") s.e2e_ms = ms;
    else fail("--slo: unknown key '", key, "' (ttft, tpot, itl, e2e)");
    pos = comma + 1;
  }
  return s;
}

bool meets_slo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_ms && !(r.ttft_s >= 0 && r.ttft_s * 1e3 <= *slo.ttft_ms)) return false;
  if (slo.e2e_ms && !(r.e2e_s >= 0 && r.e2e_s * 1e3 <= *slo.e2e_ms)) return false;
  if (slo.tpot_ms) {
    const auto t = r.tpot_s();
    if (t && *t * 1e3 > *slo.tpot_ms) return false;
  }
  if (slo.itl_ms && !r.itl_s.empty() && *std::max_element(r.itl_s.begin(), r.itl_s.end()) * 1e3 > *slo.itl_ms)
    return false;
  return true;
}

namespace {

ClassStats stats_of(const std::string& name, const std::vector<const RequestRecord*>& rs, double wall_s,
                    const Slo& slo) {
  ClassStats c;
  c.name = name;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord* r : rs) {
    ++c.sent;
    if (!r->ok()) {
      ++c.errors[r->error];
      continue;
    }
    ++c.completed;
    if (meets_slo(*r, slo)) ++c.slo_met;
    c.output_tokens += r->output_tokens;
    if (r->ttft_s >= 0) ttft.push_back(r->ttft_s * 1e3);
    if (r->e2e_s >= 0) e2e.push_back(r->e2e_s * 1e3);
    if (const auto t = r->tpot_s()) tpot.push_back(*t * 1e3);
    for (double g : r->itl_s) itl.push_back(g * 1e3);
  }
  c.ttft_ms = summarize(std::move(ttft));
  c.tpot_ms = summarize(std::move(tpot));
  c.itl_ms = summarize(std::move(itl));
  c.e2e_ms = summarize(std::move(e2e));
  if (wall_s > 0) {
    c.output_tokens_per_s = double(c.output_tokens) / wall_s;
    c.requests_per_s = double(c.completed) / wall_s;
    c.goodput_rps = double(c.slo_met) / wall_s;
  }
  return c;
}

}  // namespace

std::vector<ClassStats> class_stats(const std::vector<RequestRecord>& records,
                                    const std::vector<std::string>& class_names, double wall_s,
                                    const Slo& slo) {
  std::vector<ClassStats> out;
  std::vector<const RequestRecord*> all;
  for (const auto& r : records) all.push_back(&r);
  for (size_t ci = 0; ci < class_names.size(); ++ci) {
    std::vector<const RequestRecord*> rs;
    for (const auto* r : all)
      if (r->class_index == int32_t(ci)) rs.push_back(r);
    out.push_back(stats_of(class_names[ci], rs, wall_s, slo));
  }
  out.push_back(stats_of("all", all, wall_s, slo));
  return out;
}

nlohmann::json summary_json(const Summary& s) {
  return {{"n", s.n}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}};
}

nlohmann::json class_stats_json(const ClassStats& c) {
  nlohmann::json errors = nlohmann::json::object();
  size_t n_err = 0;
  for (const auto& [k, n] : c.errors) {
    errors[k] = n;
    n_err += n;
  }
  return {{"name", c.name},
          {"sent", c.sent},
          {"completed", c.completed},
          {"errors", errors},
          {"error_count", n_err},
          {"ttft_ms", summary_json(c.ttft_ms)},
          {"tpot_ms", summary_json(c.tpot_ms)},
          {"itl_ms", summary_json(c.itl_ms)},
          {"e2e_ms", summary_json(c.e2e_ms)},
          {"output_tokens", c.output_tokens},
          {"output_tokens_per_s", c.output_tokens_per_s},
          {"requests_per_s", c.requests_per_s},
          {"slo_met", c.slo_met},
          {"goodput_rps", c.goodput_rps}};
}

nlohmann::json record_json(const RequestRecord& r, const std::vector<std::string>& class_names) {
  nlohmann::json j = {{"class", r.class_index >= 0 && size_t(r.class_index) < class_names.size()
                                    ? class_names[size_t(r.class_index)]
                                    : std::string("?")},
                      {"scheduled_s", r.scheduled_s},
                      {"start_s", r.start_s},
                      {"prompt_tokens", r.prompt_tokens},
                      {"max_tokens", r.max_tokens},
                      {"ttft_s", r.ttft_s >= 0 ? nlohmann::json(r.ttft_s) : nlohmann::json(nullptr)},
                      {"e2e_s", r.e2e_s >= 0 ? nlohmann::json(r.e2e_s) : nlohmann::json(nullptr)},
                      {"itl_s", r.itl_s},
                      {"chunks", r.chunks},
                      {"output_tokens", r.output_tokens},
                      {"error", r.ok() ? nlohmann::json(nullptr) : nlohmann::json(r.error)}};
  if (!r.ok()) j["error_message"] = r.error_message;
  return j;
}

std::string format_report(const std::vector<ClassStats>& stats, double wall_s, const Slo& slo) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "duration %.2f s\n", wall_s);
  s += line;
  for (const ClassStats& c : stats) {
    std::string errs;
    size_t n_err = 0;
    for (const auto& [k, n] : c.errors) {
      errs += (errs.empty() ? "" : ", ") + k + " " + std::to_string(n);
      n_err += n;
    }
    std::snprintf(line, sizeof line,
                  "\n== %s: sent %zu, completed %zu, errors %zu%s%s%s\n", c.name.c_str(), c.sent, c.completed, n_err,
                  errs.empty() ? "" : " (", errs.c_str(), errs.empty() ? "" : ")");
    s += line;
    std::snprintf(line, sizeof line, "  %-10s %10s %10s %10s %10s %10s %8s\n", "ms", "mean", "p50", "p90", "p99",
                  "max", "n");
    s += line;
    auto row = [&](const char* name, const Summary& m) {
      if (m.n == 0)
        std::snprintf(line, sizeof line, "  %-10s %10s %10s %10s %10s %10s %8zu\n", name, "-", "-", "-", "-", "-", m.n);
      else
        std::snprintf(line, sizeof line, "  %-10s %10.2f %10.2f %10.2f %10.2f %10.2f %8zu\n", name, m.mean, m.p50,
                      m.p90, m.p99, m.max, m.n);
      s += line;
    };
    row("TTFT", c.ttft_ms);
    row("TPOT", c.tpot_ms);
    row("ITL", c.itl_ms);
    row("E2E", c.e2e_ms);
    std::snprintf(line, sizeof line, "  output %.1f tokens/s, %.3f requests/s", c.output_tokens_per_s,
                  c.requests_per_s);
    s += line;
    if (slo.any()) {
      std::snprintf(line, sizeof line, ", goodput %.3f requests/s (%zu meet the SLOs)", c.goodput_rps, c.slo_met);
      s += line;
    }
    s += "\n";
  }
  return s;
}

}  // namespace ft::loadgen
