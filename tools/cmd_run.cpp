// `firsttoken run`: one prompt, streamed continuation on stdout, timings on stderr.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "profile/trace.h"
#include "server/generation.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace ft::tools {

void add_run(CLI::App& app, RunArgs& a) {
  CLI::App* c = app.add_subcommand("run", "Generate a continuation of a prompt (streams to stdout)");
  c->add_option("-m,--model", a.model, "GGUF model file")->required();
  c->add_option("-p,--prompt", a.prompt, "Prompt text (with --chat: the user message)")->required();
  c->add_option("-n,--n-predict", a.n_predict, "Maximum tokens to generate")->capture_default_str();
  SamplingParams& s = a.sampling;
  c->add_option("--temp", s.temperature, "Temperature; 0 = greedy")->capture_default_str();
  c->add_option("--top-k", s.top_k, "Top-k (0 = off)")->capture_default_str();
  c->add_option("--top-p", s.top_p, "Top-p (1 = off)")->capture_default_str();
  c->add_option("--min-p", s.min_p, "Min-p (0 = off)")->capture_default_str();
  c->add_option("--typical", s.typical_p, "Locally typical sampling, p (1 = off)")->capture_default_str();
  c->add_option("--dynatemp-range", s.dynatemp_range, "Dynamic temperature range (0 = off)")->capture_default_str();
  c->add_option("--dynatemp-exp", s.dynatemp_exponent, "Dynamic temperature exponent")->capture_default_str();
  c->add_option("--mirostat", s.mirostat, "Mirostat 1 or 2 (0 = off; replaces top-k/top-p/min-p/typical)")->capture_default_str();
  c->add_option("--mirostat-ent", s.mirostat_tau, "Mirostat target entropy (tau)")->capture_default_str();
  c->add_option("--mirostat-lr", s.mirostat_eta, "Mirostat learning rate (eta)")->capture_default_str();
  c->add_option("--min-keep", s.min_keep, "Tokens top-p, min-p and typical keep at least")->capture_default_str();
  c->add_option("--repeat-last-n", s.penalty_last_n, "Repetition penalty window (0 = off, -1 = all)")->capture_default_str();
  c->add_option("--repeat-penalty", s.repetition_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  c->add_option("--presence-penalty", s.presence_penalty, "Presence penalty")->capture_default_str();
  c->add_option("--frequency-penalty", s.frequency_penalty, "Frequency penalty")->capture_default_str();
  c->add_option("--seed", s.seed, "Random seed (default: random)")->each([&a](const std::string&) { a.seed_set = true; });
  c->add_option("-t,--threads", a.threads, "Threads (0 = all cores)")->capture_default_str();
  c->add_option("-c,--ctx", a.ctx, "Context length (0 = the model's)")->capture_default_str();
  c->add_option("-b,--batch", a.batch, "Prompt tokens per forward pass")->capture_default_str();
  c->add_option("--kv-type", a.kv_type, "KV cache element type: f16, bf16, q8_0 or f32")->capture_default_str();
  c->add_flag("--mlock", a.mlock, "Pin the weights in RAM (mlock; a refusal is a warning)");
  c->add_flag("--chat", a.chat, "Wrap the prompt in the model's chat template");
  c->add_option("--system", a.system, "System message (with --chat)");
  c->add_option("--chat-format", a.chat_format,
                "Override the chat format: " + chat_format_names());
  c->add_flag("--ignore-eos", a.ignore_eos, "Keep generating past end-of-generation tokens");
  c->add_option("--lora", a.lora, "LoRA adapter GGUF (llama.cpp's adapter format) to run under");
  c->add_option("--profile", a.profile, "Write a Chrome/Perfetto trace to FILE (see `firsttoken profile FILE`)");
  add_spec_flags(c, a.spec);
  add_rope_flags(c, a.rope);
}

namespace {

// Streams the continuation to stdout; keeps the finish for the timings line.
class StdoutSink : public server::GenerationSink {
 public:
  void on_output(server::Output&& o) override { write(o.text); }
  void on_finish(server::Output&& last, const server::Finish& f) override {
    write(last.text);
    finish = f;
    if (f.timings) timings = *f.timings;
    done = true;
  }
  void on_error(const server::ApiError& e, const server::Usage&) override {
    error = e.what();
    done = true;
  }
  server::Finish finish;
  RequestTimings timings;
  std::string error;
  bool done = false;

 private:
  static void write(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  }
};

// Runs what the engine's callback posts on the thread that calls run_one().
class Inbox {
 public:
  server::Post poster() {
    return [this](std::function<void()> f) {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(f));
      cv_.notify_one();
    };
  }
  void run_one() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return !q_.empty(); });
    std::function<void()> f = std::move(q_.front());
    q_.pop_front();
    lk.unlock();
    f();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
};

}  // namespace

