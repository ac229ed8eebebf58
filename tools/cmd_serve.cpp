// `firsttoken serve`: the OpenAI-compatible HTTP server (src/server) over the serving engine.
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/tensor_parallel.h"
#include "parallel/comm.h"
#include "kernels/kernels.h"
#include "model/lora.h"
#include "model/synthetic.h"
#include "profile/trace.h"
#include "server/config.h"
#include "server/generation.h"
#include "server/server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace ft::tools {

namespace {

// The served model: cfg.model, or a built-in one so `serve` runs out of the box (random weights,
// byte-level vocabulary; deterministic: every tensor-parallel rank writes the same).
std::unique_ptr<Model> load_served_model(const server::ServeConfig& cfg, bool progress) {
  if (!cfg.model.empty()) {
    if (progress) std::fprintf(stderr, "loading %s...\n", cfg.model.c_str());
    return Model::load(cfg.model, cfg.rope);
  }
  const auto path = std::filesystem::temp_directory_path() /
                    ("firsttoken-serve-tiny-" + std::to_string(getpid()) + ".gguf");
  SyntheticOptions opt;
  opt.shape = "tiny";
  write_synthetic_model(opt, path.string(), [progress](float f) {
    if (progress) std::fprintf(stderr, "\rwriting the built-in model... %3.0f%%", double(f) * 100);
  });
  if (progress) std::fprintf(stderr, "\n");
  std::unique_ptr<Model> model = Model::load(path.string());
  std::filesystem::remove(path);  // mapped: the data stays until exit
  return model;
}

// Start-up agreement of a tensor-parallel group: every rank runs fn (load, shard) and stops with
// its own error, or "another rank failed", unless all succeeded.
template <class F>
void tp_agree(Communicator& tp, F&& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (!tp.all_ok(err.empty())) {
    // Each rank says its error before any exits: mpirun ends the others at the first non-zero exit.
    if (!err.empty()) say_error(err);
    tp.all_ok(false);  // (a barrier: every rank has printed)
    fail(err.empty() ? cat("rank ", tp.rank(), " of ", tp.size(), ": another rank failed to start (its error says why)")
                     : std::string("tensor parallelism: start-up failed (the error above)"));
  }
}

// A worker rank of `serve --tp N`: its shard of the model, then rank 0's steps until it stops.
// SIGINT/SIGTERM are rank 0's to handle: it drains its requests, then stops the workers.
int serve_tp_worker(const server::ServeConfig& cfg, Communicator& tp) {
  std::unique_ptr<Model> model;
  tp_agree(tp, [&] {
    model = load_served_model(cfg, false);
    split_model(*model, tp);
  });
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  const EngineConfig e = server::to_engine_config(cfg);
  tp.or_abort([&] { run_tp_worker(*model, e.runtime, tp); });
  return 0;
}

int serve(const ServeArgs& a, const server::ServeConfig& cfg, std::unique_ptr<Model> model, const std::string& id,
          bool tty, Communicator* tp);

}  // namespace

void add_serve(CLI::App& app, ServeArgs& a) {
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, ...)");
  c->add_option("--config", a.config, "JSON config file (CLI flags override it)");
  for (const server::ServeSetting& s : server::serve_settings()) {
    if (!*s.flags) continue;
    CLI::Option* o = std::visit(
        [&](auto m) {
          auto& field = a.flags.*m;
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(field)>, bool>)
            return c->add_flag(s.flags, field, s.help);
          else
            return c->add_option(s.flags, field, s.help)->capture_default_str();
        },
        s.field);
    a.given.emplace_back(&s, o);
  }
  c->add_option("--lora", a.lora,
                "LoRA adapter NAME=FILE (repeatable): clients pick it with \"model\": NAME (config: adapters)");
  c->add_option("--profile", a.profile, "Write a Chrome/Perfetto trace to FILE at shutdown (see `firsttoken profile FILE`)");
  add_spec_flags(c, a.spec);
  add_rope_flags(c, a.rope);
}

