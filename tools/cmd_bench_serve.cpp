// `firsttoken bench serve`: the load generator (src/loadgen/loadgen.h) against any OpenAI-compatible
// URL, with the per-class report, JSON results and an SVG plot.
// `firsttoken bench ablate`: our server (this executable's `serve`) started in several scheduler
// configurations, the same workload and seed against each, one comparison table and plot.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/json_file.h"
#include "loadgen/loadgen.h"
#include "loadgen/report.h"
#include "loadgen/server_process.h"
#include "loadgen/svg_plot.h"
#include "core/error.h"
#include "tools/commands.h"

namespace ft::tools {

namespace {

using nlohmann::json;

loadgen::Workload load_workload(const std::string& spec) {
  if (auto w = loadgen::builtin_workload(spec)) return *w;
  std::string names;
  for (const auto& n : loadgen::builtin_workload_names()) names += (names.empty() ? "" : ", ") + n;
  std::ifstream f(spec);
  if (!f) fail("--workload '", spec, "': neither a built-in workload (", names, ") nor a readable JSON file");
  return loadgen::workload_from_json(parse_json_file_text(server::read_text_file(spec, "workload"), cat("--workload '", spec, "'")));
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write ", path);
  f << text;
  if (!f) fail("cannot write ", path);
}

std::vector<std::string> class_names(const loadgen::Workload& w) {
  std::vector<std::string> n;
  for (const auto& c : w.classes) n.push_back(c.name);
  return n;
}

struct Prepared {
  loadgen::LoadgenOptions opt;
  loadgen::Slo slo;
};

Prepared prepare(const BenchServeArgs& a, const std::string& workload) {
  Prepared p;
  if (!a.slo.empty()) p.slo = loadgen::parse_slo(a.slo);
  p.opt.workload = load_workload(workload);
  if (!(a.duration_s >= 0 && a.duration_s <= loadgen::kMaxDurationS))  // 0: not given
    fail("--duration must be in (0, ", loadgen::kMaxDurationS, "] seconds, got ", a.duration_s);
  if (a.duration_s > 0) p.opt.workload.duration_s = a.duration_s;
  if (a.endpoint != "completions" && a.endpoint != "chat")
    fail("--endpoint must be completions or chat, got '", a.endpoint, "'");
  p.opt.chat = a.endpoint == "chat";
  p.opt.text_prompts = a.text_prompts;
  p.opt.model = a.model;
  p.opt.seed = a.seed;
  if (a.concurrency < 0) fail("--concurrency must be >= 0");
  p.opt.concurrency = a.concurrency;
  if (a.max_requests < 0 || a.max_requests > loadgen::kMaxPlannedRequests)
    fail("--max-requests must be in [0, ", loadgen::kMaxPlannedRequests, "], got ", a.max_requests);
  p.opt.max_requests = a.max_requests;
  if (!(a.timeout_s > 0 && a.timeout_s <= loadgen::kMaxTimeoutS))
    fail("--timeout must be in (0, ", loadgen::kMaxTimeoutS, "] seconds, got ", a.timeout_s);
  p.opt.timeout_s = a.timeout_s;
  p.opt.connect_timeout_s = std::min(10.0, a.timeout_s);
  p.opt.progress = !a.quiet;
  const size_t colon = a.token_range.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("");
    p.opt.token_lo = std::stoi(a.token_range.substr(0, colon));
    p.opt.token_hi = std::stoi(a.token_range.substr(colon + 1));
  } catch (const std::exception&) {
    fail("--token-range must be LO:HI, got '", a.token_range, "'");
  }
  if (p.opt.token_lo < 0 || p.opt.token_hi < p.opt.token_lo) fail("--token-range needs 0 <= LO <= HI");
  return p;
}

struct RunOutput {
  loadgen::LoadgenResult res;
  std::vector<loadgen::ClassStats> stats;
  json doc;
};

RunOutput run_one(const Prepared& p, const std::string& url, const BenchServeArgs& a) {
  loadgen::LoadgenOptions opt = p.opt;
  opt.url = loadgen::parse_url(url);
  RunOutput o;
  o.res = loadgen::run_loadgen(opt);
  const auto names = class_names(opt.workload);
  o.stats = loadgen::class_stats(o.res.records, names, o.res.wall_s, p.slo);
  if (o.stats.back().sent > 0 && o.stats.back().completed == 0)
    for (const auto& r : o.res.records)
      if (!r.ok()) {
        std::fprintf(stderr, "warning: every request failed; the first: %s: %s\n", r.error.c_str(),
                     r.error_message.c_str());
        break;
      }
  json classes = json::array(), requests = json::array();
  for (const auto& c : o.stats) classes.push_back(loadgen::class_stats_json(c));
  for (const auto& r : o.res.records) requests.push_back(loadgen::record_json(r, names));
  json slo = json::object();
  if (p.slo.ttft_ms) slo["ttft_ms"] = *p.slo.ttft_ms;
  if (p.slo.tpot_ms) slo["tpot_ms"] = *p.slo.tpot_ms;
  if (p.slo.itl_ms) slo["itl_ms"] = *p.slo.itl_ms;
  if (p.slo.e2e_ms) slo["e2e_ms"] = *p.slo.e2e_ms;
  json wl_classes = json::array();
  for (const auto& c : opt.workload.classes)
    wl_classes.push_back({{"name", c.name},
                          {"arrival",
                           {{"type", c.arrivals.kind == loadgen::Arrivals::Kind::Poisson  ? "poisson"
                                     : c.arrivals.kind == loadgen::Arrivals::Kind::Gamma ? "gamma"
                                                                                       : "periodic"},
                            {"rate", c.arrivals.rate_per_s},
                            {"burstiness", c.arrivals.burstiness},
                            {"start_s", c.arrivals.start_s}}},
                          {"prompt_tokens", {{"mean", c.prompt_tokens.mean}, {"spread", c.prompt_tokens.spread}}},
                          {"output_tokens", {{"mean", c.output_tokens.mean}, {"spread", c.output_tokens.spread}}},
                          {"shared_prefix_tokens", c.shared_prefix_tokens}});
  o.doc = {{"config",
            {{"url", opt.url.str()},
             {"model", o.res.model},
             {"endpoint", opt.chat ? "chat" : "completions"},
             {"text_prompts", opt.text_prompts || opt.chat},
             {"workload", {{"name", opt.workload.name}, {"duration_s", opt.workload.duration_s}, {"classes", wl_classes}}},
             {"seed", opt.seed},
             {"prompt_salt", o.res.prompt_salt},
             {"concurrency", opt.concurrency},
             {"max_requests", opt.max_requests},
             {"timeout_s", opt.timeout_s},
             {"slo", slo}}},
           {"wall_s", o.res.wall_s},
           {"classes", classes},
           {"requests", requests}};
  (void)a;
  return o;
}

}  // namespace

