#include "server/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/json_file.h"

namespace ft::server {

using json = nlohmann::json;

namespace {

// Typed getters: the key path is in every message.
int64_t as_int(const json& v, const std::string& key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) fail("config: '", key, "' must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) fail("config: '", key, "' must be in [", lo, ", ", hi, "], got ", x);
  return x;
}
double as_num(const json& v, const std::string& key, double lo, double hi) {
  if (!v.is_number()) fail("config: '", key, "' must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) fail("config: '", key, "' must be in [", lo, ", ", hi, "], got ", x);
  return x;
}
bool as_bool(const json& v, const std::string& key) {
  if (!v.is_boolean()) fail("config: '", key, "' must be a boolean");
  return v.get<bool>();
}
std::string as_str(const json& v, const std::string& key) {
  if (!v.is_string()) fail("config: '", key, "' must be a string");
  return v.get<std::string>();
}

const ServeSetting kSettings[] = {
    {"server.model", "-m,--model", "GGUF model file (default: a built-in synthetic 'tiny' model, random weights)",
     &ServeConfig::model},
    {"server.served_model_name", "--served-model-name", "Model id clients send (default: the file's stem); NAME,ALIAS,...: "
     "further names clients may send (e.g. the names Claude Code asks for); answers name NAME",
     &ServeConfig::served_model_name},
    {"server.host", "--host", "Address to listen on", &ServeConfig::host},
    {"server.port", "--port", "Port (0 = any free port, printed at start)", &ServeConfig::port, 0, 65535},
    {"server.binary_port", "--binary-port", "Port of the binary protocol (FlatBuffers frames; 0 = off)",
     &ServeConfig::binary_port, 0, 65535},
    {"server.binary_port_any", "--binary-port-any", "Serve the binary protocol on any free port (printed at start)",
     &ServeConfig::binary_port_any},
    {"server.threads", "-t,--threads", "Engine compute threads (0 = all cores)", &ServeConfig::threads, 0, kMaxThreads},
    {"server.mlock", "--mlock", "Pin the weights in RAM (mlock; a refusal, e.g. by RLIMIT_MEMLOCK, is logged)",
     &ServeConfig::mlock},
    {"server.http_threads", "--http-threads", "HTTP I/O worker threads", &ServeConfig::http_threads, 1, 256},
    {"server.max_queue", "--max-queue", "Requests waiting for their first token before 429", &ServeConfig::max_queue,
     1, 1 << 30},
    {"server.max_body_bytes", "--max-body-bytes", "Largest HTTP request body or binary-protocol frame (bytes)",
     &ServeConfig::max_body_bytes, 1024, double(int64_t(1) << 32)},
    {"server.max_connections", "--max-connections",
     "Open connections per listener (HTTP, binary); more are refused at accept (HTTP: 503)", &ServeConfig::max_connections, 1,
     1 << 20},
    {"server.frame_timeout_s", "--frame-timeout",
     "Seconds a binary-protocol frame may take to arrive, from its first byte", &ServeConfig::frame_timeout_s, 0.01,
     86400},
    {"server.header_timeout_s", "", "", &ServeConfig::header_timeout_s, 0.01, 86400},
    {"server.body_timeout_s", "", "", &ServeConfig::body_timeout_s, 0.01, 86400},
    {"server.write_timeout_s", "", "", &ServeConfig::write_timeout_s, 0.01, 86400},
    {"server.shutdown_timeout_s", "--shutdown-timeout", "Seconds in-flight requests get on SIGINT/SIGTERM",
     &ServeConfig::shutdown_timeout_s, 0, 86400},
    {"server.log_level", "--log-level", "trace, debug, info, warn, error, critical, off", &ServeConfig::log_level},
    {"server.api_key", "--api-key", "Clients must send 'Authorization: Bearer KEY' (/health, /metrics stay open)",
     &ServeConfig::api_key},
    {"server.allowed_origins", "--allowed-origins", "CORS: comma-separated origins browsers may call from ('*' = any)",
     &ServeConfig::allowed_origins},
    {"server.chat_template_file", "--chat-template-file", "A Jinja chat template to serve instead of the model's",
     &ServeConfig::chat_template_file},
    {"server.reasoning_format", "--reasoning-format",
     "Chat's reasoning (text before </think>; gpt-oss: its analysis channel) as message.reasoning_content: deepseek, "
     "none, or auto (deepseek when the chat template writes <think>; gpt-oss's harmony split but with none)",
     &ServeConfig::reasoning_format},
    {"server.pooling", "--pooling",
     "/v1/embeddings' pooling of the prompt's final-norm hidden states: mean, cls, last, or auto (the file's "
     "<arch>.pooling_type, else last)",
     &ServeConfig::pooling},
    {"server.max_stored_responses", "--max-stored-responses",
     "Responses API: stored responses (store: true) kept at most, the oldest evicted first (0 = none stored); "
     "conversations (the Conversations API) too, apart",
     &ServeConfig::max_stored_responses, 0, 1 << 24},
    {"server.max_stored_bytes", "--max-stored-bytes",
     "Responses API: bytes of stored responses at most (their JSON text and a fixed cost an item), the oldest evicted "
     "first; of conversations too, apart",
     &ServeConfig::max_stored_bytes, 0, double(int64_t(1) << 40)},
    {"server.context_length", "-c,--ctx", "Context length (0 = the model's)", &ServeConfig::context_length, 0,
     double(kMaxContextLength)},
    {"parallel_config.tp_size", "--tp",
     "Tensor-parallel ranks: start under `mpirun -n TP` (heads and FFN split across the ranks)",
     &ServeConfig::tp_size, 1, 1 << 16},
    {"parallel_config.pp_size", "--pp",
     "Pipeline-parallel stages: start under `mpirun -n TP*PP` (contiguous layers per stage)", &ServeConfig::pp_size, 1,
     1 << 16},
    {"scheduler.prefill_chunk_size", "", "", &ServeConfig::prefill_chunk_size, 0, double(kMaxBatchTokens), /*takes_auto=*/true},
    {"scheduler.step_latency_target_ms", "", "", &ServeConfig::step_latency_target_ms, 0.1, 1e6},
    {"scheduler.max_num_seqs", "", "", &ServeConfig::max_num_seqs, 1, 4096},
    {"scheduler.max_batch_tokens", "", "", &ServeConfig::max_batch_tokens, 2, double(kMaxBatchTokens)},
    {"scheduler.max_auto_chunk", "--max-auto-chunk",
     "Auto mode's largest prefill chunk, what a prompt alone runs in (the most efficient size: 1024 on a Zen 5, "
     "256-512 on a Xeon with a 2 MB L2)",
     &ServeConfig::max_auto_chunk, SchedulerConfig{}.min_chunk, double(kMaxBatchTokens)},
    {"scheduler.ttft_slo_base_ms", "--ttft-slo-base",
     "Default TTFT deadline (ms) of a request naming no ttft_slo_ms: this plus --ttft-slo-stretch x its predicted "
     "prefill alone",
     &ServeConfig::ttft_slo_base_ms, 0, 1e7},
    {"scheduler.ttft_slo_stretch", "--ttft-slo-stretch", "See --ttft-slo-base", &ServeConfig::ttft_slo_stretch, 0,
     1e4},
    {"scheduler.reject_late_factor", "--reject-late",
     "Answer 429 + Retry-After at once to a request whose predicted TTFT exceeds FACTOR x its deadline (0 = off)",
     &ServeConfig::reject_late_factor, 0, 1e6},
    {"scheduler.max_active_adapters", "--max-active-adapters",
     "Distinct LoRA adapters running at once (0 = adapters off); requests of another wait for a slot",
     &ServeConfig::max_active_adapters, 0, 1 << 10},
    {"scheduler.max_loaded_adapters", "--max-loaded-adapters",
     "LoRA adapters loaded at once (--lora, the config's adapters and POST /v1/load_lora_adapter); one more is refused",
     &ServeConfig::max_loaded_adapters, 1, 1 << 16},
    {"kv_cache.memory_mib", "--kv-memory", "KV cache MiB (0 = 4 full contexts, at most 2 GiB)",
     &ServeConfig::kv_memory_mib, 0, 1 << 24},
    {"kv_cache.block_size", "", "", &ServeConfig::kv_block_size, 16, 4096},
    {"kv_cache.dtype", "--kv-type", "KV cache element type: f16, bf16, q8_0 or f32", &ServeConfig::kv_type},
    {"kv_cache.prefix_caching", "", "", &ServeConfig::prefix_caching},
    {"scheduler.enable_speculative_decoding", "", "", &ServeConfig::enable_speculative_decoding},
    {"speculative.method", "", "", &ServeConfig::spec_method},
    // Their flags (--spec, --draft-model, --spec-k) are shared with run and bench (tools/spec_flags.cpp).
    {"speculative.draft_model", "", "", &ServeConfig::draft_model},
    {"speculative.num_speculative_tokens", "", "", &ServeConfig::num_speculative_tokens, 1, kMaxSpecTokens,
     /*takes_auto=*/true},
    {"speculative.prompt_lookup_min", "", "", &ServeConfig::prompt_lookup_min, 1, 64},
    {"speculative.prompt_lookup_max", "", "", &ServeConfig::prompt_lookup_max, 1, 64},
};

// Keys of features not built yet: accepted at the value that means "not used", else refused.
bool apply_unbuilt(const std::string& key, const json& v) {
  if (key == "parallel_config.optimize_for_latency") {
    if (!as_bool(v, key)) fail("config: '", key, "': a throughput-optimised mode is not supported yet (set it to true)");
  } else {
    return false;
  }
  return true;
}

void apply_setting(const ServeSetting& s, const json& v, ServeConfig& c) {
  const std::string key = s.key;
  std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(c.*m)>;
        if constexpr (std::is_same_v<T, bool>) {
          c.*m = as_bool(v, key);
        } else if constexpr (std::is_same_v<T, std::string>) {
          c.*m = as_str(v, key);
        } else if constexpr (std::is_same_v<T, double>) {
          c.*m = as_num(v, key, s.lo, s.hi);
        } else if (s.takes_auto && v.is_string()) {
          if (v != "auto") fail("config: '", key, "' must be \"auto\" or an integer >= ", int64_t(s.lo));
          c.*m = T(-1);
        } else {
          c.*m = T(as_int(v, key, int64_t(s.lo), int64_t(s.hi)));
        }
      },
      s.field);
}

}  // namespace