int cmd_run(const RunArgs& a) {
  using clock = std::chrono::steady_clock;
  check_flag("-t/--threads", a.threads, 0, server::kMaxThreads);
  check_flag("-c/--ctx", a.ctx, 0, server::kMaxContextLength);
  check_flag("-b/--batch", a.batch, 1, server::kMaxBatchTokens);
  check_flag("-n/--n-predict", a.n_predict, 1, std::numeric_limits<int64_t>::max());  // (past the context: cut to it)
  if (!a.profile.empty()) profile::start(a.profile);
  const auto t_load = clock::now();
  const auto model = Model::load(a.model, a.rope);
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - t_load).count();

  std::optional<ChatFormat> forced;
  if (!a.chat_format.empty()) {
    forced = parse_chat_format(a.chat_format);
    if (!forced) fail("unknown chat format '", a.chat_format, "' (", chat_format_names(), ")");
  }
  std::string warning;
  const ChatTemplate chat = a.chat ? ChatTemplate::for_model(tok, model->file().get_str("tokenizer.chat_template", ""), forced, warning)
                                   : ChatTemplate();
  if (!warning.empty()) std::fprintf(stderr, "[firsttoken] warning: %s\n", warning.c_str());

  // One request through the serving engine: prompt chunks of --batch tokens, then decode.
  EngineConfig cfg = single_request_config(*model, a.ctx, a.batch, a.threads, parse_kv_type(a.kv_type));
  cfg.runtime.mlock = a.mlock;
  cfg.spec = spec_from_flags(a.spec);
  std::unique_ptr<Model> draft;
  if (cfg.spec.method == SpecMethod::Draft) {
    draft = load_draft_model(cfg.spec.draft_model, *model, a.rope);
    cfg.draft_model = draft.get();
  }

  server::GenerationRequest req;
  if (a.chat) {
    req.prompt_kind = server::PromptKind::Chat;
    if (!a.system.empty()) req.messages.push_back({"system", a.system});
    req.messages.push_back({"user", a.prompt});
  } else {
    req.prompt_text = a.prompt;
  }
  req.max_tokens = a.n_predict;
  req.fit_max_tokens = true;  // stop at a full context
  req.ignore_eos = a.ignore_eos;
  req.sampling = a.sampling;
  req.seed_set = a.seed_set;

  Inbox inbox;  // outlives the engine, whose callback posts to it
  Engine engine(*model, cfg, [&tok](int32_t t) { return tok.is_eog(t); });
  std::fprintf(stderr, "[firsttoken] %s\n", engine.kv_summary().c_str());
  if (const std::string w = engine.context_warning(); !w.empty()) std::fprintf(stderr, "[firsttoken] warning: %s\n", w.c_str());
  if (!engine.weights_summary().empty()) std::fprintf(stderr, "[firsttoken] %s\n", engine.weights_summary().c_str());
  if (!a.lora.empty()) {
    engine.load_adapter("lora", a.lora);
    req.adapter = "lora";
  }
  const server::GenerationContext ctx(engine, tok, chat);
  auto out = std::make_shared<StdoutSink>();
  std::shared_ptr<server::Generation> gen;
  try {
    gen = server::Generation::start(ctx, tok, std::move(req), out, inbox.poster());
  } catch (const server::ApiError& e) {
    fail(e.what());
  }
  while (!out->done) inbox.run_one();
  if (!out->error.empty()) fail(out->error);

  const RequestTimings& t = out->timings;
  const int64_t n_prompt = gen->n_prompt(), n_gen = out->finish.usage.completion_tokens;
  std::fprintf(stderr,
               "\n[firsttoken] load %.1f ms | prompt %lld tokens, tokenize %.2f ms | TTFT %.2f ms | "
               "prefill %.1f tokens/s | decode %lld tokens, %.1f tokens/s | kernels %s | finish: %s\n",
               load_ms, (long long)n_prompt, t.tokenize_ms, t.ttft_ms(),
               t.prefill_ms() > 0 ? double(n_prompt) / t.prefill_ms() * 1e3 : 0.0, (long long)n_gen,
               n_gen > 1 && t.decode_ms() > 0 ? double(n_gen - 1) / t.decode_ms() * 1e3 : 0.0,
               std::string(cpu_isa()).c_str(), out->finish.reason.c_str());
  if (cfg.spec.enabled()) {
    const SpecStats& s = t.spec;
    std::fprintf(stderr, "[firsttoken] speculative %s: %lld verifications, %lld of %lld draft tokens accepted (%.1f%%), %.2f tokens per verification\n",
                 spec_method_name(cfg.spec.method), (long long)s.drafts, (long long)s.accepted_tokens, (long long)s.draft_tokens,
                 s.draft_tokens ? 100.0 * double(s.accepted_tokens) / double(s.draft_tokens) : 0.0,
                 s.drafts ? 1.0 + double(s.accepted_tokens) / double(s.drafts) : 0.0);
  }
  if (profile::enabled()) {
    engine.shutdown();  // its thread's last spans are published before the file is written
    profile::stop();
    const size_t n = profile::write();
    std::fprintf(stderr, "[firsttoken] profile: %zu events written to %s (summary: firsttoken profile %s)\n", n,
                 a.profile.c_str(), a.profile.c_str());
  }
  return 0;
}

}  // namespace ft::tools