void add_bench_serve(CLI::App& bench, BenchServeArgs& a, std::string& mode) {
  auto common = [&a](CLI::App* c) {
    c->add_option("--workload", a.workload, "Built-in workload (short, long, mixed, burst, shared-prefix) or a JSON file")
        ->capture_default_str();
    c->add_option("--duration", a.duration_s, "Seconds of arrivals (default: the workload's)");
    c->add_option("--seed", a.seed, "Seed of arrivals and lengths (prompt contents are fresh every run: no cache hits across runs)")->capture_default_str();
    c->add_option("--slo", a.slo, "SLOs in ms for goodput, e.g. ttft:500,tpot:100 (keys ttft, tpot, itl, e2e)");
    c->add_option("--max-requests", a.max_requests, "Send at most N requests (closed loop: exactly N)");
    c->add_option("--timeout", a.timeout_s, "Per-request timeout in seconds")->capture_default_str();
    c->add_option("--token-range", a.token_range, "Prompt token ids LO:HI (inclusive)")->capture_default_str();
    c->add_flag("--quiet", a.quiet, "No progress line on stderr");
  };
  CLI::App* s = bench.add_subcommand("serve", "Load generator against any OpenAI-compatible server (TTFT, TPOT, ITL, goodput)");
  s->add_option("--url", a.url, "Server URL, e.g. http://127.0.0.1:8000")->required();
  s->add_option("--model", a.model, "Model id to send (default: the first of /v1/models)");
  s->add_option("--endpoint", a.endpoint, "completions (token-id prompts, exact lengths) or chat")->capture_default_str();
  s->add_flag("--text-prompts", a.text_prompts, "Completions with text prompts (approximate lengths)");
  s->add_option("--concurrency", a.concurrency, "Closed loop: N requests in flight (0 = open loop, the workload's arrivals)");
  s->add_option("--out", a.out, "Write JSON results (config, per-class stats, every request)");
  s->add_option("--plot", a.plot, "Write an SVG plot (TTFT CDF per class, TTFT over time)");
  common(s);
  s->callback([&mode] { mode = "serve"; });

  CLI::App* ab = bench.add_subcommand("ablate", "Our server in several configurations, the same workload against each");
  ab->add_option("-m,--model", a.model, "GGUF model the server loads (default: the built-in synthetic tiny model)");
  ab->add_option("--configs", a.configs,
                 "Comma-separated: nochunk (prefill_chunk_size 0), chunk1024, chunk256, auto (prefix cache on), "
                 "auto-nocache (auto, prefix cache off)")
      ->capture_default_str();
  ab->add_option("--out", a.out_dir, "Directory for per-config JSON, server logs and the plot")->capture_default_str();
  ab->add_flag("--isolated", a.isolated,
               "Also run the baselines against each config: workload short (short-only TTFT) and long (long alone)");
  ab->add_option("--server-arg", a.server_args, "Extra argument for `serve` (repeatable), e.g. --server-arg=-t --server-arg=2");
  common(ab);
  ab->callback([&mode] { mode = "ablate"; });
}

