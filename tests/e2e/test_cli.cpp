// The firsttoken binary end to end: `run` prints exactly the golden greedy continuation, and bad
// input gives one clear error line and exit code 1.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/ab_arm.h"
#include "gguf/gguf.h"
#include "model/synthetic.h"
#include "test_util.h"

namespace ft {
namespace {

using Result = test::CliResult;
Result run_cli(const std::string& args) { return test::run_cli(FT_BINARY, args); }

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Writes the tiny synthetic model (f32) to dst with edit(name, ne, bytes) applied to each tensor.
using TensorEdit = std::function<void(const std::string&, std::vector<uint64_t>&, std::vector<uint8_t>&)>;
void write_edited_tiny(const std::string& dst, const TensorEdit& edit) {
  const test::TempFile src("tiny_src.gguf");
  write_synthetic_model(SyntheticOptions{}, src.path());
  const auto f = GGUFFile::open(src.path());
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  for (const GGUFTensorInfo& t : f->tensors()) {
    std::vector<uint64_t> ne = t.ne;
    std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
    edit(t.name, ne, data);
    w.add_tensor(t.name, t.type, ne, std::move(data));
  }
  w.write(dst);
}

TEST(Cli, RunGreedyMatchesGoldenText) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  FT_REQUIRE_SHARED(golden, "models/stories260K.golden.json");
  const auto doc = nlohmann::json::parse(test::read_file(golden));
  for (const auto& c : doc["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const int n = int(c["greedy_tokens"].size());
    const Result r = run_cli("run -m " + quote(model) + " -p " + quote(prompt) + " -n " +
                             std::to_string(n) + " --temp 0 -t 2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c["greedy_text"].get<std::string>()) << "prompt: " << prompt;
    EXPECT_NE(r.err.find("TTFT"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;
  }
}

TEST(Cli, SameSeedSameOutput) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  const std::string args = "run -m " + quote(model) + " -p 'Once upon a time' -n 40 --temp 1 --seed 7";
  const Result a = run_cli(args), b = run_cli(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
  bool differs = false;  // some other seed gives another continuation
  for (int seed = 8; seed < 12 && !differs; ++seed)
    differs = run_cli("run -m " + quote(model) + " -p 'Once upon a time' -n 40 --temp 1 --seed " +
                      std::to_string(seed)).out != a.out;
  EXPECT_TRUE(differs);
}

TEST(Cli, ChatModeRuns) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  const Result r = run_cli("run -m " + quote(model) + " -p 'Hello' -n 8 --temp 0 --chat --system 'Be brief'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("prompt"), std::string::npos);
}

TEST(Cli, CorruptModelIsAClearError) {
  const std::string path = testing::TempDir() + "ft_corrupt_" + std::to_string(getpid()) + ".gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f << "GGUF\x03\x00\x00\x00 definitely not a model";
  }
  const Result r = run_cli("run -m " + quote(path) + " -p hi -n 4");
  std::remove(path.c_str());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("firsttoken: error: " + path), std::string::npos) << r.err;
  const Result missing = run_cli("run -m /nonexistent/model.gguf -p hi");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("cannot open"), std::string::npos) << missing.err;
}

TEST(Cli, PromptLongerThanContextIsAClearError) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  const Result r = run_cli("run -m " + quote(model) + " -p 'Once upon a time there was' -c 4 -n 4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

TEST(Cli, MakeModelThenRun) {
  const std::string path = testing::TempDir() + "ft_tiny_q8_" + std::to_string(getpid()) + ".gguf";
  const Result mk = run_cli("make-model --shape tiny --type q8_0 --seed 3 -o " + quote(path));
  ASSERT_EQ(mk.exit_code, 0) << mk.err;
  const Result r = run_cli("run -m " + quote(path) + " -p 'abc' -n 5 --temp 0 --ignore-eos");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("decode 5 tokens"), std::string::npos) << r.err;
  const Result bad = run_cli("make-model --shape nosuch -o " + quote(path));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("tiny"), std::string::npos) << bad.err;  // lists the known shapes
}

// Flags out of range are one clear error line naming the flag (exit 1), before any model is
// loaded or server contacted: each of these crashed, allocated without bound, overflowed or was
// silently changed (run -c 68719476736 served 32 positions; serve --max-queue 0 refused every
// request; bench serve --timeout 1e10 timed every request out at once).
TEST(Cli, OutOfRangeFlagsAreClearErrors) {
  const test::TempFile workload("workload.json");
  const auto with_workload = [&](const std::string& text) {
    std::ofstream(workload.path(), std::ios::binary) << text;
    return "bench serve --url http://127.0.0.1:1 --quiet --workload " + quote(workload.path());
  };
  const std::string cls = R"("prompt_tokens": 5, "output_tokens": 1)";
  const std::string m = "-m /nonexistent.gguf";  // (never opened: the flags are checked first)
  const std::string serve_bench = "bench serve --url http://127.0.0.1:1 --quiet";
  const std::vector<std::pair<std::function<std::string()>, std::string>> cases = {
      {[&] { return "run " + m + " -p hi -b 4611686018427387904"; }, "-b/--batch must be in [1, 1048576], got 4611686018427387904"},
      {[&] { return "run " + m + " -p hi -b 9223372036854775807"; }, "-b/--batch must be in [1, 1048576]"},
      {[&] { return "run " + m + " -p hi -c 68719476736"; }, "-c/--ctx must be in [0, 16777216], got 68719476736"},
      {[&] { return "run " + m + " -p hi -c -5"; }, "-c/--ctx must be in [0, 16777216], got -5"},
      {[&] { return "run " + m + " -p hi -t -1"; }, "-t/--threads must be in [0, 1024], got -1"},
      {[&] { return "run " + m + " -p hi -n 0"; }, "-n/--n-predict must be in [1, 9223372036854775807], got 0"},
      {[&] { return "perplexity " + m + " -f /dev/null -c 9223372036854775807"; }, "-c/--ctx must be in [0, 16777216]"},
      {[&] { return "perplexity " + m + " -f /dev/null -t 5000"; }, "-t/--threads must be in [0, 1024], got 5000"},
      {[&] { return "perplexity " + m + " -f /dev/null --chunks -1"; }, "--chunks must be in [0, 9223372036854775807], got -1"},
      {[&] { return "bench model " + m + " -p 4611686018427387904"; }, "-p/--n-prompt must be in [1, 1048576]"},
      {[&] { return "bench model " + m + " -n 9223372036854775807"; }, "-n/--n-gen must be in [0, 16777216]"},
      {[&] { return "bench model " + m + " -t -3"; }, "-t/--threads must be in [0, 1024], got -3"},
      {[&] { return "serve " + m + " --max-queue 0"; }, "--max-queue must be in [1, 1073741824], got 0"},
      {[&] { return "serve " + m + " --ttft-slo-base 0 --ttft-slo-stretch 0 --reject-late 2"; },
       "scheduler.ttft_slo_base_ms (--ttft-slo-base) and scheduler.ttft_slo_stretch (--ttft-slo-stretch) are both 0"},
      {[&] { return "serve " + m + " --config /dev/zero"; }, "/dev/zero: the config file is larger than 64 MiB"},
      {[&] { return "client --port 1 --tokens 1,4294967297"; }, "--tokens: '4294967297' is not a token id (0 to 2147483647)"},
      {[&] { return serve_bench + " --timeout 1e10"; }, "--timeout must be in (0, 1e+06] seconds, got 1e+10"},
      {[&] { return serve_bench + " --duration inf"; }, "--duration must be in (0, 1e+06] seconds, got inf"},
      {[&] { return serve_bench + " --duration 1e9"; }, "--duration must be in (0, 1e+06] seconds"},
      {[&] { return serve_bench + " --max-requests 1000000000000"; }, "--max-requests must be in [0, 1048576], got 1000000000000"},
      {[&] { return with_workload(R"({"classes": [{"arrival": {"type": "periodic", "rate": 1, "start_s": -1e15}, )" + cls + "}]}"); },
       "workload: 'classes[0].arrival.start_s' must be in [0, 1e+06] seconds, got -1e+15"},
      {[&] { return with_workload(R"({"classes": [{"arrival": {"rate": 1}, "prompt_tokens": 1000000000000, "output_tokens": 1}]})"); },
       "workload: 'classes[0].prompt_tokens' must stay within 16777216 tokens"},
      {[&] { return with_workload(R"({"name": 5, "classes": [{"arrival": {"rate": 1}, )" + cls + "}]}"); },
       "workload: 'name' must be a string"},
      {[&] { return with_workload(R"({"classes": [{"arrival": {"type": 1, "rate": 1}, )" + cls + "}]}"); },
       "workload: 'classes[0].arrival.type' must be a string"},
  };
  for (const auto& [args, want] : cases) {
    const std::string a = args();
    const Result r = run_cli(a);
    EXPECT_EQ(r.exit_code, 1) << a << "\n" << r.err;
    EXPECT_NE(r.err.find("firsttoken: error: " + want), std::string::npos) << a << "\n" << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << a << "\n" << r.err;
  }
}

// bench model --ab: decode steps alternate between the arms A B B A ..., the pattern inverted
// every other repetition, so each arm gets half of the steps; one line gives B over A.
TEST(Cli, BenchModelAbSplitsDecodeStepsBetweenArms) {
  const int rep0[8] = {0, 1, 1, 0, 0, 1, 1, 0};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ab_arm_of(i, 0), rep0[i]) << i;
    EXPECT_EQ(ab_arm_of(i, 1), 1 - rep0[i]) << i;
  }
  const test::TempFile model("tiny_ab.gguf");
  write_synthetic_model(SyntheticOptions{}, model.path());
  const Result r = run_cli("bench model -m " + quote(model.path()) + " -p 4 -n 5 -r 2 -t 1 --ab");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("decode A/B: B/A ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double ratio = std::strtod(r.out.c_str() + at + 16, nullptr);
  // Both arms timed (their ratio is a measurement: steps of ~10 us, one of them preempted on a busy
  // machine gave 0.0115 once; it is not asserted).
  EXPECT_TRUE(ratio > 0 && std::isfinite(ratio)) << r.out;
  // 5 steps in each of 2 repetitions: A B B A A, then B A A B B (5 each; 6 and 4 without the
  // inversion).
  EXPECT_NE(r.out.find("over 5 steps, B "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" over 5)"), std::string::npos) << r.out;
}

