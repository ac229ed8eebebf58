#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/error.h"

namespace ft {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "?";
}

Generator::Generator(const Model& model, const RuntimeConfig& cfg, std::function<bool(int32_t)> is_eog)
    : model_(model), is_eog_(std::move(is_eog)) {
  const HParams& hp = model.hparams();
  n_ctx_ = cfg.n_ctx > 0 ? cfg.n_ctx : hp.ctx_len;
  if (cfg.max_batch <= 0) fail("max batch must be positive, got ", cfg.max_batch);
  max_batch_ = std::min<int64_t>(cfg.max_batch, n_ctx_);
  backend_ = make_backend(cfg.backend, resolve_threads(cfg.threads));
  forward_ = std::make_unique<Forward>(model, *backend_, max_batch_);
  KVCacheConfig kc;
  kc.n_layers = hp.n_layers;
  kc.kv_dim = hp.kv_dim();
  kc.block_size = cfg.kv_block_size;
  kc.n_blocks = KVCache::blocks_for(n_ctx_, cfg.kv_block_size);
  kv_ = std::make_unique<KVCache>(kc);
  logits_.resize(size_t(hp.n_vocab));
}

Generator::~Generator() = default;

GenerateResult Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                                   const std::function<bool(int32_t)>& on_token) {
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t) {
    return std::chrono::duration<double, std::milli>(clock::now() - t).count();
  };
  const int64_t n = int64_t(prompt.size());
  if (n == 0) fail("the prompt is empty");
  if (n >= n_ctx_)
    fail("the prompt has ", n, " tokens but the context holds ", n_ctx_,
         " (prompt + at least one generated token)");
  const int32_t n_vocab = model_.hparams().n_vocab;
  for (int32_t t : prompt)
    if (t < 0 || t >= n_vocab) fail("prompt token id ", t, " out of range [0, ", n_vocab, ")");

  constexpr int32_t kSeq = 0;
  kv_->release(kSeq);
  const int64_t max_total = std::min<int64_t>(n_ctx_, n + std::max<int64_t>(opt.max_tokens, 0));
  if (!kv_->reserve(kSeq, max_total)) fail("KV cache too small for ", max_total, " positions");

  GenerateResult res;
  res.n_prompt = n;
  Sampler sampler(opt.sampling, n_vocab);
  sampler.add_prompt(prompt);
  const auto t0 = clock::now();
  Batch batch;
  for (int64_t s = 0; s < n; s += max_batch_) {
    batch.clear();
    const int64_t e = std::min(n, s + max_batch_);
    for (int64_t i = s; i < e; ++i) batch.add(prompt[size_t(i)], int32_t(i), kSeq, i == n - 1);
    forward_->run(batch, *kv_, logits_.data());
  }
  res.prefill_ms = ms_since(t0);

  res.finish = FinishReason::Length;
  int64_t pos = n;
  clock::time_point t_first;
  while (int64_t(res.tokens.size()) < opt.max_tokens) {
    const int32_t tok = sampler.sample(logits_.data());
    sampler.accept(tok);
    res.tokens.push_back(tok);
    if (res.tokens.size() == 1) {
      res.ttft_ms = ms_since(t0);
      t_first = clock::now();
    }
    const bool eog = !opt.ignore_eos && is_eog_ && is_eog_(tok);
    if (!on_token(tok)) {
      res.finish = FinishReason::Cancelled;
      break;
    }
    if (eog) {
      res.finish = FinishReason::Stop;
      break;
    }
    if (int64_t(res.tokens.size()) >= opt.max_tokens || pos >= max_total) break;
    batch.clear();
    batch.add(tok, int32_t(pos), kSeq, true);
    forward_->run(batch, *kv_, logits_.data());
    ++pos;
  }
  if (!res.tokens.empty()) res.decode_ms = ms_since(t_first);
  kv_->release(kSeq);
  return res;
}

}  // namespace ft