int cmd_serve(const ServeArgs& a) {
  server::ServeConfig cfg;
  if (!a.config.empty()) server::apply_config_file(a.config, cfg);
  for (const auto& [s, o] : a.given) {
    if (o->count() == 0) continue;
    std::visit([&](auto m) { cfg.*m = a.flags.*m; }, s->field);
    server::check_range(*s, cfg, o->get_name());
  }
  apply_spec_flags(a.spec, cfg);
  cfg.rope = a.rope;
  for (const std::string& l : a.lora) cfg.adapters.push_back(server::parse_lora_flag(l));
  server::check_parallel(cfg);
  server::check_deadlines(cfg);
  const auto level = spdlog::level::from_str(cfg.log_level);
  if (level == spdlog::level::off && cfg.log_level != "off")
    fail("unknown log level '", cfg.log_level, "' (trace, debug, info, warn, error, critical, off)");
  // Tensor parallelism: the MPI group first (each rank checks the same settings and world size,
  // and says the same error). Rank 0 serves; the others run the steps it sends.
  const std::unique_ptr<Communicator> tp = Communicator::start(cfg.tp_size, cfg.pp_size);
  if (tp && tp->rank() != 0) return serve_tp_worker(cfg, *tp);

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

  std::string id = cfg.served_model_name;
  const bool tty = isatty(STDERR_FILENO);
  std::unique_ptr<Model> model;
  if (!tp) model = load_served_model(cfg, tty);
  if (id.empty()) id = cfg.model.empty() ? "tiny" : std::filesystem::path(cfg.model).stem().string();
  if (cfg.model.empty())
    spdlog::warn("no -m given: serving the built-in synthetic 'tiny' model (random weights: its text is noise)");
  if (tp) {
    tp_agree(*tp, [&] {
      model = load_served_model(cfg, false);
      split_model(*model, *tp);
    });
    spdlog::info("parallelism: rank 0 of {} (MPI): tp {} x pp {}; per rank {} heads, {} KV heads, FFN {}; stage 0 "
                 "runs layers [0, {})",
                 tp->size(), tp->tp_size(), tp->pp_size(), model->hparams().n_heads, model->hparams().n_kv_heads,
                 model->hparams().ffn_dim, model->hparams().n_layers);
    // From here on, an error on rank 0 would leave the workers waiting: it ends them all.
    return tp->or_abort([&] { return serve(a, cfg, std::move(model), id, tty, tp.get()); });
  }
  return serve(a, cfg, std::move(model), id, tty, nullptr);
}