std::span<const ServeSetting> serve_settings() { return kSettings; }

void check_range(const ServeSetting& s, const ServeConfig& c, const std::string& name) {
  std::visit(
      [&](auto m) {
        using T = std::remove_cvref_t<decltype(c.*m)>;
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
          const double x = double(c.*m);
          if (s.takes_auto && x == -1) return;
          if (x >= s.lo && x <= s.hi) return;
          if constexpr (std::is_integral_v<T>)  // as as_int/as_num say ("1073741824", not "1.07374e+09")
            fail(name, " must be in [", int64_t(s.lo), ", ", int64_t(s.hi), "], got ", c.*m);
          else
            fail(name, " must be in [", s.lo, ", ", s.hi, "], got ", c.*m);
        }
      },
      s.field);
}

void apply_config_json(const json& doc, ServeConfig& c) {
  if (!doc.is_object()) fail("config: the top level must be a JSON object");
  for (const auto& [section, body] : doc.items()) {
    if (section == "adapters") {
      if (!body.is_array()) fail("config: 'adapters' must be an array of {\"name\", \"path\"} objects");
      for (size_t i = 0; i < body.size(); ++i) {
        const json& e = body[i];
        const std::string at = cat("adapters[", i, "]");
        if (!e.is_object()) fail("config: '", at, "' must be an object {\"name\", \"path\"}");
        for (const auto& [k, v] : e.items())
          if (k != "name" && k != "path") fail("config: unknown key '", at, ".", k, "' (name, path)");
        if (!e.contains("name") || !e.contains("path")) fail("config: '", at, "' needs \"name\" and \"path\"");
        const std::string name = as_str(e["name"], at + ".name"), path = as_str(e["path"], at + ".path");
        if (name.empty() || path.empty()) fail("config: '", at, "': name and path must not be empty");
        c.adapters.emplace_back(name, path);
      }
      continue;
    }
    if (section != "scheduler" && section != "parallel_config" && section != "server" && section != "kv_cache" &&
        section != "speculative")
      fail("config: unknown key '", section,
           "' (sections: scheduler, parallel_config, server, kv_cache, speculative, adapters)");
    if (!body.is_object()) fail("config: '", section, "' must be an object");
    for (const auto& [k, v] : body.items()) {
      const std::string key = section + "." + k;
      if (apply_unbuilt(key, v)) continue;
      const ServeSetting* s = nullptr;
      for (const ServeSetting& x : kSettings)
        if (key == x.key) s = &x;
      if (!s) fail("config: unknown key '", key, "'");
      apply_setting(*s, v, c);
      try {  // names: checked here, so the error names the key
        if (s->field == ServeSetting::Field(&ServeConfig::kv_type)) parse_kv_type(c.kv_type);
        if (s->field == ServeSetting::Field(&ServeConfig::spec_method) && parse_spec_method(c.spec_method) == SpecMethod::Off)
          fail("'off' is not a method (scheduler.enable_speculative_decoding: false turns it off)");
      } catch (const Error& e) {
        fail("config: '", key, "': ", e.what());
      }
    }
  }
  try {
    check_parallel(c);
  } catch (const Error& e) {
    fail("config: 'parallel_config': ", e.what());
  }
}

