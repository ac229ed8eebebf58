// The profiler: the tracer's JSON (valid, complete, per-thread, nested, nothing when off), the
// summary on a hand-made trace, and profiles of real mixed runs (the engine in process, the HTTP
// server in process with concurrent requests, `firsttoken run --profile` + `firsttoken profile`).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <csignal>
#include <set>
#include <thread>

#include "client/binary_client.h"
#include "core/error.h"
#include "engine/engine.h"
#include "profile/profiling_backend.h"
#include "profile/summary.h"
#include "profile/trace.h"
#include "server/server.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

using json = nlohmann::json;

std::vector<json> events_with(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : doc["traceEvents"])
    if (e.value("ph", "") == ph) out.push_back(e);
  return out;
}

// What every trace must satisfy to open in Perfetto / chrome://tracing.
void expect_well_formed(const json& doc) {
  ASSERT_TRUE(doc.is_object());
  ASSERT_TRUE(doc.contains("traceEvents") && doc["traceEvents"].is_array());
  EXPECT_EQ(doc.value("displayTimeUnit", ""), "ms");
  ASSERT_TRUE(doc.contains("otherData") && doc["otherData"].is_object());
  std::map<std::string, int> open;  // async id+name -> b minus e
  for (const json& e : doc["traceEvents"]) {
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e;
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e;
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e;
    ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e;
    const std::string ph = e["ph"];
    ASSERT_TRUE(ph == "X" || ph == "M" || ph == "C" || ph == "b" || ph == "e") << e;
    if (ph == "M") continue;
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e;
    EXPECT_GE(e["ts"].get<double>(), 0) << e;
    if (ph == "X") {
      ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e;
      EXPECT_GE(e["dur"].get<double>(), 0) << e;
      ASSERT_TRUE(e.contains("cat") && e["cat"].is_string()) << e;
    }
    if (ph == "b" || ph == "e") {
      ASSERT_TRUE(e.contains("id") && e["id"].is_string()) << e;
      open[e["id"].get<std::string>() + "/" + e["name"].get<std::string>()] += ph == "b" ? 1 : -1;
    }
    if (ph == "C") {
      ASSERT_TRUE(e.contains("args") && e["args"].is_object()) << e;
      for (const auto& [k, v] : e["args"].items()) EXPECT_TRUE(v.is_number()) << e;
    }
  }
  for (const auto& [k, n] : open) EXPECT_EQ(n, 0) << "unbalanced async span " << k;
}

// X spans of one thread nest: each one ends before the span that encloses its start ends.
void expect_nested(const json& doc) {
  std::map<int, std::vector<std::pair<double, double>>> by_tid;
  for (const json& e : events_with(doc, "X"))
    by_tid[e["tid"].get<int>()].emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
  for (auto& [tid, spans] : by_tid) {
    std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) { return a.first < b.first || (a.first == b.first && a.second > b.second); });
    std::vector<double> stack;  // ends of the open spans
    for (const auto& [b, e] : spans) {
      while (!stack.empty() && stack.back() <= b + 0.0015) stack.pop_back();
      if (!stack.empty()) {
        EXPECT_LE(e, stack.back() + 0.0015) << "tid " << tid << " span [" << b << ", " << e << "] crosses its parent";
      }
      stack.push_back(e);
    }
  }
}