int cmd_bench_serve(const BenchServeArgs& a) {
  const Prepared p = prepare(a, a.workload);
  loadgen::parse_url(a.url);  // a bad URL fails before anything runs
  const RunOutput o = run_one(p, a.url, a);
  std::printf("bench serve: %s, model %s, workload %s (seed %llu)\n", a.url.c_str(), o.res.model.c_str(),
              p.opt.workload.name.c_str(), (unsigned long long)a.seed);
  std::fputs(loadgen::format_report(o.stats, o.res.wall_s, p.slo).c_str(), stdout);
  if (!a.out.empty()) write_file(a.out, o.doc.dump(1));
  if (!a.plot.empty())
    write_file(a.plot, loadgen::svg_ttft_figure("TTFT: " + p.opt.workload.name + " against " + a.url,
                                              o.res.records, class_names(p.opt.workload)));
  return 0;
}

namespace {

// The scheduler configurations `bench ablate` knows, as config-file JSON.
const std::map<std::string, json>& ablation_configs() {
  static const std::map<std::string, json> m = {
      {"nochunk", {{"scheduler", {{"prefill_chunk_size", 0}}}, {"kv_cache", {{"prefix_caching", true}}}}},
      {"chunk1024", {{"scheduler", {{"prefill_chunk_size", 1024}}}, {"kv_cache", {{"prefix_caching", true}}}}},
      {"chunk256", {{"scheduler", {{"prefill_chunk_size", 256}}}, {"kv_cache", {{"prefix_caching", true}}}}},
      {"auto", {{"scheduler", {{"prefill_chunk_size", "auto"}}}, {"kv_cache", {{"prefix_caching", true}}}}},
      {"auto-nocache", {{"scheduler", {{"prefill_chunk_size", "auto"}}}, {"kv_cache", {{"prefix_caching", false}}}}},
  };
  return m;
}

std::string fmt(double v, const char* f = "%.1f") {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
// "-" where nothing was measured (e.g. every request of the class failed).
std::string fmt(const loadgen::Summary& s, double v) { return s.n ? fmt(v) : "-"; }

}  // namespace

int cmd_bench_ablate(const BenchServeArgs& a) {
  // -m is the server's GGUF file; the requests name the model the server reports (/v1/models).
  Prepared main_run = prepare(a, a.workload);
  main_run.opt.model.clear();
  std::vector<std::string> configs;
  for (size_t pos = 0; pos <= a.configs.size();) {
    const size_t comma = std::min(a.configs.find(',', pos), a.configs.size());
    const std::string name = a.configs.substr(pos, comma - pos);
    pos = comma + 1;
    if (name.empty()) continue;
    if (!ablation_configs().count(name)) {
      std::string known;
      for (const auto& [k, v] : ablation_configs()) known += (known.empty() ? "" : ", ") + k;
      fail("--configs: unknown configuration '", name, "' (", known, ")");
    }
    configs.push_back(name);
  }
  if (configs.empty()) fail("--configs: no configuration given");
  if (!a.model.empty() && !std::filesystem::exists(a.model)) fail(a.model, ": no such file");
  std::filesystem::create_directories(a.out_dir);
  const std::string exe = loadgen::self_exe();
  std::optional<Prepared> short_run, long_run;
  if (a.isolated) {
    short_run = prepare(a, "short");
    long_run = prepare(a, "long");
    short_run->opt.model.clear();
    long_run->opt.model.clear();
  }
  const auto names = class_names(main_run.opt.workload);

  struct Row {
    std::string config;
    std::vector<loadgen::ClassStats> stats;
    std::optional<loadgen::ClassStats> short_only, long_only;
  };
  std::vector<Row> rows;
  json summary = json::array();
  for (const std::string& cfg : configs) {
    const std::string base = (std::filesystem::path(a.out_dir) / cfg).string();
    write_file(base + ".config.json", ablation_configs().at(cfg).dump(1));
    std::vector<std::string> args = {"--config", base + ".config.json"};
    if (!a.model.empty()) args.insert(args.end(), {"-m", a.model});
    args.insert(args.end(), a.server_args.begin(), a.server_args.end());
    if (!a.quiet) std::fprintf(stderr, "== %s: starting the server (log: %s.server.log)\n", cfg.c_str(), base.c_str());
    loadgen::ServerProcess srv(exe, args, base + ".server.log");
    Row row;
    row.config = cfg;
    RunOutput o = run_one(main_run, srv.url(), a);
    o.doc["config"]["server_config"] = ablation_configs().at(cfg);
    o.doc["config"]["name"] = cfg;
    write_file(base + ".json", o.doc.dump(1));
    write_file(base + ".svg", loadgen::svg_ttft_figure("TTFT: " + main_run.opt.workload.name + ", config " + cfg,
                                                     o.res.records, names));
    row.stats = o.stats;
    json entry = {{"config", cfg}, {"classes", o.doc["classes"]}};
    if (a.isolated) {
      RunOutput s = run_one(*short_run, srv.url(), a);
      write_file(base + ".short.json", s.doc.dump(1));
      row.short_only = s.stats.back();
      RunOutput l = run_one(*long_run, srv.url(), a);
      write_file(base + ".long.json", l.doc.dump(1));
      row.long_only = l.stats.back();
      entry["short_only"] = s.doc["classes"].back();
      entry["long_only"] = l.doc["classes"].back();
    }
    const int rc = srv.stop();
    if (rc != 0 && !a.quiet) std::fprintf(stderr, "warning: the %s server exited with status %d\n", cfg.c_str(), rc);
    summary.push_back(entry);
    rows.push_back(std::move(row));
  }

  // One table: rows = configs.
  std::vector<std::string> head = {"config"};
  for (const auto& n : names) {
    head.push_back(n + " TTFT p50");
    head.push_back(n + " TTFT p99");
  }
  for (const char* h : {"TTFT max", "ITL p99", "TPOT p99", "out tok/s", "req/s", "errors"}) head.push_back(h);
  if (main_run.slo.any()) head.push_back("goodput/s");
  if (a.isolated) {
    head.push_back("short-only p99");
    head.push_back("long-only mean");
  }
  std::vector<std::vector<std::string>> table;
  for (const Row& r : rows) {
    std::vector<std::string> t = {r.config};
    for (size_t ci = 0; ci < names.size(); ++ci) {
      t.push_back(fmt(r.stats[ci].ttft_ms, r.stats[ci].ttft_ms.p50));
      t.push_back(fmt(r.stats[ci].ttft_ms, r.stats[ci].ttft_ms.p99));
    }
    const loadgen::ClassStats& all = r.stats.back();
    size_t n_err = 0;
    for (const auto& [k, n] : all.errors) n_err += n;
    t.push_back(fmt(all.ttft_ms, all.ttft_ms.max));
    t.push_back(fmt(all.itl_ms, all.itl_ms.p99));
    t.push_back(fmt(all.tpot_ms, all.tpot_ms.p99));
    t.push_back(fmt(all.output_tokens_per_s));
    t.push_back(fmt(all.requests_per_s, "%.3f"));
    t.push_back(std::to_string(n_err));
    if (main_run.slo.any()) t.push_back(fmt(all.goodput_rps, "%.3f"));
    if (a.isolated) {
      t.push_back(fmt(r.short_only->ttft_ms, r.short_only->ttft_ms.p99));
      t.push_back(fmt(r.long_only->ttft_ms, r.long_only->ttft_ms.mean));
    }
    table.push_back(t);
  }
  std::printf("bench ablate: workload %s, %.0f s, seed %llu, model %s (times in ms)\n",
              main_run.opt.workload.name.c_str(), main_run.opt.workload.duration_s, (unsigned long long)a.seed,
              a.model.empty() ? "built-in tiny" : a.model.c_str());
  std::string line = "|";
  for (const auto& h : head) line += " " + h + " |";
  std::printf("%s\n|", line.c_str());
  for (size_t i = 0; i < head.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const auto& t : table) {
    line = "|";
    for (const auto& c : t) line += " " + c + " |";
    std::printf("%s\n", line.c_str());
  }

  // The plot: per-class TTFT p50/p99 per config.
  std::vector<std::string> series, groups;
  for (const auto& n : names) {
    series.push_back(n + " p50");
    series.push_back(n + " p99");
  }
  std::vector<std::vector<double>> values;
  for (const Row& r : rows) {
    groups.push_back(r.config);
    std::vector<double> v;
    for (size_t ci = 0; ci < names.size(); ++ci) {
      v.push_back(r.stats[ci].ttft_ms.p50);
      v.push_back(r.stats[ci].ttft_ms.p99);
    }
    values.push_back(v);
  }
  const std::string plot = (std::filesystem::path(a.out_dir) / "ablate.svg").string();
  write_file(plot, loadgen::svg_bar_chart("TTFT per config: workload " + main_run.opt.workload.name, "TTFT (ms, log)",
                                        groups, series, values, true));
  write_file((std::filesystem::path(a.out_dir) / "summary.json").string(),
             json{{"workload", main_run.opt.workload.name},
                  {"duration_s", main_run.opt.workload.duration_s},
                  {"seed", a.seed},
                  {"model", a.model},
                  {"configs", summary}}
                 .dump(1));
  std::printf("wrote %s/{CONFIG.json, CONFIG.svg, summary.json, ablate.svg}\n", a.out_dir.c_str());
  return 0;
}

}  // namespace ft::tools
