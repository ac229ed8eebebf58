// `firsttoken serve` settings: one declaration each (serve_settings(): config-file key, CLI flag,
// range), the JSON config file, and the mapping onto EngineConfig. Where a setting is the engine's,
// its default is the engine's.
//
// File shape (every section and key optional; an unknown key is an error naming it):
//   {"scheduler": {"prefill_chunk_size": "auto" | 0 (no chunking) | N, "step_latency_target_ms": N,
//                  "max_num_seqs": N, "max_batch_tokens": N, "ttft_slo_base_ms": N,
//                  "ttft_slo_stretch": N, "reject_late_factor": N, "max_active_adapters": N,
//                  "max_loaded_adapters": N, "max_auto_chunk": N,
//                  "enable_speculative_decoding": false},
//    "parallel_config": {"tp_size": 1, "pp_size": 1, "optimize_for_latency": true},
//    "server": {"host", "port", "binary_port", "max_queue", "threads", "http_threads", "max_body_bytes",
//               "header_timeout_s", "body_timeout_s", "write_timeout_s", "shutdown_timeout_s",
//               "frame_timeout_s", "max_connections",
//               "log_level", "model", "served_model_name", "context_length", "binary_port_any",
//               "api_key", "allowed_origins", "mlock", "chat_template_file", "reasoning_format", "pooling",
//               "max_stored_responses", "max_stored_bytes"},
//    "kv_cache": {"memory_mib": N, "block_size": N (a multiple of 16), "prefix_caching": true,
//                 "dtype": "f16" | "bf16" | "q8_0" | "f32"},
//    "speculative": {"method": "ngram" | "draft", "draft_model": "draft.gguf",
//                    "num_speculative_tokens": N | "auto", "prompt_lookup_min": N, "prompt_lookup_max": N},
//    "adapters": [{"name": "NAME", "path": "ADAPTER.gguf"}, ...]}   (LoRA adapters loaded at start)
// Speculative decoding is on when scheduler.enable_speculative_decoding is true (its method then
// defaults to ngram); the speculative section alone only configures it.
// tp_size x pp_size > 1 runs under `mpirun -n tp_size*pp_size` (tensor and pipeline parallelism over
// MPI: engine/tensor_parallel.h).
// Features not built yet (pp > 1, a throughput-optimised mode) are
// refused with "... is not supported yet", never silently ignored. max_active_adapters caps the
// distinct LoRA adapters running at once (0: adapters off).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace ft::server {

// Limits of settings that run, bench and perplexity share with serve (their flags take the same
// range as serve's): compute threads, context length, tokens in one forward pass.
inline constexpr int kMaxThreads = 1024;
inline constexpr int64_t kMaxContextLength = int64_t(1) << 24;
inline constexpr int64_t kMaxBatchTokens = int64_t(1) << 20;
// The largest file read_text_file() reads (a config file, a chat template, a workload).
inline constexpr int64_t kMaxTextFileBytes = int64_t(64) << 20;

