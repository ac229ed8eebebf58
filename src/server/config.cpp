#include "server/config.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

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

}  // namespace

void apply_config_json(const json& doc, ServeConfig& c) {
  if (!doc.is_object()) fail("config: the top level must be a JSON object");
  for (const auto& [section, body] : doc.items()) {
    if (section != "scheduler" && section != "parallel_config" && section != "server" && section != "kv_cache")
      fail("config: unknown key '", section, "' (sections: scheduler, parallel_config, server, kv_cache)");
    if (!body.is_object()) fail("config: '", section, "' must be an object");
    for (const auto& [k, v] : body.items()) {
      const std::string key = section + "." + k;
      if (section == "scheduler") {
        if (k == "prefill_chunk_size") {
          if (v.is_string()) {
            if (v != "auto") fail("config: '", key, "' must be \"auto\" or an integer >= 0");
            c.prefill_chunk_size = -1;
          } else {
            c.prefill_chunk_size = as_int(v, key, 0, 1 << 20);
          }
        } else if (k == "step_latency_target_ms") {
          c.step_latency_target_ms = as_num(v, key, 0.1, 1e6);
        } else if (k == "max_num_seqs") {
          c.max_num_seqs = int32_t(as_int(v, key, 1, 4096));
        } else if (k == "max_batch_tokens") {
          c.max_batch_tokens = as_int(v, key, 2, 1 << 20);
        } else if (k == "max_active_adapters") {
          // A cap on LoRA adapters per batch. No adapter can be loaded yet, so any cap holds
          // trivially; loading one (a future key/flag) will be the "not supported yet" error.
          as_int(v, key, 0, 1 << 20);
        } else if (k == "enable_speculative_decoding") {
          if (as_bool(v, key)) fail("config: '", key, "': speculative decoding is not supported yet (set it to false)");
        } else {
          fail("config: unknown key '", key, "'");
        }
      } else if (section == "parallel_config") {
        if (k == "tp_size" || k == "pp_size") {
          if (as_int(v, key, 1, 1 << 16) != 1)
            fail("config: '", key, "': ", k == "tp_size" ? "tensor" : "pipeline", " parallelism is not supported yet (set it to 1)");
        } else if (k == "optimize_for_latency") {
          if (!as_bool(v, key))
            fail("config: '", key, "': a throughput-optimised mode is not supported yet (set it to true)");
        } else {
          fail("config: unknown key '", key, "'");
        }
      } else if (section == "server") {
        if (k == "host") c.host = as_str(v, key);
        else if (k == "port") c.port = int(as_int(v, key, 0, 65535));
        else if (k == "binary_port") c.binary_port = int(as_int(v, key, 0, 65535));
        else if (k == "max_queue") c.max_queue = as_int(v, key, 0, 1 << 30);
        else if (k == "threads") c.threads = int(as_int(v, key, 0, 1024));
        else if (k == "http_threads") c.http_threads = int(as_int(v, key, 1, 256));
        else if (k == "max_body_bytes") c.max_body_bytes = uint64_t(as_int(v, key, 1024, int64_t(1) << 32));
        else if (k == "header_timeout_s") c.header_timeout_s = as_num(v, key, 0.01, 86400);
        else if (k == "body_timeout_s") c.body_timeout_s = as_num(v, key, 0.01, 86400);
        else if (k == "write_timeout_s") c.write_timeout_s = as_num(v, key, 0.01, 86400);
        else if (k == "shutdown_timeout_s") c.shutdown_timeout_s = as_num(v, key, 0, 86400);
        else if (k == "log_level") c.log_level = as_str(v, key);
        else if (k == "model") c.model = as_str(v, key);
        else if (k == "served_model_name") c.served_model_name = as_str(v, key);
        else if (k == "context_length") c.context_length = as_int(v, key, 0, 1 << 24);
        else fail("config: unknown key '", key, "'");
      } else {  // kv_cache
        if (k == "memory_mib") c.kv_memory_mib = uint64_t(as_int(v, key, 0, 1 << 24));
        else if (k == "block_size") c.kv_block_size = int32_t(as_int(v, key, 1, 4096));
        else if (k == "prefix_caching") c.prefix_caching = as_bool(v, key);
        else fail("config: unknown key '", key, "'");
      }
    }
  }
}

void apply_config_file(const std::string& path, ServeConfig& cfg) {
  std::ifstream f(path);
  if (!f) fail(path, ": cannot open the config file");
  std::stringstream ss;
  ss << f.rdbuf();
  const json doc = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) fail(path, ": not valid JSON");
  try {
    apply_config_json(doc, cfg);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

EngineConfig to_engine_config(const ServeConfig& c) {
  EngineConfig e;
  e.runtime.threads = c.threads;
  e.runtime.n_ctx = c.context_length;
  e.runtime.kv_block_size = c.kv_block_size;
  e.scheduler.chunk_size = c.prefill_chunk_size;
  e.scheduler.step_latency_target_ms = c.step_latency_target_ms;
  e.scheduler.max_num_seqs = c.max_num_seqs;
  e.scheduler.max_batch_tokens = c.max_batch_tokens;
  e.kv_memory_bytes = c.kv_memory_mib << 20;
  e.prefix_caching = c.prefix_caching;
  return e;
}

}  // namespace ft::server