// A weight type the engine cannot compute with: inspect names the tensor and the type, run
// refuses with the same message (both through Model::load, as serve).
TEST(Cli, UnsupportedWeightTypeNamedByInspectAndRun) {
  const test::TempFile model("tiny_i32.gguf");
  {
    const test::TempFile src("tiny_src_i32.gguf");
    write_synthetic_model(SyntheticOptions{}, src.path());
    const auto f = GGUFFile::open(src.path());
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const GGUFTensorInfo& t : f->tensors())  // (f32 -> i32: the same 4 bytes per element)
      w.add_tensor(t.name, t.name == "blk.1.ffn_up.weight" ? GGMLType::I32 : t.type, t.ne,
                   std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    w.write(model.path());
  }
  const std::string expect = "tensor 'blk.1.ffn_up.weight': type i32 is not supported";
  const Result ins = run_cli("inspect " + quote(model.path()));
  EXPECT_EQ(ins.exit_code, 1);
  EXPECT_NE(ins.err.find(expect), std::string::npos) << ins.err;
  const Result r = run_cli("run -m " + quote(model.path()) + " -p hi -n 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
}

// A padded vocabulary (Qwen2 and others): 60 embedding rows more than the tokenizer lists. At a
// temperature this high sampling is near uniform over what it may pick; 64 tokens would draw a
// padding id with probability 1 - (260/320)^64 > 0.99999 were they not masked.
TEST(Cli, PaddedVocabularyNeverEmitsPaddingIds) {
  const test::TempFile model("padded.gguf");
  static constexpr uint64_t kPad = 60;
  write_edited_tiny(model.path(), [](const std::string& name, std::vector<uint64_t>& ne, std::vector<uint8_t>& data) {
    if (name != "token_embd.weight" && name != "output.weight") return;
    const size_t row = size_t(ne[0]) * sizeof(float);
    ASSERT_EQ(data.size(), row * ne[1]);
    ASSERT_GE(ne[1], kPad);
    data.insert(data.end(), data.begin(), data.begin() + std::ptrdiff_t(kPad * row));  // copies of the first rows
    ne[1] += kPad;
  });
  const Result r = run_cli("run -m " + quote(model.path()) +
                           " -p abc -n 64 --ignore-eos --seed 7 --temp 100 --top-k 0 --top-p 1 --min-p 0");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("decode 64 tokens"), std::string::npos) << r.err;
}

