// `firsttoken perplexity`: perplexity of a model over a text file, in windows of -c tokens as the
// reference implementation's perplexity tool does it (each window starts with BOS and scores its
// second half, so every scored token sees at least c/2 tokens of context), and with --kl-base the
// KL divergence, top-1 agreement and perplexity change against a saved run (--save-logits), e.g.
// the same model with another KV cache type.
//
// Logits file (little-endian): "FTLOGPR1", u32 n_vocab, u32 n_ctx, u64 n_scored, then per scored
// position its target token (i32) and the log-softmax of its logits (n_vocab f32).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "tools/commands.h"

namespace ft::tools {

namespace {

constexpr char kMagic[8] = {'F', 'T', 'L', 'O', 'G', 'P', 'R', '1'};

struct LogitsHeader {
  uint32_t n_vocab = 0, n_ctx = 0;
  uint64_t n_scored = 0;
};

// x (n,) -> log-softmax in place (in double for the sum).
void log_softmax(float* x, int64_t n) {
  const float mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i] - mx));
  const float lse = mx + float(std::log(sum));
  for (int64_t i = 0; i < n; ++i) x[i] -= lse;
}

}  // namespace

void add_perplexity(CLI::App& app, PerplexityArgs& a) {
  CLI::App* c = app.add_subcommand("perplexity", "Perplexity over a text file; KL divergence against a saved run");
  c->add_option("-m,--model", a.model, "GGUF model file")->required();
  c->add_option("-f,--file", a.file, "Text file")->required();
  c->add_option("-c,--ctx", a.ctx, "Tokens per window (0 = min(512, the model's context))")->capture_default_str();
  c->add_option("--chunks", a.max_windows, "At most this many windows (0 = all)")->capture_default_str();
  c->add_option("-t,--threads", a.threads, "Threads (0 = all cores)")->capture_default_str();
  add_rope_flags(c, a.rope);
  c->add_option("--kv-type", a.kv_type, "KV cache element type: f16, bf16, q8_0 or f32")->capture_default_str();
  auto* save = c->add_option("--save-logits", a.save_logits, "Write every scored position's log-probabilities to FILE");
  c->add_option("--kl-base", a.kl_base, "Compare with a --save-logits FILE: KL divergence, top-1 agreement")
      ->excludes(save);
}