std::map<int, std::string> thread_names(const json& doc) {
  std::map<int, std::string> m;
  for (const json& e : events_with(doc, "M"))
    if (e["name"] == "thread_name") m[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  return m;
}

// --- the tracer ---------------------------------------------------------------------------------

TEST(Tracer, OffRecordsNothing) {
  profile::stop();
  profile::reset();
  EXPECT_FALSE(profile::enabled());
  profile::complete("x", "test", 1, 2);
  profile::async_span("a", "test", 1, 1, 2);
  profile::counter("c", 1, profile::Args().i("v", 1));
  { profile::Scope s("scope", "test"); }
  const json doc = json::parse(profile::to_json());
  expect_well_formed(doc);
  EXPECT_TRUE(events_with(doc, "X").empty());
  EXPECT_TRUE(events_with(doc, "C").empty());
  EXPECT_TRUE(events_with(doc, "b").empty());
}

// A path that cannot be written is an error at start, before the run whose trace it would lose.
TEST(Tracer, AnUnwritablePathFailsAtStart) {
  profile::stop();
  EXPECT_THROW(profile::start("/nonexistent-dir/trace.json"), Error);
  EXPECT_FALSE(profile::enabled());
}

TEST(Tracer, ThreadsWriteValidNestedJson) {
  test::TempFile file("trace.json");
  profile::reset();
  profile::start(file.path());
  constexpr int kThreads = 4, kOuter = 3000;  // > one chunk per thread
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([t] {
      profile::set_thread_name("worker-" + std::to_string(t));
      for (int i = 0; i < kOuter; ++i) {
        profile::Scope outer("outer", "test");
        outer.args().i("i", i).d("x", 0.5).s("who", "w\"q\\\n");  // escaped in the file
        {
          profile::Scope inner("inner", "test");
        }
        if (i % 100 == 0) {
          profile::counter("level", profile::now_ns(), profile::Args().i("v", i));
          const int64_t now = profile::now_ns();
          profile::async_span("req", "test", uint64_t(t * 100000 + i), now - 1000, now);
        }
      }
      profile::complete("raw", "test", profile::now_ns(), profile::now_ns(), {}, "list", "[1,2,3]");
    });
  for (auto& th : ts) th.join();
  profile::set_meta("note", std::string_view("a \"quoted\" value"));
  profile::set_meta("n", int64_t(7));
  profile::stop();
  const size_t n = profile::write();
  EXPECT_EQ(n, size_t(kThreads) * (2 * kOuter + 2 * (kOuter / 100) + 1));

  const json doc = json::parse(test::read_file(file.path()));  // throws if invalid
  expect_well_formed(doc);
  expect_nested(doc);
  EXPECT_EQ(doc["otherData"]["note"], "a \"quoted\" value");
  EXPECT_EQ(doc["otherData"]["n"], 7);
  EXPECT_EQ(doc["otherData"]["dropped_events"], 0);
  const auto names = thread_names(doc);
  std::map<int, int> outer_per_tid;
  for (const json& e : events_with(doc, "X")) {
    if (e["name"] == "outer") {
      ++outer_per_tid[e["tid"].get<int>()];
      EXPECT_EQ(e["args"]["who"], "w\"q\\\n");
    }
    if (e["name"] == "raw") {
      EXPECT_EQ(e["args"]["list"], json::array({1, 2, 3}));
    }
  }
  ASSERT_EQ(outer_per_tid.size(), size_t(kThreads));
  for (const auto& [tid, c] : outer_per_tid) {
    EXPECT_EQ(c, kOuter);
    ASSERT_TRUE(names.count(tid));
    EXPECT_EQ(names.at(tid).rfind("worker-", 0), 0u) << names.at(tid);
  }
  EXPECT_EQ(events_with(doc, "b").size(), size_t(kThreads * kOuter / 100));
  EXPECT_EQ(events_with(doc, "C").size(), size_t(kThreads * kOuter / 100));
  profile::reset();
}

// --- the summary on a hand-made trace -----------------------------------------------------------

TEST(ProfileSummary, OpsGapsAndSteps) {
  auto x = [](const char* name, const char* cat, double ts, double dur, json args = json::object()) {
    return json{{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", 1}, {"tid", 2}, {"args", args}};
  };
  json evs = json::array();
  evs.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 2}, {"args", {{"name", "engine"}}}});
  // Step 1 [0, 100]: forward [10, 90] with ops [10, 30] (gap 0) and [35, 85] (gap 5), gap 5 at the end.
  evs.push_back(x("step", "engine", 0, 100, {{"tokens", 4}, {"n_decode", 2}, {"prefill_tokens", 2}, {"running", 1}}));
  evs.push_back(x("forward", "engine", 10, 80));
  evs.push_back(x("gemm.wq", "op", 10, 20, {{"layer", 0}, {"flops", 2e6}, {"bytes", 1e6}}));
  evs.push_back(x("attention", "op", 35, 50, {{"layer", 0}, {"flops", 1e6}, {"bytes", 4e6}}));
  // Step 2 [150, 250] after a 50 us gap (a request was running): one op [160, 230].
  evs.push_back(x("step", "engine", 150, 100, {{"tokens", 2}, {"n_decode", 2}, {"running", 0}}));
  evs.push_back(x("forward", "engine", 160, 80));
  evs.push_back(x("attention", "op", 160, 70, {{"layer", 0}, {"flops", 1e6}, {"bytes", 4e6}}));
  // An op outside steps (calibration) is not counted in the table.
  evs.push_back(x("gemm.wq", "op", 500, 1000));
  const json doc = {{"traceEvents", evs}, {"otherData", {{"weights_bytes", 1048576}}}};
  const profile::Summary s = profile::summarize(doc);
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.step_ms, 0.2);
  ASSERT_EQ(s.ops.size(), 2u);
  EXPECT_EQ(s.ops[0].name, "attention");
  EXPECT_EQ(s.ops[0].calls, 2);
  EXPECT_NEAR(s.ops[0].total_ms, 0.12, 1e-12);
  EXPECT_NEAR(s.ops[0].share, 0.6, 1e-12);
  EXPECT_NEAR(s.ops[1].gflops(), 2e6 / 20e3, 1e-9);  // 2 MFLOP in 20 us = 100 GFLOP/s
  EXPECT_NEAR(s.ops[1].gbps(), 1e6 / 20e3, 1e-9);
  EXPECT_NEAR(s.outside_steps_ms, 1.0, 1e-12);
  EXPECT_EQ(s.op_gaps.count, 5);  // before each op, and after the last
  EXPECT_NEAR(s.op_gaps.sum, (0 + 5 + 5 + 0 + 10) / 1e3, 1e-12);
  EXPECT_NEAR(s.op_gaps.max, 0.010, 1e-12);
  EXPECT_EQ(s.step_gaps.count, 1);
  EXPECT_NEAR(s.step_gaps.sum, 0.050, 1e-12);
  EXPECT_EQ(s.step_gaps_pending.count, 1);
  EXPECT_NEAR(s.tokens_per_step, 3, 1e-12);
  const std::string text = profile::format_summary(s);
  EXPECT_NE(text.find("top ops: attention 60.0%, gemm.wq 10.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("between ops inside forward passes: sum 0.020 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("between steps: sum 0.050 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("weights 1.00 MiB"), std::string::npos) << text;
  EXPECT_THROW(profile::summarize(json::array()), Error);
}

// A step between the blocks of another (EngineCore::between_blocks) lies inside that one's span:
// counted apart (its time is in the outer step's), the outer step's ops after it still belong to
// the outer step, it is no idle gap of the outer forward, and the gap to the next step is the
// outer one's.
TEST(ProfileSummary, StepsBetweenBlocks) {
  auto x = [](const char* name, const char* cat, double ts, double dur, json args = json::object()) {
    return json{{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", 1}, {"tid", 2}, {"args", args}};
  };
  json evs = json::array();
  evs.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 2}, {"args", {{"name", "engine"}}}});
  evs.push_back(x("step", "engine", 0, 200, {{"tokens", 300}, {"prefill_tokens", 300}, {"running", 1}}));
  evs.push_back(x("forward", "engine", 10, 180));
  evs.push_back(x("gemm.wq", "op", 10, 50));
  evs.push_back(x("step", "engine", 60, 40, {{"tokens", 40}, {"prefill_tokens", 40}, {"between_blocks", 1}, {"running", 2}}));
  evs.push_back(x("forward", "engine", 65, 30));
  evs.push_back(x("gemm.wq", "op", 65, 30));
  evs.push_back(x("gemm.w_down", "op", 100, 90));
  evs.push_back(x("step", "engine", 250, 50, {{"tokens", 2}, {"n_decode", 2}, {"running", 2}}));
  evs.push_back(x("forward", "engine", 250, 50));
  evs.push_back(x("gemm.wq", "op", 250, 50));
  const profile::Summary s = profile::summarize(json{{"traceEvents", evs}});
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.between_steps, 1);
  EXPECT_NEAR(s.between_ms, 0.04, 1e-12);
  EXPECT_NEAR(s.step_ms, 0.25, 1e-12);
  EXPECT_NEAR(s.outside_steps_ms, 0, 1e-12);
  double ops = 0;
  for (const profile::OpRow& r : s.ops) ops += r.total_ms;
  EXPECT_NEAR(ops, 0.22, 1e-12);
  EXPECT_NEAR(s.op_gaps.sum, 0, 1e-12);
  EXPECT_EQ(s.step_gaps.count, 1);
  EXPECT_NEAR(s.step_gaps.sum, 0.05, 1e-12);
  const std::string text = profile::format_summary(s);
  EXPECT_NE(text.find("of those, 1 ran between the blocks of another step"), std::string::npos) << text;
}