void check_parallel(const ServeConfig& c) {
  if (c.tp_size > 1 && !c.adapters.empty())
    fail("LoRA adapters with tensor parallelism (tp_size ", c.tp_size, ") are not supported yet");
  if (c.pp_size > 1 && !c.adapters.empty())
    fail("LoRA adapters with pipeline parallelism (pp_size ", c.pp_size, ") are not supported yet");
}

void check_deadlines(const ServeConfig& c) {
  if (c.ttft_slo_base_ms == 0 && c.ttft_slo_stretch == 0 && c.reject_late_factor > 0)
    fail("scheduler.ttft_slo_base_ms (--ttft-slo-base) and scheduler.ttft_slo_stretch (--ttft-slo-stretch) are both 0 "
         "with --reject-late: a request that gives no ttft_slo_ms would have a 0 ms deadline and be refused; set "
         "either above 0");
}

std::string read_text_file(const std::string& path, std::string_view what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, ": cannot open the ", what);
  std::string text;
  char buf[1 << 16];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {  // in pieces, so an endless file stops at the limit
    if (int64_t(text.size()) + f.gcount() > kMaxTextFileBytes)
      fail(path, ": the ", what, " is larger than ", kMaxTextFileBytes >> 20, " MiB");
    text.append(buf, size_t(f.gcount()));
  }
  if (f.bad()) fail(path, ": cannot read the ", what);
  return text;
}

