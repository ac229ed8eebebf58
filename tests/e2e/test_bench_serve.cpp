// `firsttoken bench serve` and `bench ablate` end to end against our server (a child process on
// stories260K, or the built-in tiny model when the shared data is absent): every planned request
// is sent and counted in its class, numbers are sane, rejections are counted by kind, bad input is
// one clear error. No timing is asserted beyond ordering (tests share 2 cores).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loadgen/server_process.h"
#include "loadgen/workload.h"
#include "test_util.h"

namespace ft::loadgen {
namespace {

using nlohmann::json;

std::string tmp(const std::string& name) {
  return testing::TempDir() + "ft_bench_" + std::to_string(getpid()) + "_" + name;
}

using Result = test::CliResult;
Result run_cli(const std::string& args) { return test::run_cli(FT_BINARY, args); }

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool svg_ok(const std::string& path) {
  const std::string s = test::read_file(path);
  return s.rfind("<svg", 0) == 0 && s.size() > 7 && s.compare(s.size() - 7, 7, "</svg>\n") == 0;
}

// The model the server loads: stories260K, or the built-in tiny model (random byte-level text).
std::vector<std::string> model_args(bool& real) {
  const std::string m = test::shared_file("models/stories260K.gguf");
  real = !m.empty();
  return real ? std::vector<std::string>{"-m", m} : std::vector<std::string>{};
}

const char* kTwoClasses = R"({"name": "two", "duration_s": 3, "classes": [
  {"name": "chat", "arrival": {"type": "poisson", "rate": 4}, "prompt_tokens": {"mean": 30, "spread": 10},
   "output_tokens": {"mean": 12, "spread": 4}},
  {"name": "doc", "arrival": {"type": "periodic", "rate": 1, "start_s": 0.5}, "prompt_tokens": 300,
   "output_tokens": 6, "shared_prefix_tokens": 100}]})";

TEST(BenchServe, EveryPlannedRequestCompletesInItsClass) {
  bool real = false;
  const auto args = model_args(real);
  ServerProcess srv(FT_BINARY, args, tmp("server1.log"));
  const std::string wl = tmp("two.json"), out = tmp("two_out.json"), plot = tmp("two.svg");
  write(wl, kTwoClasses);
  const Result r = run_cli("bench serve --url " + srv.url() + " --workload " + wl + " --seed 3 --out " + out +
                           " --plot " + plot + " --slo ttft:60000,tpot:60000 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("== chat"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("goodput"), std::string::npos) << r.out;

  const auto plan = plan_arrivals(workload_from_json(json::parse(kTwoClasses)), 3);
  size_t want[2] = {0, 0};
  for (const auto& p : plan) ++want[p.class_index];
  ASSERT_GT(want[0], 3u);
  ASSERT_EQ(want[1], 3u);

  const json j = json::parse(test::read_file(out));
  for (const char* k : {"config", "wall_s", "classes", "requests"}) EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["config"]["seed"], 3);
  EXPECT_EQ(j["config"]["workload"]["name"], "two");
  ASSERT_EQ(j["classes"].size(), 3u);  // chat, doc, all
  for (int c = 0; c < 2; ++c) {
    const json& cs = j["classes"][c];
    EXPECT_EQ(cs["sent"], want[c]) << cs.dump();
    EXPECT_EQ(cs["completed"], want[c]) << cs.dump();
    EXPECT_EQ(cs["error_count"], 0);
    EXPECT_EQ(cs["slo_met"], want[c]);
    for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"})
      for (const char* f : {"mean", "p50", "p90", "p99", "max"}) EXPECT_TRUE(cs[m].contains(f)) << m << "." << f;
    EXPECT_GT(cs["ttft_ms"]["p50"].get<double>(), 0);
    EXPECT_LE(cs["ttft_ms"]["max"].get<double>(), cs["e2e_ms"]["max"].get<double>());
    EXPECT_GT(cs["output_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(cs["goodput_rps"].get<double>(), 0);
  }
  EXPECT_EQ(j["classes"][2]["name"], "all");
  ASSERT_EQ(j["requests"].size(), plan.size());
  int64_t total_chunks = 0, total_tokens = 0;
  for (const json& q : j["requests"]) {
    ASSERT_TRUE(q["error"].is_null()) << q.dump();
    const double ttft = q["ttft_s"], e2e = q["e2e_s"];
    EXPECT_GT(ttft, 0);
    EXPECT_LE(ttft, e2e);
    EXPECT_EQ(q["output_tokens"], q["max_tokens"]) << q.dump();
    const int64_t chunks = q["chunks"];
    EXPECT_EQ(q["itl_s"].size(), size_t(chunks - 1)) << q.dump();
    // A token without text (an end-of-generation token sampled under ignore_eos, bytes held back
    // as partial UTF-8) adds no chunk: chunks <= tokens, equal for most requests on a real model.
    EXPECT_LE(chunks, q["output_tokens"].get<int64_t>());
    EXPECT_GE(chunks, 1);
    total_chunks += chunks;
    total_tokens += q["output_tokens"].get<int64_t>();
    EXPECT_TRUE(q["class"] == "chat" || q["class"] == "doc");
  }
  if (real) {
    EXPECT_GE(double(total_chunks), 0.8 * double(total_tokens));
  }
  EXPECT_TRUE(svg_ok(plot)) << test::read_file(plot).substr(0, 200);

  // Chat endpoint and the closed loop: exactly --max-requests requests.
  const Result chat = run_cli("bench serve --url " + srv.url() + " --endpoint chat --workload " + wl +
                              " --concurrency 3 --max-requests 7 --out " + out + " --quiet");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  const json c = json::parse(test::read_file(out));
  EXPECT_EQ(c["classes"][2]["sent"], 7);
  EXPECT_EQ(c["classes"][2]["completed"], 7);
  EXPECT_EQ(c["config"]["endpoint"], "chat");
}

TEST(BenchServe, RejectionsAreCountedByKindNotAsCompleted) {
  bool real = false;
  auto args = model_args(real);
  args.insert(args.end(), {"--max-queue", "1"});
  ServerProcess srv(FT_BINARY, args, tmp("server2.log"));
  // A prompt beyond the 2048-token context: 400 for every request of that class.
  const std::string wl = tmp("err.json"), out = tmp("err_out.json");
  write(wl, R"({"name": "err", "duration_s": 2, "classes": [
    {"name": "ok", "arrival": {"type": "periodic", "rate": 1}, "prompt_tokens": 10, "output_tokens": 4},
    {"name": "toolong", "arrival": {"type": "periodic", "rate": 1, "start_s": 0.5}, "prompt_tokens": 3000,
     "output_tokens": 4}]})");  // apart in time: the queue of 1 never refuses these
  Result r = run_cli("bench serve --url " + srv.url() + " --workload " + wl + " --out " + out + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(test::read_file(out));
  EXPECT_EQ(j["classes"][0]["completed"], 2) << j["classes"][0].dump();
  EXPECT_EQ(j["classes"][1]["sent"], 2);
  EXPECT_EQ(j["classes"][1]["completed"], 0);
  EXPECT_EQ(j["classes"][1]["errors"]["http_400"], 2) << j["classes"][1].dump();
  EXPECT_EQ(j["classes"][1]["ttft_ms"]["n"], 0);
  for (const json& q : j["requests"])
    if (q["class"] == "toolong") {
      EXPECT_NE(q["error_message"].get<std::string>().find("context"), std::string::npos);
    }
  EXPECT_NE(r.out.find("errors 2 (http_400 2)"), std::string::npos) << r.out;

  // 24 at once against a queue of 1: some are refused with 429, the rest complete.
  write(wl, R"({"name": "burst", "duration_s": 1, "classes": [
    {"name": "burst", "arrival": {"type": "poisson", "rate": 50}, "prompt_tokens": 400, "output_tokens": 32}]})");
  r = run_cli("bench serve --url " + srv.url() + " --workload " + wl +
              " --concurrency 24 --max-requests 48 --out " + out + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = json::parse(test::read_file(out));
  const json& all = j["classes"][1];
  EXPECT_EQ(all["sent"], 48);
  EXPECT_GT(all["errors"].value("http_429", 0), 0) << all.dump();
  EXPECT_GT(all["completed"].get<int>(), 0);
  EXPECT_EQ(all["completed"].get<int>() + all["error_count"].get<int>(), 48);
  EXPECT_EQ(all["errors"].size(), 1u) << all.dump();  // nothing but 429s
}