// Tensor/pipeline parallelism: MPI spans (category "comm") inside steps count as communication
// per step (a step without any counts 0), are rows of the op table, and are not idle gaps.
TEST(ProfileSummary, CommunicationPerStep) {
  auto x = [](const char* name, const char* cat, double ts, double dur) {
    return json{{"name", name}, {"cat", cat}, {"ph", "X"}, {"ts", ts}, {"dur", dur}, {"pid", 1}, {"tid", 2},
                {"args", json::object()}};
  };
  json evs = json::array();
  evs.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 2}, {"args", {{"name", "engine"}}}});
  // Step 1 [0, 100]: broadcast [2, 6], forward [10, 90]: op [10, 40], allreduce [40, 50], op [50, 90].
  evs.push_back(x("step", "engine", 0, 100));
  evs.push_back(x("broadcast", "comm", 2, 4));
  evs.push_back(x("forward", "engine", 10, 80));
  evs.push_back(x("gemm.wo", "op", 10, 30));
  evs.push_back(x("allreduce", "comm", 40, 10));
  evs.push_back(x("gemm.w_down", "op", 50, 40));
  // Step 2 [200, 300]: pp_recv [210, 290] inside its forward; step 3 [400, 500]: none.
  evs.push_back(x("step", "engine", 200, 100));
  evs.push_back(x("forward", "engine", 205, 90));
  evs.push_back(x("pp_recv", "comm", 210, 80));
  evs.push_back(x("step", "engine", 400, 100));
  evs.push_back(x("allreduce", "comm", 600, 50));  // outside steps: not counted
  const profile::Summary s = profile::summarize(json{{"traceEvents", evs}});
  EXPECT_EQ(s.comm_per_step.count, 3);
  EXPECT_NEAR(s.comm_per_step.sum, 0.094, 1e-12);  // 4 + 10, 80, 0 us
  EXPECT_NEAR(s.comm_per_step.max, 0.080, 1e-12);
  EXPECT_NEAR(s.op_gaps.sum, (0 + 0 + 0 + 0 + 5 + 5) / 1e3, 1e-12);  // step 1: none; step 2: 5 before, 5 after
  bool row = false;
  for (const profile::OpRow& r : s.ops) row = row || (r.name == "pp_recv" && r.cat == "comm" && r.calls == 1);
  EXPECT_TRUE(row);
  const std::string text = profile::format_summary(s);
  EXPECT_NE(text.find("communication (MPI allreduce, broadcast, pipeline send/recv) per step: mean 0.031 ms (n 3"), std::string::npos)
      << text;
  EXPECT_NE(text.find("31.3% of the steps' time"), std::string::npos) << text;  // 94 of 300 us
}

