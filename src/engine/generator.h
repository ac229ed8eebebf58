// Single-request generation: prefill the prompt (in chunks of max_batch tokens), then decode one
// token at a time, streaming each token to a callback. The serving engine (continuous batching)
// builds on the same Forward/KVCache pieces.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/runtime_config.h"
#include "engine/sampler.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace ft {

enum class FinishReason { Stop /* end-of-generation token */, Length /* max tokens or context */, Cancelled };
const char* finish_reason_name(FinishReason r);

struct GenerateOptions {
  int64_t max_tokens = 128;
  SamplingParams sampling;
  bool ignore_eos = false;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated (including a final end-of-generation token, if any)
  FinishReason finish = FinishReason::Length;
  int64_t n_prompt = 0;
  double prefill_ms = 0;  // prompt forward passes
  double ttft_ms = 0;     // start of prefill to first token sampled
  double decode_ms = 0;   // after the first token
};

class Generator {
 public:
  // is_eog: which tokens end generation (from the tokenizer); may be empty.
  Generator(const Model& model, const RuntimeConfig& cfg, std::function<bool(int32_t)> is_eog = {});
  ~Generator();
  int64_t n_ctx() const { return n_ctx_; }
  // on_token returns false to stop (FinishReason::Cancelled). Throws ft::Error when the prompt is
  // empty, has out-of-range ids, or does not fit in the context.
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                          const std::function<bool(int32_t)>& on_token);

 private:
  const Model& model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Forward> forward_;
  std::unique_ptr<KVCache> kv_;
  std::function<bool(int32_t)> is_eog_;
  int64_t n_ctx_ = 0;
  int64_t max_batch_ = 0;
  std::vector<float> logits_;
};

}  // namespace ft