TEST(BenchServe, BadInputIsOneClearError) {
  int dead_port = 0;
  {
    bool real = false;
    ServerProcess srv(FT_BINARY, model_args(real), tmp("server3.log"));
    dead_port = srv.port();
  }  // stopped: its port now refuses connections
  const std::string dead = "http://127.0.0.1:" + std::to_string(dead_port);
  struct Case {
    std::string args, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"bench serve --url " + dead + " --workload short --duration 1", "cannot reach"},
           {"bench serve --url https://example.org --workload short", "https"},
           {"bench serve --url http://127.0.0.1:99999 --workload short", "bad port"},
           {"bench serve --url " + dead + " --workload nosuch", "nosuch"},
           {"bench serve --url " + dead + " --slo ttft=5", "--slo"},
           {"bench serve --url " + dead + " --slo ttft:5,latency:3", "unknown key 'latency'"},
           {"bench ablate --configs auto,nosuch", "unknown configuration 'nosuch'"},
       }) {
    const Result r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find("firsttoken: error:"), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
  }
}

TEST(BenchAblate, TwoConfigsOneTable) {
  const std::string wl = tmp("abl.json"), dir = tmp("ablate_out");
  write(wl, R"({"name": "abl", "duration_s": 2, "classes": [
    {"name": "short", "arrival": {"type": "poisson", "rate": 3}, "prompt_tokens": 20, "output_tokens": 4},
    {"name": "long", "arrival": {"type": "periodic", "rate": 1}, "prompt_tokens": 600, "output_tokens": 4}]})");
  const Result r = run_cli("bench ablate --configs nochunk,chunk256 --workload " + wl + " --out " + dir + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| config | short TTFT p50 | short TTFT p99 | long TTFT p50"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| nochunk |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| chunk256 |"), std::string::npos) << r.out;
  EXPECT_TRUE(svg_ok(dir + "/ablate.svg"));
  EXPECT_TRUE(svg_ok(dir + "/chunk256.svg"));
  for (const char* cfg : {"nochunk", "chunk256"}) {
    const json j = json::parse(test::read_file(dir + "/" + cfg + ".json"));
    EXPECT_EQ(j["config"]["name"], cfg);
    EXPECT_EQ(j["classes"][2]["error_count"], 0) << j["classes"][2].dump();
    EXPECT_GT(j["classes"][2]["completed"].get<int>(), 0);
  }
  const json cfg = json::parse(test::read_file(dir + "/chunk256.config.json"));
  EXPECT_EQ(cfg["scheduler"]["prefill_chunk_size"], 256);
  const json s = json::parse(test::read_file(dir + "/summary.json"));
  EXPECT_EQ(s["configs"].size(), 2u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ft::loadgen