// A call's layer is the one the caller set (Backend::set_layer, which the forward pass calls per
// layer), not guessed from the weight it reads: a layer-0 weight used under layer 3 is tagged 3,
// and a call after set_layer(-1) carries no layer.
TEST(ProfilingBackend, CallsCarryTheLayerTheCallerSet) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  profile::reset();
  profile::start("");
  auto be = profile::wrap_backend(make_backend("cpu", 1), *model);
  const WeightView& wq = model->weights().layers[0].wq;
  std::vector<float> x(size_t(wq.n_cols), 0.5f), y(size_t(wq.n_rows));
  be->set_layer(3);
  be->matmul(x.data(), 1, wq, y.data());
  be->set_layer(-1);
  be->matmul(x.data(), 1, wq, y.data());
  profile::stop();
  const json doc = json::parse(profile::to_json());
  std::vector<int> tags;  // the layer of each gemm.wq span, -1 for none
  for (const json& e : doc["traceEvents"])
    if (e.value("name", "") == "gemm.wq") tags.push_back(e["args"].contains("layer") ? e["args"]["layer"].get<int>() : -1);
  EXPECT_EQ(tags, (std::vector<int>{3, -1}));
  profile::reset();
}

// The decorator forwards every call unchanged: the same logits, bit for bit, with one op span per
// kernel call, named by weight, each per-layer op carrying its layer.
TEST(ProfilingBackend, SameLogitsAndOneSpanPerCall) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const HParams& hp = model->hparams();
  Batch b;
  for (int32_t i = 0; i < 7; ++i) b.add(1 + i * 11, i, 0, i == 6);
  auto logits_with = [&](Backend& be) {
    Forward fwd(*model, be, 8);
    KVCache kv(KVCacheConfig{hp.n_layers, hp.kv_dim(), 16, 4, true, hp.n_kv_heads});
    EXPECT_TRUE(kv.reserve(0, 8));
    std::vector<float> logits(size_t(hp.n_vocab));
    fwd.run(b, kv, logits.data());
    return logits;
  };
  profile::reset();
  profile::start("");
  auto plain = make_backend("cpu", 1);
  const std::vector<float> want = logits_with(*plain);
  auto wrapped = profile::wrap_backend(make_backend("cpu", 1), *model);
  EXPECT_EQ(wrapped->name(), plain->name());
  const std::vector<float> got = logits_with(*wrapped);
  profile::stop();
  EXPECT_EQ(got, want);
  const json doc = json::parse(profile::to_json());
  std::map<std::string, std::set<int>> layers;
  std::map<std::string, int> calls;
  for (const json& e : events_with(doc, "X")) {
    ASSERT_EQ(e["cat"], "op") << e;
    ++calls[e["name"]];
    if (e["args"].contains("layer")) layers[e["name"]].insert(e["args"]["layer"].get<int>());
    const bool last_row_only = e["name"] == "gemm.output" || e["args"].value("weight", "") == "output_norm";
    EXPECT_EQ(e["args"]["M"], last_row_only ? 1 : 7) << e;
  }
  const int L = hp.n_layers;
  EXPECT_EQ(calls["embed"], 1);
  EXPECT_EQ(calls["rmsnorm"], 2 * L + 1);
  EXPECT_EQ(calls["rope"], 2 * L);
  EXPECT_EQ(calls["gemm.output"], 1);
  for (const char* op : {"gemm.wq+wk+wv", "attention", "gemm.wo", "gemm.w_gate+w_up", "gemm.w_down"}) {
    EXPECT_EQ(calls[op], L) << op;
    EXPECT_EQ(int(layers[op].size()), L) << op;
  }
  profile::reset();
}