struct ServeConfig {
  // server
  std::string model;              // GGUF path; empty = built-in synthetic "tiny" model
  std::string served_model_name;  // empty = the model file's stem
  std::string host = "127.0.0.1";
  int port = 8000;                // 0 = any free port (printed at start)
  int binary_port = 0;            // the binary protocol's port; 0 = off
  bool binary_port_any = false;   // the binary protocol on any free port (printed at start)
  int threads = RuntimeConfig{}.threads;  // compute threads of the engine (0 = all cores)
  bool mlock = RuntimeConfig{}.mlock;     // pin the weights in RAM
  int http_threads = 2;           // I/O threads = HTTP workers (each with its own tokenizer)
  int64_t max_queue = 256;        // requests waiting for their first token; more -> 429
  uint64_t max_body_bytes = 4u << 20;  // an HTTP body or a binary frame; memory is taken as bytes arrive
  double header_timeout_s = 30, body_timeout_s = 30, write_timeout_s = 60, shutdown_timeout_s = 10;
  double frame_timeout_s = 30;    // a binary frame must arrive within this from its first byte
  int64_t max_connections = 512;  // open connections per listener (HTTP, binary); more are refused at accept
  std::string log_level = "info";
  std::string api_key;            // non-empty: every route but /health and /metrics needs "Authorization: Bearer KEY"
  std::string allowed_origins;    // CORS: comma-separated origins ("*" = any); empty = no CORS headers
  std::string chat_template_file; // a Jinja chat template served instead of the model's; empty = the model's
  std::string reasoning_format = "auto";  // auto | deepseek | none (ReasoningSplit)
  std::string pooling = "auto";           // /v1/embeddings: auto | mean | cls | last (server::resolve_pooling)
  int64_t context_length = RuntimeConfig{}.n_ctx;  // 0 = the model's
  // The Responses API's stored responses (ResponseStore): at most this many, of at most these bytes
  // in all; 0 responses: none stored. The Conversations API's conversations (ConversationStore): the
  // same caps, apart.
  int64_t max_stored_responses = 10000;
  uint64_t max_stored_bytes = uint64_t(128) << 20;
  // parallel_config
  int tp_size = 1;  // tensor-parallel ranks (MPI)
  int pp_size = 1;  // pipeline stages (MPI): tp_size x pp_size ranks
  // scheduler
  int64_t prefill_chunk_size = SchedulerConfig{}.chunk_size;  // -1 = auto
  double step_latency_target_ms = SchedulerConfig{}.step_latency_target_ms;
  int32_t max_num_seqs = SchedulerConfig{}.max_num_seqs;
  int64_t max_batch_tokens = SchedulerConfig{}.max_batch_tokens;
  int64_t max_auto_chunk = SchedulerConfig{}.max_auto_chunk;
  double ttft_slo_base_ms = SchedulerConfig{}.ttft_slo_base_ms;
  double ttft_slo_stretch = SchedulerConfig{}.ttft_slo_stretch;
  double reject_late_factor = SchedulerConfig{}.reject_late_factor;  // 0 = off
  int64_t max_active_adapters = SchedulerConfig{}.max_active_adapters;
  int64_t max_loaded_adapters = SchedulerConfig{}.max_loaded_adapters;
  // LoRA adapters to load at start: (name, GGUF path), from "adapters" and --lora NAME=FILE.
  std::vector<std::pair<std::string, std::string>> adapters;
  RopeOverrides rope;  // --rope-scaling etc. (flags only: tools/rope_flags.cpp)
  // kv_cache
  uint64_t kv_memory_mib = EngineConfig{}.kv_memory_bytes >> 20;  // 0 = engine default (4 full contexts, at most kDefaultMaxKvBytes)
  int32_t kv_block_size = RuntimeConfig{}.kv_block_size;
  bool prefix_caching = EngineConfig{}.prefix_caching;
  std::string kv_type = std::string(kv_type_name(RuntimeConfig{}.kv_type));
  // speculative decoding
  bool enable_speculative_decoding = false;
  std::string spec_method = "ngram";
  std::string draft_model;
  int64_t num_speculative_tokens = SpecConfig{}.k;  // -1 = auto (adapted per request, at most SpecConfig{}.k)
  int64_t prompt_lookup_min = SpecConfig{}.ngram_min;
  int64_t prompt_lookup_max = SpecConfig{}.ngram_max;
};

// One serve setting: where it lives in ServeConfig, its config-file key, its CLI flag, its range.
struct ServeSetting {
  using Field = std::variant<int ServeConfig::*, int64_t ServeConfig::*, uint64_t ServeConfig::*,
                             double ServeConfig::*, bool ServeConfig::*, std::string ServeConfig::*>;
  const char* key;    // config file: "section.name"
  const char* flags;  // CLI11 names ("-t,--threads"); "" = the config file only
  const char* help;
  Field field;
  double lo = 0, hi = 0;    // numbers: the accepted range
  bool takes_auto = false;  // the config file also takes "auto" (= -1)
};
std::span<const ServeSetting> serve_settings();
// Throws ft::Error "<name> must be in [lo, hi], got x" when s's number in c is out of its range.
void check_range(const ServeSetting& s, const ServeConfig& c, const std::string& name);

// Applies a parsed config file over cfg. Throws ft::Error naming the key ("scheduler.foo") on an
// unknown key, a wrong type or an out-of-range value, or saying "not supported yet".
void apply_config_json(const nlohmann::json& doc, ServeConfig& cfg);
// ft::Error saying "not supported yet" for what parallelism cannot run with (LoRA adapters).
void check_parallel(const ServeConfig& cfg);
// ft::Error naming both keys (and flags) when ttft_slo_base_ms and ttft_slo_stretch are both 0: every
// request's default TTFT deadline would be 0 ms (with --reject-late, every request refused).
void check_deadlines(const ServeConfig& cfg);
// A whole file's bytes; ft::Error "PATH: cannot open the WHAT", or "PATH: the WHAT is larger than
// kMaxTextFileBytes" (not a regular file: /dev/zero never ends).
std::string read_text_file(const std::string& path, std::string_view what);
// Reads and applies FILE (ft::Error naming the file on I/O or JSON errors).
void apply_config_file(const std::string& path, ServeConfig& cfg);
// The engine's settings (speculation: SpecConfig, validated; the draft model is loaded by the caller).
EngineConfig to_engine_config(const ServeConfig& cfg);
SpecConfig to_spec_config(const ServeConfig& cfg);
// "NAME=FILE" (serve --lora) -> (NAME, FILE); ft::Error when either side is empty.
std::pair<std::string, std::string> parse_lora_flag(const std::string& s);
// served_model_name "NAME[,ALIAS...]" -> the names, NAME first; ft::Error for an empty or repeated one.
std::vector<std::string> parse_served_names(const std::string& s);

}  // namespace ft::server