int cmd_perplexity(const PerplexityArgs& a) {
  check_flag("-t/--threads", a.threads, 0, server::kMaxThreads);
  check_flag("-c/--ctx", a.ctx, 0, server::kMaxContextLength);
  check_flag("--chunks", a.max_windows, 0, std::numeric_limits<int64_t>::max());
  const auto model = Model::load(a.model, a.rope);
  const HParams& hp = model->hparams();
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  std::ifstream in(a.file, std::ios::binary);
  if (!in) fail(a.file, ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int32_t> tokens = tok.encode(ss.str(), /*add_bos=*/false, /*parse_special=*/false);
  const int64_t C = a.ctx > 0 ? a.ctx : std::min<int64_t>(512, hp.ctx_len);
  if (C < 2) fail("perplexity: -c must be at least 2");
  int64_t n_windows = int64_t(tokens.size()) / C;
  if (a.max_windows > 0) n_windows = std::min(n_windows, a.max_windows);
  if (n_windows < 1) fail(a.file, ": ", tokens.size(), " tokens, fewer than one window of ", C);
  const int32_t bos = tok.bos();
  const int64_t first = C / 2;  // scored: predictions of tokens first+1 .. C-1 of each window
  const int64_t V = hp.n_vocab;

  RuntimeConfig rt;
  rt.kv_type = parse_kv_type(a.kv_type);
  auto be = make_backend(rt.backend, resolve_threads(a.threads));
  Forward fwd(*model, *be, C);
  KVCache kv(kv_cache_config(rt, hp, KVCache::blocks_for(C, rt.kv_block_size), false));
  std::fprintf(stderr, "perplexity: %zu tokens, %lld windows of %lld, KV cache %s\n", tokens.size(),
               (long long)n_windows, (long long)C, kv.summary().c_str());

  const uint64_t n_scored = uint64_t(n_windows) * uint64_t(C - 1 - first);
  std::ofstream save;
  std::ifstream base;
  if (!a.save_logits.empty()) {
    save.open(a.save_logits, std::ios::binary);
    if (!save) fail(a.save_logits, ": cannot write");
    const LogitsHeader h{uint32_t(V), uint32_t(C), n_scored};
    save.write(kMagic, 8);
    save.write(reinterpret_cast<const char*>(&h), sizeof h);
  }
  if (!a.kl_base.empty()) {
    base.open(a.kl_base, std::ios::binary);
    char magic[8];
    LogitsHeader h;
    if (!base.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0 || !base.read(reinterpret_cast<char*>(&h), sizeof h))
      fail(a.kl_base, ": not a --save-logits file");
    if (h.n_vocab != uint32_t(V) || h.n_ctx != uint32_t(C) || h.n_scored != n_scored)
      fail(a.kl_base, ": saved with ", h.n_vocab, " vocab, windows of ", h.n_ctx, ", ", h.n_scored,
           " scored positions; this run has ", V, ", ", C, ", ", n_scored);
  }

  std::vector<float> logits(size_t((C - first) * V)), base_lp(static_cast<size_t>(V));
  double nll = 0, base_nll = 0, kl_sum = 0, kl_max = 0;
  uint64_t top1_same = 0, scored = 0;
  Batch b;
  for (int64_t w = 0; w < n_windows; ++w) {
    kv.release(0);
    if (!kv.reserve(0, C)) fail("perplexity: KV cache too small");
    b.clear();
    for (int64_t i = 0; i < C; ++i) {
      int32_t t = tokens[size_t(w * C + i)];
      if (i == 0 && bos >= 0) t = bos;
      b.add(t, int32_t(i), 0, i >= first && i < C - 1);
    }
    fwd.run(b, kv, logits.data());
    for (int64_t i = first; i < C - 1; ++i) {
      float* lp = logits.data() + (i - first) * V;
      log_softmax(lp, V);
      const int32_t target = tokens[size_t(w * C + i + 1)];
      nll -= lp[target];
      ++scored;
      if (save.is_open()) {
        save.write(reinterpret_cast<const char*>(&target), sizeof target);
        save.write(reinterpret_cast<const char*>(lp), std::streamsize(V * int64_t(sizeof(float))));
      }
      if (base.is_open()) {
        int32_t base_target;
        base.read(reinterpret_cast<char*>(&base_target), sizeof base_target);
        base.read(reinterpret_cast<char*>(base_lp.data()), std::streamsize(V * int64_t(sizeof(float))));
        if (!base || base_target != target) fail(a.kl_base, ": saved from another text (position ", scored, ")");
        double kl = 0;
        for (int64_t v = 0; v < V; ++v) kl += std::exp(double(base_lp[size_t(v)])) * (double(base_lp[size_t(v)]) - lp[v]);
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        base_nll -= base_lp[size_t(target)];
        top1_same += (std::max_element(lp, lp + V) - lp) == (std::max_element(base_lp.begin(), base_lp.end()) - base_lp.begin());
      }
    }
  }
  const double ppl = std::exp(nll / double(scored));
  std::printf("perplexity: %.4f over %llu scored tokens (%lld windows of %lld, KV cache %s)\n", ppl,
              (unsigned long long)scored, (long long)n_windows, (long long)C,
              std::string(kv_type_name(rt.kv_type)).c_str());
  if (base.is_open()) {
    const double base_ppl = std::exp(base_nll / double(scored));
    std::printf("vs %s: mean KL %.6f nats, max KL %.6f, top-1 agreement %.2f%%, perplexity %.4f -> %.4f (%+.3f%%)\n",
                a.kl_base.c_str(), kl_sum / double(scored), kl_max, 100.0 * double(top1_same) / double(scored),
                base_ppl, ppl, 100.0 * (ppl / base_ppl - 1));
  }
  return 0;
}

}  // namespace ft::tools