// --- real runs ----------------------------------------------------------------------------------

const char* const kLayerOps[] = {"rmsnorm", "gemm.wq+wk+wv", "rope", "attention", "gemm.wo", "gemm.w_gate+w_up",
                                 "gemm.w_down"};

// Steps, per-layer ops for every layer, request tracks and KV counters: what any profile of a
// real run must contain.
void expect_engine_content(const json& doc, int n_layers, int n_requests) {
  const auto names = thread_names(doc);
  int engine_tid = -1;
  for (const auto& [tid, name] : names)
    if (name == "engine") engine_tid = tid;
  ASSERT_GE(engine_tid, 0) << "no thread named engine";
  std::vector<std::pair<double, double>> steps;
  bool mixed = false;
  std::map<std::string, std::set<int>> layers_of;
  for (const json& e : events_with(doc, "X")) {
    if (e["name"] == "step") {
      EXPECT_EQ(e["tid"], engine_tid);
      const json& a = e["args"];
      for (const char* k : {"tokens", "n_decode", "prefill_tokens", "predicted_ms", "forward_ms", "chunks"})
        EXPECT_TRUE(a.contains(k)) << k << " missing in " << e;
      EXPECT_TRUE(a["chunks"].is_array());
      int64_t sum = a["n_decode"].get<int64_t>();
      for (const json& c : a["chunks"]) sum += c.get<int64_t>();
      EXPECT_EQ(sum, a["tokens"].get<int64_t>()) << e;
      // (or a prompt ran between the blocks of a step: EngineCore::between_blocks)
      mixed |= (a["n_decode"].get<int>() > 0 && !a["chunks"].empty()) || a.value("between_blocks", 0) > 0;
      steps.emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
    }
    if (e["cat"] == "op" && e["args"].contains("layer")) layers_of[e["name"]].insert(e["args"]["layer"].get<int>());
    if (e["cat"] == "op" && e["name"].get<std::string>().rfind("gemm.", 0) == 0) {
      const json& a = e["args"];
      const int64_t M = a["M"], N = a["N"], K = a["K"];
      if (e["name"] == "gemm.wo" || e["name"] == "gemm.w_down") {
        EXPECT_EQ(a["flops"].get<int64_t>(), 2 * M * N * K + M * N) << e;  // + the residual add
      }
      EXPECT_GT(a["bytes"].get<int64_t>(), 0) << e;
    }
  }
  EXPECT_FALSE(steps.empty());
  if (n_requests > 1) {
    EXPECT_TRUE(mixed) << "no step carried both decodes and prefill chunks, nor ran between another's blocks";
  }
  for (const char* op : kLayerOps) {
    EXPECT_EQ(int(layers_of[op].size()), n_layers) << op;
    if (!layers_of[op].empty()) {
      EXPECT_EQ(*layers_of[op].begin(), 0) << op;
      EXPECT_EQ(*layers_of[op].rbegin(), n_layers - 1) << op;
    }
  }
  std::map<std::string, std::set<std::string>> async_names;  // id -> phases
  for (const json& e : events_with(doc, "b")) async_names[e["id"]].insert(e["name"]);
  int complete_requests = 0;
  for (const auto& [id, phases] : async_names)
    complete_requests += phases.count("request") && phases.count("queue") && phases.count("prefill") && phases.count("decode");
  EXPECT_EQ(complete_requests, n_requests);
  bool kv = false;
  for (const json& e : events_with(doc, "C")) kv |= e["name"] == "kv_blocks";
  EXPECT_TRUE(kv);
  for (const char* k : {"weights_bytes", "activation_bytes", "kv_total_blocks", "kv_block_bytes", "n_layers"})
    EXPECT_TRUE(doc["otherData"].contains(k)) << k;
}