// Generation that fails (NaN everywhere: no finite logit to sample) is an error and exit code 1.
TEST(Cli, RunExitsNonZeroWhenGenerationFails) {
  const test::TempFile model("nan.gguf");
  write_edited_tiny(model.path(), [](const std::string& name, std::vector<uint64_t>&, std::vector<uint8_t>& data) {
    if (name != "output_norm.weight") return;
    const float nan = std::nanf("");
    for (size_t i = 0; i + sizeof(float) <= data.size(); i += sizeof(float)) std::memcpy(data.data() + i, &nan, sizeof nan);
  });
  const Result r = run_cli("run -m " + quote(model.path()) + " -p abc -n 4 --temp 0");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("no finite logits"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ft

namespace ft {
namespace {

// `perplexity --kl-base`: KV cache types against f32 KV on tests/data/stories260K.txt (text
// stories260K wrote, 3578 tokens: 6 windows of 512, 1530 scored positions).
struct KlLine {
  double kl = -1, top1 = -1;
};
KlLine parse_kl(const std::string& out) {
  KlLine k;
  const size_t a = out.find("mean KL "), b = out.find("top-1 agreement ");
  if (a != std::string::npos) k.kl = std::stod(out.substr(a + 8));
  if (b != std::string::npos) k.top1 = std::stod(out.substr(b + 16));
  return k;
}

// Bounds, from what they measure (2026-11-30) and what they stand for. f32 against f32 is the same
// computation: KL exactly 0, every top-1 the same. f16 rounds K/V to 11 bits (relative 2^-12):
// measured 2e-6 nats on stories260K, bound 1e-4. q8_0: measured 0.0012 nats and 98.8% top-1 on
// stories260K; bound 0.01 nats (the target: a tenth of a typical 4-bit weight quantization's KL)
// and 95% top-1. The synthetic tiny model has random weights: its distributions are nearly flat,
// so any rounding flips some top-1s (97.4% with f16) and only its KL is held: f16 measured 1e-4
// nats, bound 1e-3; q8_0 bound 0.01.
void check_kv_types_kl(const std::string& model, const std::string& ctx, double f16_kl, bool check_top1) {
  const std::string text = (std::filesystem::path(__FILE__).parent_path() / "../data/stories260K.txt").string();
  const test::TempFile base("kl_base.bin");
  const std::string common = "perplexity -m " + quote(model) + " -f " + quote(text) + " -t 2 -c " + ctx;
  const Result save = run_cli(common + " --kv-type f32 --save-logits " + quote(base.path()));
  ASSERT_EQ(save.exit_code, 0) << save.err;
  EXPECT_NE(save.out.find("perplexity: "), std::string::npos) << save.out;
  struct Case { const char* type; double max_kl, min_top1; };
  for (const Case c : {Case{"f32", 0.0, 100.0}, Case{"f16", f16_kl, 99.0}, Case{"q8_0", 0.01, 95.0}}) {
    const Result r = run_cli(common + " --kv-type " + c.type + " --kl-base " + quote(base.path()));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const KlLine k = parse_kl(r.out);
    EXPECT_GE(k.kl, 0.0) << c.type << ": " << r.out;
    EXPECT_LE(k.kl, c.max_kl) << c.type << ": " << r.out;
    EXPECT_GE(k.top1, check_top1 || c.max_kl == 0 ? c.min_top1 : 0.0) << c.type << ": " << r.out;
  }
  // A file from another window size is refused, not misread.
  const Result bad = run_cli("perplexity -m " + quote(model) + " -f " + quote(text) + " -t 2 -c 64 --kl-base " +
                             quote(base.path()));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("windows of"), std::string::npos) << bad.err;
}

TEST(Cli, PerplexityKvTypesKlAgainstF32Stories260K) {
  FT_REQUIRE_SHARED(model, "models/stories260K.gguf");
  check_kv_types_kl(model, "512", 1e-4, true);
}

TEST(Cli, PerplexityKvTypesKlAgainstF32SyntheticTiny) {
  const test::TempFile model("tiny_kl.gguf");
  SyntheticOptions opt;
  opt.type = GGMLType::Q8_0;
  write_synthetic_model(opt, model.path());
  check_kv_types_kl(model.path(), "128", 1e-3, false);
}

}  // namespace
}  // namespace ft
