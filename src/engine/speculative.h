// Speculative decoding: a cheap drafter proposes the next k tokens of a decoding request, the
// target model scores all of them in one forward pass (the request's pending token and its k
// drafts are k+1 batch entries, each with a logits row, beside the other requests' decodes and
// prefill chunks), and Sampler::verify keeps the longest prefix the target agrees with plus one
// token of its own: it samples each position's token with that position's random number (a
// function of the seed and the position, Sampler::uniform_at) and accepts the draft iff it is
// that token, so the output is the very tokens of a run without speculation (sampled or greedy,
// however many drafts a step verifies), and every accepted draft cost no decode step of its own.
//
// Drafters:
//  - ngram (prompt lookup, no model): the longest suffix of the request's tokens (prompt and
//    output so far), n from ngram_max down to ngram_min, that occurred before; the tokens that
//    followed its most recent earlier occurrence are the draft.
//  - draft: a small model sharing the target's vocabulary (engine.h's DraftModelRunner) with its
//    own paged KV cache, sampling with the request's temperature and filters (no penalties) and
//    the request's per-position random numbers (Sampler::seek), so it agrees with the target
//    wherever their distributions do.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ft {

enum class SpecMethod { Off, Ngram, Draft };
const char* spec_method_name(SpecMethod m);
SpecMethod parse_spec_method(const std::string& s);  // "off" | "ngram" | "draft"; ft::Error otherwise

inline constexpr int32_t kMaxSpecTokens = 16;  // k at most (a request's logits rows per step: k+1)

struct SpecConfig {
  SpecMethod method = SpecMethod::Off;
  int32_t k = 4;            // draft tokens per verification (the most, with k_auto)
  bool k_auto = false;      // adapt k per request to its running acceptance rate (auto_spec_k)
  int32_t ngram_min = 1;    // prompt-lookup n-gram sizes (vLLM's prompt_lookup_min/max)
  int32_t ngram_max = 4;
  std::string draft_model;  // GGUF path (method Draft)
  bool enabled() const { return method != SpecMethod::Off; }
  void validate() const;    // ft::Error naming the field
};

// Prompt lookup: up to k tokens that followed the most recent earlier occurrence of the longest
// suffix n-gram (n in [n_min, n_max]) of `tokens`. Empty when none occurs.
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int32_t k, int32_t n_min, int32_t n_max);

// k for the next verification of a request whose drafts have been accepted at the running rate
// `alpha` (per draft token), when scoring one more position costs `rel_cost` of a whole decode
// step: the k in [1, k_max] maximising expected tokens per step over predicted step cost,
// (1 - alpha^(k+1)) / (1 - alpha) / (1 + rel_cost k) (tokens are accepted in order, each with
// probability alpha). 0 when even k = 1 does not pay (no drafts: a plain decode).
int32_t auto_spec_k(double alpha, double rel_cost, int32_t k_max);

// Per-request speculation state: the running acceptance rate (EWMA, weight per verification) and
// the counts the log line and metrics report.
struct SpecStats {
  int64_t drafts = 0;           // verifications with at least one draft token
  int64_t draft_tokens = 0;     // draft tokens scored
  int64_t accepted_tokens = 0;  // of those, accepted
  double alpha = 0.8;           // running acceptance rate per draft token (prior: optimistic)
  void observe(int64_t proposed, int64_t accepted);
};

}  // namespace ft