TEST(ProfileRun, EngineMixedWorkload) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  test::TempFile file("engine.json");
  profile::reset();
  profile::start(file.path());
  const auto model = Model::load(path);
  EngineConfig cfg;
  cfg.runtime.threads = 2;
  cfg.runtime.n_ctx = 256;
  cfg.scheduler.chunk_size = 8;  // several prefill steps, alongside the other requests' decodes
  cfg.scheduler.max_batch_tokens = 16;
  cfg.scheduler.max_num_seqs = 4;
  cfg.calibrate = false;
  {
    Engine engine(*model, cfg, [](int32_t) { return false; });
    const std::vector<int64_t> lens = {5, 40, 23};
    std::vector<EventStream> streams(lens.size());
    for (size_t i = 0; i < lens.size(); ++i) {
      EngineRequest r;
      for (int64_t k = 0; k < lens[i]; ++k) r.prompt.push_back(int32_t(1 + (k * 7 + int64_t(i)) % 500));
      r.max_tokens = 12;
      r.ignore_eos = true;
      r.sampling.temperature = 0;
      engine.submit(std::move(r), streams[i].callback());
    }
    for (auto& s : streams) {
      EngineEvent ev;
      while (s.next(ev)) {
      }
    }
    engine.shutdown();
  }
  profile::stop();
  profile::write();
  const json doc = json::parse(test::read_file(file.path()));
  expect_well_formed(doc);
  expect_nested(doc);
  expect_engine_content(doc, model->hparams().n_layers, 3);
  profile::reset();
}


