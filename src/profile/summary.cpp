#include "profile/summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <unordered_map>

#include "core/error.h"

namespace ft::profile {

using json = nlohmann::json;

namespace {

struct Span {
  std::string name, cat;
  int tid = 0;
  double ts = 0, dur = 0;  // us
  const json* args = nullptr;
  double end() const { return ts + dur; }
};

double num(const json* args, const char* key, double dflt = 0) {
  if (!args || !args->is_object()) return dflt;
  auto it = args->find(key);
  return it != args->end() && it->is_number() ? it->get<double>() : dflt;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string mib(double bytes) { return fmt("%.2f MiB", bytes / (1024.0 * 1024.0)); }

std::string dist_line(const Dist& d, const char* unit = "ms") {
  const double k = std::string(unit) == "us" ? 1e3 : 1.0;
  char buf[256];
  std::snprintf(buf, sizeof buf, "n %lld, p50 %.3f %s, p99 %.3f %s, max %.3f %s", (long long)d.count, d.p50 * k, unit,
                d.p99 * k, unit, d.max * k, unit);
  return buf;
}

}  // namespace

Dist make_dist(std::vector<double> v) {
  Dist d;
  d.count = int64_t(v.size());
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  for (double x : v) d.sum += x;
  d.mean = d.sum / double(v.size());
  auto rank = [&](double p) {  // nearest rank
    const size_t r = size_t(std::ceil(p * double(v.size())));
    return v[std::min(v.size() - 1, r == 0 ? 0 : r - 1)];
  };
  d.p50 = rank(0.50);
  d.p99 = rank(0.99);
  d.max = v.back();
  return d;
}

Summary summarize(const json& trace) {
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    fail("not a Chrome trace: no traceEvents array");
  Summary s;
  const json& evs = trace["traceEvents"];

  std::unordered_map<int, std::string> thread_names;
  std::vector<Span> spans;
  struct Async {
    double b = -1, e = -1;
  };
  std::map<std::pair<std::string, std::string>, Async> asyncs;  // (id, name)
  std::vector<std::pair<double, const json*>> kv_counters;
  double t_min = INFINITY, t_max = -INFINITY;
  for (const json& e : evs) {
    if (!e.is_object() || !e.contains("ph")) continue;
    const std::string ph = e.value("ph", "");
    if (ph == "M") {
      if (e.value("name", "") == "thread_name" && e.contains("args"))
        thread_names[e.value("tid", 0)] = e["args"].value("name", "");
      continue;
    }
    const double ts = e.value("ts", 0.0);
    const double dur = ph == "X" ? e.value("dur", 0.0) : 0.0;
    t_min = std::min(t_min, ts);
    t_max = std::max(t_max, ts + dur);
    if (ph == "X") {
      Span sp;
      sp.name = e.value("name", "");
      sp.cat = e.value("cat", "");
      sp.tid = e.value("tid", 0);
      sp.ts = ts;
      sp.dur = dur;
      if (auto it = e.find("args"); it != e.end()) sp.args = &*it;
      spans.push_back(std::move(sp));
    } else if (ph == "b" || ph == "e") {
      const std::string id = e.contains("id") ? (e["id"].is_string() ? e["id"].get<std::string>() : e["id"].dump()) : "";
      Async& a = asyncs[{id, e.value("name", "")}];
      (ph == "b" ? a.b : a.e) = ts;
    } else if (ph == "C" && e.value("name", "") == "kv_blocks" && e.contains("args")) {
      kv_counters.emplace_back(ts, &e["args"]);
    }
  }
  s.wall_ms = t_max > t_min ? (t_max - t_min) / 1e3 : 0;
  if (trace.contains("otherData") && trace["otherData"].is_object()) {
    for (const auto& [k, v] : trace["otherData"].items()) s.meta[k] = v;
    s.dropped_events = trace["otherData"].value("dropped_events", int64_t(0));
  }

  // The engine thread: named "engine", else the one with the most steps.
  for (const auto& [tid, name] : thread_names)
    if (name == "engine") s.engine_tid = tid;
  if (s.engine_tid < 0) {
    std::map<int, int> n;
    for (const Span& sp : spans)
      if (sp.name == "step") ++n[sp.tid];
    int best = 0;
    for (const auto& [tid, c] : n)
      if (c > best) best = c, s.engine_tid = tid;
  }

  std::vector<const Span*> steps, forwards, inner;  // inner: ops and engine phases on the engine thread
  for (const Span& sp : spans) {
    if (sp.tid != s.engine_tid) {
      if (sp.cat == "op") s.outside_steps_ms += sp.dur / 1e3;  // e.g. calibration in the engine's constructor
      continue;
    }
    if (sp.cat == "engine" && sp.name == "step")
      steps.push_back(&sp);
    else if (sp.cat == "engine" && sp.name == "forward")
      forwards.push_back(&sp);
    else if (sp.cat == "op" || sp.cat == "engine" || sp.cat == "comm")
      inner.push_back(&sp);
  }
  auto by_ts = [](const Span* a, const Span* b) { return a->ts < b->ts; };
  std::sort(steps.begin(), steps.end(), by_ts);
  // Steps run between the blocks of another lie inside that one's span (EngineCore::between_blocks).
  std::vector<const Span*> outer_steps, between_steps;
  for (const Span* st : steps) (num(st->args, "between_blocks") > 0 ? between_steps : outer_steps).push_back(st);
  std::sort(forwards.begin(), forwards.end(), by_ts);
  std::sort(inner.begin(), inner.end(), by_ts);
  constexpr double kEps = 0.002;  // us: the file's timestamps are rounded to ns
  // The innermost span of `outer` holding sp (not sp itself). A step between the blocks of
  // another (and its forward) lies inside that one's span: what follows it there belongs to the
  // outer one, a few spans back.
  auto inside = [&](const std::vector<const Span*>& outer, const Span& sp) -> const Span* {
    auto it = std::upper_bound(outer.begin(), outer.end(), sp.ts + kEps,
                               [](double t, const Span* o) { return t < o->ts; });
    for (int back = 0; it != outer.begin() && back < 64; ++back) {
      const Span* o = *--it;
      if (o != &sp && sp.end() <= o->end() + kEps) return o;
    }
    return nullptr;
  };

  // Steps.
  s.steps = int64_t(steps.size());
  s.between_steps = int64_t(between_steps.size());
  for (const Span* st : outer_steps) s.step_ms += st->dur / 1e3;
  for (const Span* st : between_steps) s.between_ms += st->dur / 1e3;  // (inside an outer step's time)
  std::vector<double> step_durs;
  double tokens = 0, decode = 0, prefill = 0, err = 0;
  int64_t n_err = 0;
  for (const Span* st : steps) {
    step_durs.push_back(st->dur / 1e3);
    tokens += num(st->args, "tokens");
    decode += num(st->args, "n_decode");
    prefill += num(st->args, "prefill_tokens");
    const double pred = num(st->args, "predicted_ms", -1), meas = num(st->args, "forward_ms", -1);
    if (pred > 0 && meas > 0) {
      err += std::abs(pred - meas) / meas;
      ++n_err;
    }
  }
  if (!steps.empty()) {
    s.tokens_per_step = tokens / double(steps.size());
    s.decode_per_step = decode / double(steps.size());
    s.prefill_per_step = prefill / double(steps.size());
    s.engine_window_ms = (steps.back()->end() - steps.front()->ts) / 1e3;
  }
  s.predict_abs_err = n_err ? err / double(n_err) : 0;
  s.step_dur = make_dist(step_durs);
  for (const Span* f : forwards)
    if (inside(steps, *f)) s.forward_ms += f->dur / 1e3;

  // Ops (and the engine's own phases, and the MPI communication) inside steps, by name.
  std::map<std::string, OpRow> rows;
  std::set<int> layers;
  std::vector<std::vector<const Span*>> ops_of_forward(forwards.size());
  std::map<const Span*, double> comm_of_step;  // (tensor/pipeline parallel: allreduce, broadcast, pp_send/recv)
  for (const Span* sp : inner) {
    const Span* step = inside(steps, *sp);
    if (!step) {
      if (sp->cat == "op") s.outside_steps_ms += sp->dur / 1e3;
      continue;
    }
    if (sp->cat == "comm") {
      comm_of_step[step] += sp->dur / 1e3;
      if (const Span* f = inside(forwards, *sp)) {  // (waiting on another rank is not an idle gap of this one)
        const size_t fi = size_t(std::lower_bound(forwards.begin(), forwards.end(), f, by_ts) - forwards.begin());
        if (fi < forwards.size()) ops_of_forward[fi].push_back(sp);
      }
    }
    OpRow& r = rows[sp->name];
    r.name = sp->name;
    r.cat = sp->cat;
    ++r.calls;
    r.total_ms += sp->dur / 1e3;
    r.flops += num(sp->args, "flops");
    r.bytes += num(sp->args, "bytes");
    if (sp->cat == "op") {
      const double layer = num(sp->args, "layer", -1);
      if (layer >= 0) layers.insert(int(layer));
      if (const Span* f = inside(forwards, *sp)) {
        const size_t fi = size_t(std::lower_bound(forwards.begin(), forwards.end(), f, by_ts) - forwards.begin());
        if (fi < forwards.size()) ops_of_forward[fi].push_back(sp);
      }
    }
  }
  if (!comm_of_step.empty()) {
    std::vector<double> per_step;
    for (const Span* st : steps) per_step.push_back(comm_of_step.count(st) ? comm_of_step[st] : 0.0);
    s.comm_per_step = make_dist(per_step);
  }
  for (auto& [name, r] : rows) {
    r.share = s.step_ms > 0 ? r.total_ms / s.step_ms : 0;
    s.ops.push_back(r);
  }
  std::sort(s.ops.begin(), s.ops.end(), [](const OpRow& a, const OpRow& b) { return a.total_ms > b.total_ms; });
  s.layers.assign(layers.begin(), layers.end());

  // Idle gaps between ops inside each forward pass (a step between its blocks is one of them).
  for (const Span* st : between_steps)
    if (const Span* o = inside(forwards, *st)) {
      const size_t fi = size_t(std::lower_bound(forwards.begin(), forwards.end(), o, by_ts) - forwards.begin());
      auto& ops = ops_of_forward[fi];
      ops.insert(std::upper_bound(ops.begin(), ops.end(), st, by_ts), st);
    }
  std::vector<double> gaps;
  for (size_t fi = 0; fi < forwards.size(); ++fi) {
    const auto& ops = ops_of_forward[fi];
    if (ops.empty() || !inside(steps, *forwards[fi])) continue;
    double t = forwards[fi]->ts;
    for (const Span* op : ops) {
      gaps.push_back(std::max(0.0, op->ts - t) / 1e3);
      t = std::max(t, op->end());
    }
    gaps.push_back(std::max(0.0, forwards[fi]->end() - t) / 1e3);
  }
  s.op_gaps = make_dist(gaps);

  // Idle gaps between steps (those between blocks are inside one).
  std::vector<double> sg, sg_pending;
  std::vector<StepGap> all_gaps;
  for (size_t i = 1; i < outer_steps.size(); ++i) {
    const Span* a = outer_steps[i - 1];
    StepGap g;
    g.at_ms = a->end() / 1e3;
    g.ms = std::max(0.0, outer_steps[i]->ts - a->end()) / 1e3;
    g.pending = num(a->args, "running") + num(a->args, "waiting") > 0;
    sg.push_back(g.ms);
    if (g.pending) sg_pending.push_back(g.ms);
    all_gaps.push_back(g);
  }
  s.step_gaps = make_dist(sg);
  s.step_gaps_pending = make_dist(sg_pending);
  std::sort(all_gaps.begin(), all_gaps.end(), [](const StepGap& a, const StepGap& b) { return a.ms > b.ms; });
  all_gaps.resize(std::min<size_t>(all_gaps.size(), 5));
  s.largest_step_gaps = all_gaps;

  // KV blocks over time.
  double used_sum = 0, cached_sum = 0;
  for (const auto& [ts, args] : kv_counters) {
    const double used = num(args, "used"), cached = num(args, "prefix_cached");
    s.kv_used_max = std::max(s.kv_used_max, used);
    s.kv_cached_max = std::max(s.kv_cached_max, cached);
    used_sum += used;
    cached_sum += cached;
  }
  s.kv_samples = int64_t(kv_counters.size());
  if (s.kv_samples) {
    s.kv_used_mean = used_sum / double(s.kv_samples);
    s.kv_cached_mean = cached_sum / double(s.kv_samples);
  }

  // Requests: async phases per id, tokenization spans.
  std::map<std::string, std::vector<double>> phase;
  for (const auto& [key, a] : asyncs)
    if (a.b >= 0 && a.e >= a.b) phase[key.second].push_back((a.e - a.b) / 1e3);
  std::map<std::string, double> queue_by_id, prefill_by_id;
  for (const auto& [key, a] : asyncs) {
    if (a.b < 0 || a.e < a.b) continue;
    if (key.second == "queue") queue_by_id[key.first] = (a.e - a.b) / 1e3;
    if (key.second == "prefill") prefill_by_id[key.first] = (a.e - a.b) / 1e3;
  }
  std::vector<double> ttft;
  for (const auto& [id, q] : queue_by_id)
    if (auto it = prefill_by_id.find(id); it != prefill_by_id.end()) ttft.push_back(q + it->second);
  s.queue = make_dist(phase["queue"]);
  s.prefill = make_dist(phase["prefill"]);
  s.decode = make_dist(phase["decode"]);
  s.ttft = make_dist(ttft);
  std::vector<double> tok, parse, write, emit;
  for (const Span& sp : spans) {
    if (sp.name == "tokenize") tok.push_back(sp.dur / 1e3);
    else if (sp.name == "http.parse") parse.push_back(sp.dur / 1e3);
    else if (sp.name == "http.write") write.push_back(sp.dur / 1e3);
    else if (sp.name == "http.emit") emit.push_back(sp.dur / 1e3);
  }
  s.tokenize = make_dist(tok);
  s.http_parse = make_dist(parse);
  s.http_write = make_dist(write);
  s.http_emit = make_dist(emit);
  return s;
}

std::string format_summary(const Summary& s, int top_n) {
  std::string o;
  auto line = [&](const std::string& l) { o += l + "\n"; };
  char buf[512];

  std::snprintf(buf, sizeof buf, "wall %.2f ms (first to last event)", s.wall_ms);
  line(buf);
  if (s.steps == 0) {
    line("no engine steps in this trace");
  } else {
    const double idle = std::max(0.0, s.engine_window_ms - s.step_ms);
    std::snprintf(buf, sizeof buf,
                  "engine thread: %lld steps over %.2f ms: busy %.2f ms (%.1f%%), idle %.2f ms (%.1f%%)",
                  (long long)s.steps, s.engine_window_ms, s.step_ms,
                  s.engine_window_ms > 0 ? 100 * s.step_ms / s.engine_window_ms : 0.0, idle,
                  s.engine_window_ms > 0 ? 100 * idle / s.engine_window_ms : 0.0);
    line(buf);
  }

  // Top ops: backend ops first (what the forward pass spends), by share.
  std::vector<const OpRow*> top;
  for (const OpRow& r : s.ops)
    if (int(top.size()) < top_n) top.push_back(&r);
  std::string t = "top ops:";
  for (size_t i = 0; i < top.size(); ++i)
    t += (i ? ", " : " ") + top[i]->name + " " + fmt("%.1f%%", 100 * top[i]->share);
  if (top.empty()) t += " (none)";
  line(t);
  line("");

  std::snprintf(buf, sizeof buf, "time inside steps by op (%% of %.2f ms in steps):", s.step_ms);
  line(buf);
  std::snprintf(buf, sizeof buf, "  %-22s %8s %10s %7s %10s %9s %8s", "op", "calls", "total ms", "share", "mean us",
                "GFLOP/s", "GB/s");
  line(buf);
  for (const OpRow& r : s.ops) {
    const bool rate = r.cat == "op";
    std::snprintf(buf, sizeof buf, "  %-22s %8lld %10.3f %6.1f%% %10.2f %9s %8s", r.name.c_str(), (long long)r.calls,
                  r.total_ms, 100 * r.share, r.calls ? r.total_ms * 1e3 / double(r.calls) : 0.0,
                  rate && r.flops > 0 ? fmt("%.2f", r.gflops()).c_str() : "-",
                  rate && r.bytes > 0 ? fmt("%.2f", r.gbps()).c_str() : "-");
    line(buf);
  }
  std::snprintf(buf, sizeof buf, "  %-22s %8lld %10.3f %6.1f%%", "(gaps between ops)", (long long)s.op_gaps.count,
                s.op_gaps.sum, s.step_ms > 0 ? 100 * s.op_gaps.sum / s.step_ms : 0.0);
  line(buf);
  if (!s.layers.empty()) {
    std::snprintf(buf, sizeof buf, "  per-layer ops seen for %zu layers (%d..%d)", s.layers.size(), s.layers.front(),
                  s.layers.back());
    line(buf);
  }
  if (s.outside_steps_ms > 0) {
    std::snprintf(buf, sizeof buf, "  (not counted: %.2f ms of ops outside steps, e.g. start-up calibration)",
                  s.outside_steps_ms);
    line(buf);
  }
  line("");

  line("idle gaps:");
  std::snprintf(buf, sizeof buf, "  between ops inside forward passes: sum %.3f ms (%.1f%% of %.2f ms forward), %s",
                s.op_gaps.sum, s.forward_ms > 0 ? 100 * s.op_gaps.sum / s.forward_ms : 0.0, s.forward_ms,
                dist_line(s.op_gaps, "us").c_str());
  line(buf);
  std::snprintf(buf, sizeof buf, "  between steps: sum %.3f ms, %s", s.step_gaps.sum, dist_line(s.step_gaps).c_str());
  line(buf);
  std::snprintf(buf, sizeof buf, "  between steps with requests pending: sum %.3f ms, %s", s.step_gaps_pending.sum,
                dist_line(s.step_gaps_pending).c_str());
  line(buf);
  if (!s.largest_step_gaps.empty()) {
    std::string l = "  largest gaps between steps:";
    for (size_t i = 0; i < s.largest_step_gaps.size(); ++i) {
      const StepGap& g = s.largest_step_gaps[i];
      l += fmt(i ? ", %.3f ms" : " %.3f ms", g.ms) + fmt(" at %.2f ms", g.at_ms) + (g.pending ? " (pending)" : "");
    }
    line(l);
  }
  line("");

  if (s.steps > 0) {
    std::snprintf(buf, sizeof buf,
                  "steps: %lld | tokens/step %.2f (decode %.2f, prefill %.2f) | ms/step mean %.3f, p50 %.3f, p99 "
                  "%.3f, max %.3f",
                  (long long)s.steps, s.tokens_per_step, s.decode_per_step, s.prefill_per_step, s.step_dur.mean,
                  s.step_dur.p50, s.step_dur.p99, s.step_dur.max);
    line(buf);
    if (s.between_steps > 0) {
      std::snprintf(buf, sizeof buf,
                    "  of those, %lld ran between the blocks of another step (short prompts' first tokens): %.2f ms, "
                    "mean %.3f ms",
                    (long long)s.between_steps, s.between_ms, s.between_ms / double(s.between_steps));
      line(buf);
    }
    if (s.comm_per_step.count > 0) {
      std::snprintf(buf, sizeof buf,
                    "  communication (MPI allreduce, broadcast, pipeline send/recv) per step: mean %.3f ms (%s), "
                    "%.1f%% of the steps' time",
                    s.comm_per_step.mean, dist_line(s.comm_per_step).c_str(),
                    s.step_ms > 0 ? 100 * s.comm_per_step.sum / s.step_ms : 0.0);
      line(buf);
    }
    auto cal = s.meta.find("cost_model_calibrated");
    if (s.predict_abs_err > 0 && (cal == s.meta.end() || cal->second != 0)) {
      std::snprintf(buf, sizeof buf, "  cost model: mean |predicted - measured| forward time %.1f%%",
                    100 * s.predict_abs_err);
      line(buf);
    }
  }

  auto meta_num = [&](const char* k) -> double {
    auto it = s.meta.find(k);
    return it != s.meta.end() && it->second.is_number() ? it->second.get<double>() : -1;
  };
  std::string mem = "memory:";
  if (meta_num("weights_bytes") >= 0) mem += " weights " + mib(meta_num("weights_bytes")) + ",";
  if (meta_num("activation_bytes") >= 0) mem += " activation arena " + mib(meta_num("activation_bytes")) + ",";
  if (meta_num("logits_bytes") >= 0) mem += " logits " + mib(meta_num("logits_bytes")) + ",";
  if (meta_num("kv_total_blocks") >= 0)
    mem += fmt(" KV cache %.0f blocks", meta_num("kv_total_blocks")) +
           (meta_num("kv_block_bytes") > 0 ? " x " + fmt("%.1f KiB", meta_num("kv_block_bytes") / 1024) + " = " +
                                                 mib(meta_num("kv_total_blocks") * meta_num("kv_block_bytes"))
                                           : std::string());
  line(mem);
  if (s.kv_samples > 0) {
    std::snprintf(buf, sizeof buf,
                  "  KV blocks in use: max %.0f, mean %.1f | prefix cache (unreferenced cached blocks): max %.0f, mean "
                  "%.1f",
                  s.kv_used_max, s.kv_used_mean, s.kv_cached_max, s.kv_cached_mean);
    line(buf);
  }
  if (meta_num("prefix_query_tokens") > 0) {
    std::snprintf(buf, sizeof buf, "  prefix cache hits: %.0f of %.0f prompt tokens looked up", meta_num("prefix_hit_tokens"),
                  meta_num("prefix_query_tokens"));
    line(buf);
  }
  line("");

  std::snprintf(buf, sizeof buf, "requests: %lld", (long long)std::max(s.queue.count, s.tokenize.count));
  line(buf);
  line("  tokenize  " + dist_line(s.tokenize));
  line("  queue     " + dist_line(s.queue));
  line("  prefill   " + dist_line(s.prefill));
  line("  decode    " + dist_line(s.decode));
  line("  TTFT*     " + dist_line(s.ttft) + "   (*queue + prefill, from arrival at the engine)");
  if (s.http_parse.count || s.http_write.count) {
    line("http workers:");
    line("  parse     " + dist_line(s.http_parse) + fmt(", sum %.3f ms", s.http_parse.sum));
    line("  emit      " + dist_line(s.http_emit) + fmt(", sum %.3f ms", s.http_emit.sum));
    line("  write     " + dist_line(s.http_write) + fmt(", sum %.3f ms", s.http_write.sum));
  }
  if (s.dropped_events > 0) line(fmt("WARNING: %.0f events were dropped (a thread's buffer was full)", double(s.dropped_events)));
  return o;
}

}  // namespace ft::profile
