// `firsttoken serve`: the OpenAI-compatible HTTP server (src/server) over the serving engine.
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "model/synthetic.h"
#include "profile/trace.h"
#include "server/config.h"
#include "server/server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace ft::tools {

void add_serve(CLI::App& app, ServeArgs& a) {
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, ...)");
  a.cmd = c;
  c->add_option("-m,--model", a.model, "GGUF model file (default: a built-in synthetic 'tiny' model, random weights)");
  c->add_option("--host", a.host, "Address to listen on (default 127.0.0.1)");
  c->add_option("--port", a.port, "Port (default 8000; 0 = any free port, printed at start)");
  c->add_option("--config", a.config, "JSON config file (CLI flags override it)");
  c->add_option("-t,--threads", a.threads, "Engine compute threads (default 0 = all cores)");
  c->add_option("--http-threads", a.http_threads, "HTTP I/O worker threads (default 2)");
  c->add_option("--max-queue", a.max_queue, "Requests waiting for their first token before 429 (default 256)");
  c->add_option("--log-level", a.log_level, "trace, debug, info, warn, error, critical, off (default info)");
  c->add_option("--kv-memory", a.kv_memory_mib, "KV cache MiB (default: 4 full contexts, at most 2 GiB)");
  c->add_option("-c,--ctx", a.ctx, "Context length (default: the model's)");
  c->add_option("--shutdown-timeout", a.shutdown_timeout_s, "Seconds in-flight requests get on SIGINT/SIGTERM (default 10)");
  c->add_option("--served-model-name", a.served_model_name, "Model id clients send (default: the file's stem)");
  c->add_option("--binary-port", a.binary_port, "Port of the binary protocol (FlatBuffers frames; default 0 = off)");
  c->add_flag("--binary-port-any", a.binary_port_any, "Serve the binary protocol on any free port (printed at start)");
  c->add_option("--profile", a.profile, "Write a Chrome/Perfetto trace to FILE at shutdown (see `firsttoken profile FILE`)");
}

int cmd_serve(const ServeArgs& a) {
  server::ServeConfig cfg;
  if (!a.config.empty()) server::apply_config_file(a.config, cfg);
  auto given = [&](const char* name) { return a.cmd && a.cmd->count(name) > 0; };
  if (given("--model")) cfg.model = a.model;
  if (given("--host")) cfg.host = a.host;
  if (given("--port")) cfg.port = a.port;
  if (given("--threads")) cfg.threads = a.threads;
  if (given("--http-threads")) cfg.http_threads = a.http_threads;
  if (given("--max-queue")) cfg.max_queue = a.max_queue;
  if (given("--log-level")) cfg.log_level = a.log_level;
  if (given("--kv-memory")) cfg.kv_memory_mib = a.kv_memory_mib;
  if (given("--ctx")) cfg.context_length = a.ctx;
  if (given("--shutdown-timeout")) cfg.shutdown_timeout_s = a.shutdown_timeout_s;
  if (given("--served-model-name")) cfg.served_model_name = a.served_model_name;
  if (given("--binary-port")) cfg.binary_port = a.binary_port;
  if (given("--binary-port-any")) cfg.binary_port_any = a.binary_port_any;
  if (cfg.port < 0 || cfg.port > 65535) fail("--port must be in [0, 65535], got ", cfg.port);
  if (cfg.binary_port < 0 || cfg.binary_port > 65535) fail("--binary-port must be in [0, 65535], got ", cfg.binary_port);
  if (cfg.http_threads < 1) fail("--http-threads must be at least 1");
  if (cfg.max_queue < 0) fail("--max-queue must be >= 0");
  if (cfg.shutdown_timeout_s < 0) fail("--shutdown-timeout must be >= 0");
  const auto level = spdlog::level::from_str(cfg.log_level);
  if (level == spdlog::level::off && cfg.log_level != "off")
    fail("unknown log level '", cfg.log_level, "' (trace, debug, info, warn, error, critical, off)");

  // Async logging: the I/O and engine threads never wait on stderr.
  spdlog::init_thread_pool(8192, 1);
  auto logger = std::make_shared<spdlog::async_logger>(
      "firsttoken", std::make_shared<spdlog::sinks::stderr_sink_mt>(), spdlog::thread_pool(),
      spdlog::async_overflow_policy::block);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  struct LogGuard {
    ~LogGuard() { spdlog::shutdown(); }
  } log_guard;

  std::unique_ptr<Model> model;
  std::string id = cfg.served_model_name;
  const bool tty = isatty(STDERR_FILENO);
  if (cfg.model.empty()) {
    // A built-in model so `serve` runs out of the box: random weights, byte-level vocabulary.
    const auto path = std::filesystem::temp_directory_path() /
                      ("firsttoken-serve-tiny-" + std::to_string(getpid()) + ".gguf");
    SyntheticOptions opt;
    opt.shape = "tiny";
    write_synthetic_model(opt, path.string(), [tty](float f) {
      if (tty) std::fprintf(stderr, "\rwriting the built-in model... %3.0f%%", double(f) * 100);
    });
    if (tty) std::fprintf(stderr, "\n");
    model = Model::load(path.string());
    std::filesystem::remove(path);  // mapped: the data stays until exit
    if (id.empty()) id = "tiny";
    spdlog::warn("no -m given: serving the built-in synthetic 'tiny' model (random weights: its text is noise)");
  } else {
    if (tty) std::fprintf(stderr, "loading %s...\n", cfg.model.c_str());
    model = Model::load(cfg.model);
    if (id.empty()) id = std::filesystem::path(cfg.model).stem().string();
  }
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  server::ServedModel served;
  served.model = model.get();
  served.tokenizer = &tok;
  served.id = id;
  served.chat_format = detect_chat_format(model->file().get_str("tokenizer.chat_template", ""));

  if (!a.profile.empty()) profile::start(a.profile);  // before the engine: its backend gets wrapped
  EngineConfig ecfg = server::to_engine_config(cfg);
  if (tty) std::fprintf(stderr, "starting the engine (calibrating the cost model)...\n");
  Engine engine(*model, ecfg, [&tok](int32_t t) { return tok.is_eog(t); });
  spdlog::info("kernels: {} (this CPU runs {}; FT_ISA forces a lower one)", cpu_isa(),
               cpu_isas().back());
  server::Server srv(engine, served, cfg);
  const int rc = srv.run();  // returns after the engine has shut down
  if (profile::enabled()) {
    profile::stop();
    const size_t n = profile::write();
    spdlog::info("profile: {} events written to {} (summary: firsttoken profile {})", n, a.profile, a.profile);
  }
  return rc;
}

}  // namespace ft::tools