TEST(ProfileRun, ServerConcurrentRequests) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  test::TempFile file("server.json");
  profile::reset();
  profile::start(file.path());
  const auto model = Model::load(path);
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  server::ServeConfig cfg;
  cfg.port = 0;
  cfg.threads = 2;
  cfg.http_threads = 2;
  cfg.context_length = 256;
  cfg.prefill_chunk_size = 8;
  cfg.max_num_seqs = 4;
  cfg.log_level = "warn";
  cfg.binary_port_any = true;
  server::ServedModel served;
  served.model = model.get();
  served.tokenizer = &tok;
  served.id = "stories260K";
  EngineConfig ecfg = server::to_engine_config(cfg);
  ecfg.calibrate = true;  // as `serve` does: its forward passes must stay out of the step table
  Engine engine(*model, ecfg, [&tok](int32_t t) { return tok.is_eog(t); });
  server::Server srv(engine, served, cfg);
  std::thread run([&] { srv.run(); });
  for (int i = 0; i < 500 && (srv.port() == 0 || srv.binary_port() == 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(srv.port(), 0);
  ASSERT_GT(srv.binary_port(), 0);
  const std::string long_prompt =
      "Once upon a time there was a little girl named Lily who loved to play in the park with her friends every day";
  std::string r1, r2;
  // r1 decodes long enough (~220 steps) that the others, sent at once from their own threads,
  // arrive during it even on a loaded machine: their prefill chunks share steps with its decodes.
  // (With 16 tokens it could finish before they were read, and no step was mixed.)
  std::thread c1([&] {
    r1 = test::http_post(srv.port(), "/v1/completions",
                   json{{"model", "stories260K"}, {"prompt", long_prompt}, {"max_tokens", 220}, {"temperature", 0},
                        {"ignore_eos", true}, {"stream", true}}.dump());
  });
  std::thread c2([&] {
    r2 = test::http_post(srv.port(), "/v1/completions",
                   json{{"model", "stories260K"}, {"prompt", "Tom"}, {"max_tokens", 120}, {"temperature", 0},
                        {"ignore_eos", true}}.dump());
  });
  std::string r3;
  std::thread c3([&] {  // the binary protocol, a third request
    proto::Request req;
    req.text = "Lily and Tom";
    req.max_tokens = 6;
    req.sampling.temperature = 0;
    client::BinaryClient bc("127.0.0.1", srv.binary_port(), 60);
    r3 = bc.generate(req).finish;
  });
  c1.join();
  c2.join();
  c3.join();
  srv.stop();
  run.join();
  profile::stop();
  profile::write();
  EXPECT_NE(r1.find("data: [DONE]"), std::string::npos) << r1;
  EXPECT_NE(r2.find("\"finish_reason\":\"length\""), std::string::npos) << r2;
  EXPECT_EQ(r3, "length");

  const json doc = json::parse(test::read_file(file.path()));
  expect_well_formed(doc);
  expect_nested(doc);
  expect_engine_content(doc, model->hparams().n_layers, 3);
  const auto names = thread_names(doc);
  std::map<std::string, int> http;  // span name -> count on http-* threads
  std::set<int64_t> tokenized;
  for (const json& e : events_with(doc, "X")) {
    const std::string tname = names.count(e["tid"]) ? names.at(e["tid"]) : "";
    if (tname.rfind("http-", 0) == 0) ++http[e["name"]];
    if (e["name"] == "tokenize") {
      EXPECT_EQ(tname.rfind("http-", 0), 0u);
      tokenized.insert(e["args"]["req"].get<int64_t>());
    }
  }
  EXPECT_EQ(http["http.parse"], 2);
  EXPECT_EQ(http["bin.parse"], 1);
  EXPECT_GE(http["bin.write"], 1);
  EXPECT_EQ(http["tokenize"], 3);
  EXPECT_GE(http["http.write"], 2);
  EXPECT_GE(http["http.emit"], 220 + 120);
  EXPECT_EQ(tokenized.size(), 3u);
  // Requests' queue spans exist for the ids the tokenize spans name.
  std::set<int64_t> queued;
  for (const json& e : events_with(doc, "b"))
    if (e["name"] == "queue") queued.insert(std::stoll(e["id"].get<std::string>(), nullptr, 16));
  EXPECT_EQ(queued, tokenized);

  const profile::Summary s = profile::summarize(doc);
  EXPECT_GT(s.outside_steps_ms, 0) << "calibration ops should be reported apart";
  EXPECT_EQ(s.http_parse.count, 2);
  EXPECT_EQ(s.tokenize.count, 3);
  EXPECT_EQ(s.queue.count, 3);
  EXPECT_EQ(int(s.layers.size()), model->hparams().n_layers);
  profile::reset();
}


struct Cli {
  int exit_code = -1;
  std::string out;  // stdout then stderr
};
Cli run_cli(const std::string& args) {
  const test::CliResult r = test::run_cli(FT_BINARY, args);
  return {r.exit_code, r.out + r.err};
}

// `run --profile` then `profile`: the summary names as top op the one whose share of step time is
// the largest in the trace (computed here independently), and reports the idle gaps with numbers.
TEST(ProfileCli, RunThenSummary) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  test::TempFile file("run.json");
  const Cli run = run_cli("run -m " + model + " -p 'Once upon a time, in a big forest' -n 24 --temp 0 -b 4 -t 2 --profile " +
                          file.path());
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_NE(run.out.find("profile: "), std::string::npos) << run.out;
  const json doc = json::parse(test::read_file(file.path()));
  expect_well_formed(doc);
  expect_nested(doc);
  expect_engine_content(doc, 5, 1);

  // Independently: total time per span name on the engine thread, inside steps.
  int engine_tid = -1;
  for (const auto& [tid, name] : thread_names(doc))
    if (name == "engine") engine_tid = tid;
  std::vector<std::pair<double, double>> steps;
  for (const json& e : events_with(doc, "X"))
    if (e["name"] == "step") steps.emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
  std::map<std::string, double> total;
  bool tokenize = false;
  for (const json& e : events_with(doc, "X")) {
    tokenize |= e["name"] == "tokenize" && e["args"].contains("req");
    const std::string name = e["name"];
    if (e["tid"] != engine_tid || name == "step" || name == "forward") continue;
    if (e["cat"] != "op" && e["cat"] != "engine") continue;
    const double b = e["ts"].get<double>();
    bool in = false;
    for (const auto& [s0, s1] : steps) in |= b >= s0 - 0.002 && b <= s1 + 0.002;
    if (in) total[name] += e["dur"].get<double>();
  }
  EXPECT_TRUE(tokenize);
  ASSERT_FALSE(total.empty());
  const auto top = std::max_element(total.begin(), total.end(), [](auto& a, auto& b) { return a.second < b.second; });

  const Cli prof = run_cli("profile " + file.path());
  ASSERT_EQ(prof.exit_code, 0) << prof.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(prof.out, m, std::regex(R"(top ops: ([^ ]+) ([0-9.]+)%)"))) << prof.out;
  EXPECT_EQ(m[1].str(), top->first) << prof.out;
  EXPECT_TRUE(std::regex_search(prof.out, std::regex(R"(between ops inside forward passes: sum [0-9.]+ ms .*n [0-9]+, p50 [0-9.]+ us, p99 [0-9.]+ us, max [0-9.]+ us)")))
      << prof.out;
  EXPECT_TRUE(std::regex_search(prof.out, std::regex(R"(between steps: sum [0-9.]+ ms, n [0-9]+, p50 [0-9.]+ ms)")))
      << prof.out;
  EXPECT_TRUE(std::regex_search(prof.out, std::regex(R"(gemm\.w_gate\+w_up +[0-9]+ +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9.]+ +[0-9.]+)")))
      << prof.out;
  EXPECT_NE(prof.out.find("KV blocks in use: max"), std::string::npos) << prof.out;
  EXPECT_NE(prof.out.find("tokenize  n 1"), std::string::npos) << prof.out;

  const Cli bad = run_cli("profile " + file.path() + ".missing");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("cannot open"), std::string::npos) << bad.out;
}

