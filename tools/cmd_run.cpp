// `firsttoken run`: one prompt, streamed continuation on stdout, timings on stderr.
#include <chrono>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "profile/trace.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace ft::tools {

void add_run(CLI::App& app, RunArgs& a) {
  CLI::App* c = app.add_subcommand("run", "Generate a continuation of a prompt (streams to stdout)");
  c->add_option("-m,--model", a.model, "GGUF model file")->required();
  c->add_option("-p,--prompt", a.prompt, "Prompt text (with --chat: the user message)")->required();
  c->add_option("-n,--n-predict", a.n_predict, "Maximum tokens to generate")->capture_default_str();
  c->add_option("--temp", a.temperature, "Temperature; 0 = greedy")->capture_default_str();
  c->add_option("--top-k", a.top_k, "Top-k (0 = off)")->capture_default_str();
  c->add_option("--top-p", a.top_p, "Top-p (1 = off)")->capture_default_str();
  c->add_option("--min-p", a.min_p, "Min-p (0 = off)")->capture_default_str();
  c->add_option("--repeat-penalty", a.repeat_penalty, "Repetition penalty (1 = off)")->capture_default_str();
  c->add_option("--presence-penalty", a.presence_penalty, "Presence penalty")->capture_default_str();
  c->add_option("--frequency-penalty", a.frequency_penalty, "Frequency penalty")->capture_default_str();
  c->add_option("--seed", a.seed, "Random seed (default: random)")->each([&a](const std::string&) { a.seed_set = true; });
  c->add_option("-t,--threads", a.threads, "Threads (0 = all cores)")->capture_default_str();
  c->add_option("-c,--ctx", a.ctx, "Context length (0 = the model's)")->capture_default_str();
  c->add_option("-b,--batch", a.batch, "Prompt tokens per forward pass")->capture_default_str();
  c->add_flag("--chat", a.chat, "Wrap the prompt in the model's chat template");
  c->add_option("--system", a.system, "System message (with --chat)");
  c->add_option("--chat-format", a.chat_format,
                "Override the chat format: llama2, llama3, chatml, mistral, zephyr");
  c->add_flag("--ignore-eos", a.ignore_eos, "Keep generating past end-of-generation tokens");
  c->add_option("--profile", a.profile, "Write a Chrome/Perfetto trace to FILE (see `firsttoken profile FILE`)");
}

int cmd_run(const RunArgs& a) {
  using clock = std::chrono::steady_clock;
  if (!a.profile.empty()) profile::start(a.profile);
  const auto t_load = clock::now();
  const auto model = Model::load(a.model);
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  const double load_ms = std::chrono::duration<double, std::milli>(clock::now() - t_load).count();

  const auto t_tok = clock::now();
  const int64_t p_tok = profile::enabled() ? profile::now_ns() : 0;
  std::vector<int32_t> prompt;
  if (a.chat) {
    ChatFormat fmt;
    if (!a.chat_format.empty()) {
      const auto f = parse_chat_format(a.chat_format);
      if (!f) fail("unknown chat format '", a.chat_format, "' (llama2, llama3, chatml, mistral, zephyr)");
      fmt = *f;
    } else {
      fmt = detect_chat_format(model->file().get_str("tokenizer.chat_template", ""));
    }
    std::vector<ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", a.prompt});
    const std::string bos = tok.bos() >= 0 ? tok.token_text(tok.bos()) : "";
    const std::string eos = tok.eos() >= 0 ? tok.token_text(tok.eos()) : "";
    prompt = tok.encode(render_chat(fmt, msgs, true, bos, eos), /*add_bos=*/false, /*parse_special=*/true);
  } else {
    prompt = tok.encode(a.prompt, tok.add_bos_default(), /*parse_special=*/true);
  }
  const double tokenize_ms = std::chrono::duration<double, std::milli>(clock::now() - t_tok).count();
  const int64_t p_tok_end = profile::enabled() ? profile::now_ns() : 0;

  // One request through the serving engine: prompt chunks of --batch tokens, then decode.
  const int64_t n_ctx = a.ctx > 0 ? a.ctx : model->hparams().ctx_len;
  const int64_t n_prompt = int64_t(prompt.size());
  if (n_prompt >= n_ctx)
    fail("the prompt has ", n_prompt, " tokens but the context holds ", n_ctx,
         " (the prompt and at least one generated token must fit; see --ctx)");
  if (a.batch < 1) fail("--batch must be at least 1");
  EngineConfig cfg;
  cfg.runtime.threads = a.threads;
  cfg.runtime.n_ctx = n_ctx;
  cfg.scheduler.chunk_size = a.batch;
  cfg.scheduler.max_num_seqs = 1;
  cfg.scheduler.max_batch_tokens = a.batch + 1;
  cfg.kv_memory_bytes = uint64_t(KVCache::blocks_for(n_ctx, cfg.runtime.kv_block_size)) *
                        KVCache::block_bytes(model->hparams().n_layers, model->hparams().kv_dim(),
                                             cfg.runtime.kv_block_size);
  cfg.prefix_caching = false;
  cfg.calibrate = false;

  EngineRequest req;
  req.prompt = prompt;
  req.max_tokens = std::min<int64_t>(a.n_predict, n_ctx - n_prompt);  // stop at a full context
  req.ignore_eos = a.ignore_eos;
  req.tokenize_ms = tokenize_ms;
  req.sampling.temperature = a.temperature;
  req.sampling.top_k = a.top_k;
  req.sampling.top_p = a.top_p;
  req.sampling.min_p = a.min_p;
  req.sampling.repetition_penalty = a.repeat_penalty;
  req.sampling.presence_penalty = a.presence_penalty;
  req.sampling.frequency_penalty = a.frequency_penalty;
  req.sampling.seed = a.seed_set ? a.seed : std::random_device{}();
  if (req.max_tokens < 1) fail("-n must be at least 1");

  Engine engine(*model, cfg, [&tok](int32_t t) { return tok.is_eog(t); });
  EventStream events;
  const uint64_t id = engine.submit(std::move(req), events.callback());
  profile::complete("tokenize", "request", p_tok, p_tok_end,
                    profile::Args().i("req", int64_t(id)).i("tokens", n_prompt).i("chars", int64_t(a.prompt.size())));
  StreamDecoder out(tok);
  EngineEvent ev;
  RequestTimings t;
  int64_t n_gen = 0;
  FinishReason why = FinishReason::Length;
  while (events.next(ev, &t)) {
    if (ev.kind == EngineEvent::Kind::Token) {
      if (!tok.is_eog(ev.token) || a.ignore_eos) {
        const std::string piece = out.push(ev.token);
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
    } else {
      n_gen = ev.n_generated;
      why = ev.reason;
    }
  }
  const std::string rest = out.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fflush(stdout);

  std::fprintf(stderr,
               "\n[firsttoken] load %.1f ms | prompt %lld tokens, tokenize %.2f ms | TTFT %.2f ms | "
               "prefill %.1f tokens/s | decode %lld tokens, %.1f tokens/s | kernels %s | finish: %s\n",
               load_ms, (long long)n_prompt, tokenize_ms, t.ttft_ms(),
               t.prefill_ms() > 0 ? double(n_prompt) / t.prefill_ms() * 1e3 : 0.0, (long long)n_gen,
               n_gen > 1 && t.decode_ms() > 0 ? double(n_gen - 1) / t.decode_ms() * 1e3 : 0.0,
               std::string(cpu_isa()).c_str(), finish_reason_name(why));
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