namespace {
int serve(const ServeArgs& a, const server::ServeConfig& cfg, std::unique_ptr<Model> model, const std::string& id,
          bool tty, Communicator* tp) {
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  server::ServedModel served;
  served.model = model.get();
  served.tokenizer = &tok;
  // (a file's stem is one name, commas and all)
  const std::vector<std::string> names = cfg.served_model_name.empty() ? std::vector<std::string>{id} : server::parse_served_names(id);
  served.id = names.front();
  served.aliases.assign(names.begin() + 1, names.end());
  std::string warning;
  const std::string template_source =
      cfg.chat_template_file.empty() ? model->file().get_str("tokenizer.chat_template", "") : server::read_text_file(cfg.chat_template_file, "chat template file");
  served.chat = ChatTemplate::for_model(tok, template_source, std::nullopt, warning);
  if (served.chat.is_jinja()) served.chat_template_source = template_source;
  if (!cfg.chat_template_file.empty() && !served.chat.is_jinja())
    fail(cfg.chat_template_file, ": not a chat template this server can run: ", warning);
  if (!warning.empty()) spdlog::warn("{}", warning);
  spdlog::info("chat template: {}{}", served.chat.describe(), cfg.chat_template_file.empty() ? "" : " (" + cfg.chat_template_file + ")");
  // Reasoning: R1-style <think>...</think> split off into reasoning_content; open at the output's
  // start where the template's generation turn ends with <think> (a probe conversation shows it).
  if (cfg.reasoning_format != "auto" && cfg.reasoning_format != "deepseek" && cfg.reasoning_format != "none")
    fail("--reasoning-format must be auto, deepseek or none, got '", cfg.reasoning_format, "'");
  served.reasoning = cfg.reasoning_format == "deepseek" ||
                     (cfg.reasoning_format == "auto" && served.chat.is_jinja() && template_source.find("think>") != std::string::npos);
  // gpt-oss: its harmony channels, not <think>: analysis is the reasoning (but with none).
  served.harmony = served.chat.harmony();
  if (served.harmony) {
    served.reasoning = cfg.reasoning_format != "none";
    spdlog::info("gpt-oss harmony format: {}", served.reasoning ? "the analysis channel goes to reasoning_content, final to content, "
                                                                  "commentary to=functions.* to tool calls"
                                                                : "raw output in content (--reasoning-format none; tool calls still found)");
  } else if (served.reasoning) {
    bool opens = false;  // (for the log: each request's own prompt decides)
    try {
      opens = server::ends_in_reasoning(served.chat.render({{"user", "x"}}, nullptr, true));
    } catch (const Error&) {
    }
    spdlog::info("reasoning: text before </think> goes to reasoning_content{}",
                 opens ? " (the template opens <think> for the model)" : "");
  }

  served.pooling = server::resolve_pooling(cfg.pooling, *model);
  if (served.pooling == Pooling::Cls && tok.add_bos_default())
    spdlog::warn("embeddings pool the first position (cls) of a causal model whose prompts start with BOS: every "
                 "input gets the same vector (--pooling last or mean)");

  if (!a.profile.empty()) profile::start(a.profile);  // before the engine: its backend gets wrapped
  EngineConfig ecfg = server::to_engine_config(cfg);
  ecfg.tp = tp;
  std::unique_ptr<Model> draft;
  if (ecfg.spec.method == SpecMethod::Draft) {
    draft = load_draft_model(ecfg.spec.draft_model, *model, cfg.rope);
    ecfg.draft_model = draft.get();
  }
  if (ecfg.spec.enabled())
    spdlog::info("speculative decoding: {}{}, k = {}{}", spec_method_name(ecfg.spec.method),
                 ecfg.spec.method == SpecMethod::Draft ? " (" + ecfg.spec.draft_model + ")" : std::string(),
                 ecfg.spec.k_auto ? "auto, at most " : "", ecfg.spec.k);
  if (tty) std::fprintf(stderr, "starting the engine (calibrating the cost model)...\n");
  Engine engine(*model, ecfg, [&tok](int32_t t) { return tok.is_eog(t); });
  spdlog::info("kernels: {} (this CPU runs {}; FT_ISA forces a lower one)", cpu_isa(),
               cpu_isas().back());
  spdlog::info("{}", engine.kv_summary());
  if (const std::string w = engine.context_warning(); !w.empty()) spdlog::warn("{}", w);
  if (const std::string& w = engine.weights_summary(); !w.empty()) {
    if (w.starts_with("warning")) spdlog::warn("{}", w);
    else spdlog::info("{}", w);
  }
  for (const auto& [name, path] : cfg.adapters) {
    if (name == served.id || std::find(served.aliases.begin(), served.aliases.end(), name) != served.aliases.end())
      fail("LoRA adapter '", name, "': a name of the base model");
    const auto ad = engine.load_adapter(name, path);
    spdlog::info("LoRA adapter '{}': {} (rank {}, {} weights adapted, scale {:.3g})", name, path, ad->rank(),
                 ad->n_adapted(), ad->scale());
  }
  server::Server srv(engine, served, cfg);
  const int rc = srv.run();  // returns after the engine has shut down
  const EngineMetrics em = engine.metrics();
  spdlog::info("cost model: {} steps, mean |predicted - measured| / measured forward time {:.1f}%; learned "
               "base {:.3f} ms + {:.4f} ms/token + {:.3g} ms/attention pair",
               em.step_time_error.count, 100 * em.step_time_error.mean(), em.cost.base_ms, em.cost.per_token_ms,
               em.cost.per_attn_ms);
  if (tp) {  // the communication's share of the steps (rank 0's; the calibration's forwards included)
    const CommStats& st = tp->stats();
    const double steps = double(std::max<uint64_t>(st.steps, 1));
    spdlog::info("parallelism: {} allreduces ({:.1f} MiB) in {:.1f} ms, step broadcasts {:.1f} ms, {} pipeline "
                 "transfers ({:.1f} MiB) in {:.1f} ms: {:.3f} ms of communication per step over {} steps",
                 st.allreduces, double(st.allreduce_bytes) / double(1 << 20), double(st.allreduce_ns) / 1e6,
                 double(st.broadcast_ns) / 1e6, st.transfers, double(st.transfer_bytes) / double(1 << 20),
                 double(st.transfer_ns) / 1e6, double(st.total_ns()) / 1e6 / steps, st.steps);
  }
  if (profile::enabled()) {
    profile::stop();
    const size_t n = profile::write();
    spdlog::info("profile: {} events written to {} (summary: firsttoken profile {})", n, a.profile, a.profile);
  }
  return rc;
}

}  // namespace

}  // namespace ft::tools