// A trace nesting 200,000 levels is an error naming the file and the limit, before it is parsed:
// summarizing one with it in otherData overflowed the stack (SIGSEGV: the value's copy into the
// summary recurses per level); in an event's id it is refused the same way.
TEST(ProfileCli, DeepNestingIsAClearError) {
  for (const char* where : {"otherData", "id"}) {
    test::TempFile file("deep.json");
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    {
      std::ofstream f(file.path(), std::ios::binary);
      if (std::string(where) == "id")
        f << R"({"traceEvents": [{"name": "x", "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 1, "id": )" << deep << "}]}";
      else
        f << R"({"traceEvents": [], "otherData": {"note": )" << deep << "}}";
    }
    const Cli r = run_cli("profile " + file.path());
    EXPECT_EQ(r.exit_code, 1) << where << ": " << r.out;
    EXPECT_NE(r.out.find(file.path() + ": nests more than 128 levels"), std::string::npos) << where << ": " << r.out;
  }
}

// `serve --profile`: SIGTERM shuts the server down gracefully and the trace file is complete.
TEST(ProfileCli, ServeWritesTheTraceOnSigterm) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  test::TempFile file("serve.json");
  test::TempFile log("serve.log");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.path().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(FT_BINARY, FT_BINARY, "serve", "-m", model.c_str(), "--port", "0", "-t", "1", "-c", "256", "--profile",
            file.path().c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int port = 0;
  std::smatch m;
  for (int i = 0; i < 3000 && port == 0; ++i) {  // up to 30 s (calibration under sanitizers)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const std::string text = test::read_file(log.path());
    if (std::regex_search(text, m, std::regex(R"(listening on http://[0-9.]+:([0-9]+))"))) port = std::stoi(m[1]);
  }
  if (port == 0) ::kill(pid, SIGKILL);
  ASSERT_GT(port, 0) << test::read_file(log.path());
  const std::string r = test::http_post(port, "/v1/completions",
                                  json{{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"max_tokens", 8},
                                       {"temperature", 0}, {"stream", true}}.dump());
  EXPECT_NE(r.find("data: [DONE]"), std::string::npos) << r;
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << test::read_file(log.path());
  EXPECT_EQ(WEXITSTATUS(status), 0) << test::read_file(log.path());
  EXPECT_NE(test::read_file(log.path()).find("profile: "), std::string::npos);
  const json doc = json::parse(test::read_file(file.path()));
  expect_well_formed(doc);
  expect_nested(doc);
  expect_engine_content(doc, 5, 1);
  std::set<std::string> names;
  for (const json& e : events_with(doc, "X")) names.insert(e["name"]);
  for (const char* n : {"http.parse", "tokenize", "http.emit", "http.write", "calibrate"}) EXPECT_TRUE(names.count(n)) << n;
}

}  // namespace
}  // namespace ft