void apply_config_file(const std::string& path, ServeConfig& cfg) {
  const json doc = parse_json_file_text(read_text_file(path, "config file"), path);
  try {
    apply_config_json(doc, cfg);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

EngineConfig to_engine_config(const ServeConfig& c) {
  EngineConfig e;
  e.runtime.threads = c.threads;
  e.runtime.mlock = c.mlock;
  e.runtime.n_ctx = c.context_length;
  e.runtime.kv_block_size = c.kv_block_size;
  e.runtime.kv_type = parse_kv_type(c.kv_type);
  e.scheduler.chunk_size = c.prefill_chunk_size;
  e.scheduler.step_latency_target_ms = c.step_latency_target_ms;
  e.scheduler.max_num_seqs = c.max_num_seqs;
  e.scheduler.max_batch_tokens = c.max_batch_tokens;
  e.scheduler.max_auto_chunk = c.max_auto_chunk;
  e.scheduler.ttft_slo_base_ms = c.ttft_slo_base_ms;
  e.scheduler.ttft_slo_stretch = c.ttft_slo_stretch;
  e.scheduler.reject_late_factor = c.reject_late_factor;
  e.scheduler.max_active_adapters = int32_t(c.max_active_adapters);
  e.scheduler.max_loaded_adapters = int32_t(c.max_loaded_adapters);
  e.kv_memory_bytes = c.kv_memory_mib << 20;
  e.prefix_caching = c.prefix_caching;
  e.spec = to_spec_config(c);
  return e;
}

std::pair<std::string, std::string> parse_lora_flag(const std::string& s) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    fail("--lora '", s, "': expected NAME=FILE (the name clients send as \"model\", the adapter GGUF)");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

std::vector<std::string> parse_served_names(const std::string& s) {
  std::vector<std::string> names;
  for (size_t at = 0;;) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string name = s.substr(at, comma - at);
    name.erase(0, std::min(name.find_first_not_of(' '), name.size()));  // "a, b": the names a and b
    name.erase(std::min(name.find_last_not_of(' ') + 1, name.size()));
    if (name.empty()) fail("--served-model-name '", s, "': an empty name (expected NAME[,ALIAS...])");
    if (std::find(names.begin(), names.end(), name) != names.end())
      fail("--served-model-name '", s, "': '", name, "' given twice");
    names.push_back(name);
    if (comma == s.size()) return names;
    at = comma + 1;
  }
}

SpecConfig to_spec_config(const ServeConfig& c) {
  SpecConfig s;
  if (!c.enable_speculative_decoding) return s;
  s.method = parse_spec_method(c.spec_method);
  s.draft_model = c.draft_model;
  if (c.num_speculative_tokens < 0) {
    s.k_auto = true;
  } else {
    s.k = int32_t(c.num_speculative_tokens);
  }
  s.ngram_min = int32_t(c.prompt_lookup_min);
  s.ngram_max = int32_t(c.prompt_lookup_max);
  try {
    s.validate();
  } catch (const Error& e) {
    fail("config: speculative: ", e.what());
  }
  return s;
}

}  // namespace ft::server
