// Subcommands of the firsttoken CLI: each declares its options on the CLI11 app and runs.
#pragma once
#include <CLI/CLI.hpp>

#include "core/error.h"
#include "engine/sampler.h"
#include "server/config.h"

#include <string>
#include <vector>

namespace ft::tools {

// ft::Error "FLAG must be in [lo, hi], got v" (the words of serve's check_range): for the flags run,
// bench and perplexity share with serve, with serve's limits (server::kMaxThreads, ...).
inline void check_flag(const char* flag, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) fail(flag, " must be in [", lo, ", ", hi, "], got ", v);
}

// Speculative decoding flags of serve, run and bench model: --spec ngram|draft|off,
// --draft-model FILE (implies --spec draft), --spec-k K|auto. Given flags override the config.
struct SpecArgs {
  std::string method, draft_model, k;  // empty: not given
};
void add_spec_flags(CLI::App* c, SpecArgs& a);
void apply_spec_flags(const SpecArgs& a, server::ServeConfig& c);
// The flags alone (run, bench): a validated SpecConfig (off when none is given).
SpecConfig spec_from_flags(const SpecArgs& a);

// RoPE flags of run, serve, perplexity and bench model (llama.cpp's): --rope-scaling
// none|linear|yarn, --rope-scale N, --rope-freq-base N, --yarn-orig-ctx N, over the file's keys.
void add_rope_flags(CLI::App* c, RopeOverrides& r);

struct RunArgs {
  std::string model, prompt, system, chat_format;
  int64_t n_predict = 128;
  SamplingParams sampling = kCliSampling;  // the flags write into it
  bool seed_set = false;
  int threads = 0;
  int64_t ctx = 0, batch = 512;
  std::string kv_type = std::string(kv_type_name(RuntimeConfig{}.kv_type));
  bool mlock = RuntimeConfig{}.mlock;
  bool chat = false, ignore_eos = false;
  std::string profile;  // --profile FILE: write a Chrome/Perfetto trace
  std::string lora;     // --lora FILE: run under this LoRA adapter
  SpecArgs spec;
  RopeOverrides rope;
};
void add_run(CLI::App& app, RunArgs& a);
int cmd_run(const RunArgs& a);

struct PerplexityArgs {
  std::string model, file, save_logits, kl_base;
  std::string kv_type = std::string(kv_type_name(RuntimeConfig{}.kv_type));
  int64_t ctx = 0, max_windows = 0;
  int threads = 0;
  RopeOverrides rope;
};
void add_perplexity(CLI::App& app, PerplexityArgs& a);
int cmd_perplexity(const PerplexityArgs& a);

struct MakeModelArgs {
  std::string shape = "tiny", type = "f32", vocab, arch = "llama", out;
  std::string draft_type, draft_out;  // also write the same weights at another type (a speculative draft)
  uint64_t seed = 1234;
  int32_t layers = 0, head_dim = 0, kv_heads = 0, window = 0;  // SyntheticOptions' overrides (0: the shape's, the arch's)
  float rope_scale = 0;
  std::string rope_scaling = "linear";
  int32_t rope_orig_ctx = 0;
  int32_t experts = 0, experts_used = 0;
  // A random LoRA adapter for the model written (model/synthetic.h write_synthetic_lora).
  int32_t lora_rank = 0;  // 0 = none
  float lora_alpha = 0;   // 0 = 2 x rank
  std::string lora_type = "f32", lora_out, merged_out;
  uint64_t lora_seed = 1;
};
void add_make_model(CLI::App& app, MakeModelArgs& a);
int cmd_make_model(const MakeModelArgs& a);

struct InspectArgs {
  std::string model;
  bool tensors = false;
};
void add_inspect(CLI::App& app, InspectArgs& a);
int cmd_inspect(const InspectArgs& a);

// `bench serve` (load generator against any OpenAI-compatible URL) and `bench ablate` (our
// server in several configurations, the same workload against each).
struct BenchServeArgs {
  std::string url, model, workload = "mixed", endpoint = "completions", slo, out, plot, token_range = "100:255";
  double duration_s = 0, timeout_s = 120;
  uint64_t seed = 0;
  int concurrency = 0;
  int64_t max_requests = 0;
  bool text_prompts = false, quiet = false;
  // ablate
  std::string configs = "nochunk,chunk1024,chunk256,auto,auto-nocache", out_dir = "bench-ablate";
  std::vector<std::string> server_args;
  bool isolated = false;
};
int cmd_bench_serve(const BenchServeArgs& a);
int cmd_bench_ablate(const BenchServeArgs& a);
void add_bench_serve(CLI::App& bench, BenchServeArgs& a, std::string& mode);

struct BenchArgs {
  std::string mode, model, backend = "cpu";
  int64_t n_prompt = 512, n_gen = 64;
  int threads = 0, reps = 1;
  std::string kv_type = std::string(kv_type_name(RuntimeConfig{}.kv_type));
  SpecArgs spec;
  RopeOverrides rope;
  std::string prompt;  // with --spec: a text prompt (the model's tokenizer) instead of random tokens
  std::vector<std::string> lora;  // bench lora: adapter files
  bool ab = false;                // bench model --ab: decode steps alternate core/ab_arm.h's arm
  BenchServeArgs serve;
};
void add_bench(CLI::App& app, BenchArgs& a);
int cmd_bench(const BenchArgs& a);

struct ServeArgs {
  std::string config;
  std::string profile;         // --profile FILE: write a Chrome/Perfetto trace at shutdown
  server::ServeConfig flags;   // the serve settings' flags write here; those given override --config
  std::vector<std::pair<const server::ServeSetting*, CLI::Option*>> given;
  std::vector<std::string> lora;  // --lora NAME=FILE (repeatable): loaded after the config's adapters
  SpecArgs spec;
  RopeOverrides rope;
};
void add_serve(CLI::App& app, ServeArgs& a);
int cmd_serve(const ServeArgs& a);

struct ClientArgs {
  std::string host = "127.0.0.1", prompt, tokens;
  int port = 0;
  int64_t n_predict = 128;
  float temperature = 0;
  uint64_t seed = 0;
  bool seed_set = false, ignore_eos = false, stats = false;
  bool embed = false;  // --embed: the prompt's embedding (one line of floats), not a generation
  bool bench = false;  // --bench: JSON vs FlatBuffers codec costs, and TTFT when ports are given
  int http_port = 0, reps = 50;
};
void add_client(CLI::App& app, ClientArgs& a);
int cmd_client(const ClientArgs& a);

struct ProfileArgs {
  std::string file;
  int top = 3;
};
void add_profile(CLI::App& app, ProfileArgs& a);
int cmd_profile(const ProfileArgs& a);

}  // namespace ft::tools
