// Token sampling from a logits row.
//
// Pipeline of Sampler::sample (logits are never modified; the work happens in scratch buffers
// allocated once by the constructor):
//   1. penalties: repetition (llama.cpp/CTRL style, over the last penalty_last_n tokens of
//      prompt + generated, each distinct token once: logit > 0 ? logit/rp : logit*rp), then
//      presence/frequency (OpenAI: logit -= count*frequency + (count > 0)*presence, counts over
//      all generated tokens);
//   2. temperature <= 0: greedy argmax (ties -> lowest id), no randomness consumed;
//   3. top_k; 4. softmax at the temperature; 5. top_p (smallest prefix of the probability-sorted
//      candidates whose mass reaches top_p); 6. min_p (keep p >= min_p * p_max);
//   7. one draw from the kept candidates with u in [0,1): the top 53 bits of a hash of (`seed`,
//      the position: how many tokens this sampler has drawn before, sample() and verify() alike).
//      u is a function of the seed and the position alone, not of a running stream, so a
//      request's i-th token gets the same u however its tokens were batched or how many drafts
//      were verified at a time; all orderings break ties by token id, so the same seed + logits
//      give the same tokens on every machine.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace ft {

struct SamplingParams {
  float temperature = 0.8f;         // <= 0 means greedy (argmax; ties -> lowest id)
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off (keep tokens with p >= min_p * p_max)
  float repetition_penalty = 1.0f;  // 1 = off; over prompt+generated, last penalty_last_n tokens
  float presence_penalty = 0.0f;    // OpenAI semantics, over generated tokens only
  float frequency_penalty = 0.0f;   // OpenAI semantics, over generated tokens only
  int penalty_last_n = 64;          // window of the repetition penalty; 0 = off, -1 = all history
  uint64_t seed = 0xF1257;          // same seed + same logits -> same choices
  // llama.cpp's samplers, each on the tempered distribution as top_p and min_p are here:
  float typical_p = 1.0f;           // 1 = off; locally typical sampling (Meister et al. 2022)
  float dynatemp_range = 0.0f;      // 0 = off; temperature in [t - range, t + range] by the entropy
  float dynatemp_exponent = 1.0f;   //   (normalised entropy ^ exponent)
  int mirostat = 0;                 // 0 = off, 1 or 2 (Basu et al. 2021): replaces top_k/top_p/min_p/typical_p
  float mirostat_tau = 5.0f;        //   target surprise, bits
  float mirostat_eta = 0.1f;        //   learning rate
  int min_keep = 0;                 // top_p, min_p and typical_p keep at least this many (0: 1)
  bool operator==(const SamplingParams&) const = default;
};

// What a request gets for the sampling it does not set, per front end (one line each).
inline constexpr SamplingParams kCliSampling{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f};
inline constexpr SamplingParams kOpenAISampling{.temperature = 1.0f};
// The binary protocol's (proto/firsttoken.fbs leaves its Sampling fields optional: absent = these).
inline constexpr SamplingParams kBinarySampling{.temperature = 1.0f, .seed = 0};

// A sampled token's log-probability and its best alternatives (best first), when requested.
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
  int32_t rank = 0;  // 1 + how many tokens have a higher logit (vLLM's rank); 0: not computed
};

// Validates ranges (temperature >= 0 and finite, top_p and typical_p in (0,1], min_p in [0,1],
// top_k >= 0, penalties finite, repetition_penalty > 0, penalty_last_n >= -1, mirostat 0-2 with
// tau and eta finite and >= 0, dynatemp range and exponent finite and >= 0, min_keep >= 0);
// throws ft::Error naming the field and the value otherwise.
void validate(const SamplingParams& p);

class Sampler {
 public:
  // Validates p; n_vocab > 0.
  Sampler(const SamplingParams& p, int n_vocab);

  // Appends prompt tokens to the history seen by the repetition penalty.
  void add_prompt(std::span<const int32_t> prompt);
  // Picks the next token from logits[0..n_vocab). Does not record it: call accept().
  // Throws ft::Error when no logit is finite (NaN/-inf everywhere). probs (n_vocab, optional):
  // receives the normalised distribution the token was drawn from (greedy: one-hot on it), what
  // a draft model's proposal must carry to verify().
  int32_t sample(const float* logits, float* probs = nullptr);
  // Speculative decoding's verification of a drafted token: samples this position's token as
  // sample() would (the same u, so the very token a run without speculation draws) and accepts
  // draft iff it is that token. The output is the non-speculative output itself, token for token,
  // whatever drafted (n-gram or a draft model) and however many drafts a step verifies; a draft
  // is accepted with probability p(draft) given the drafter's choice (a draft model drawing with
  // the same u, seek(), agrees with the target where their distributions do). Greedy: accepted
  // iff draft is the argmax, which is returned either way. Does not record the token: call accept().
  int32_t verify(const float* logits, int32_t draft, bool& accepted);
  // The position of the next draw (draws so far, sample() and verify() alike), and moving it: a
  // draft model's sampler, which does not accept() its drafts, draws draft i of a request at the
  // position the target's sampler will verify it at.
  uint64_t position() const { return position_; }
  void seek(uint64_t position) { position_ = position; }
  // The u of draw `position` for `seed`: [0, 1), the top 53 bits of a 64-bit hash.
  static double uniform_at(uint64_t seed, uint64_t position);
  // Records a generated token (repetition history and presence/frequency counts).
  void accept(int32_t token);
  // Whether sample() carries state from one token to the next beyond accept()'s (mirostat's
  // surprise target): such a sampler draws every token itself, so it is not given drafts to verify.
  bool stateful() const { return params_.mirostat != 0; }
  float mirostat_mu() const { return mu_; }

  const SamplingParams& params() const { return params_; }
  int n_vocab() const { return n_vocab_; }

 private:
  void check_token(int32_t token) const;
  // Steps 1-6 of the pipeline: the kept candidates cand_[0, n) with unnormalised probabilities
  // prob_[0, n) of total `sum` (greedy: the argmax alone). Returns n.
  size_t distribution(const float* logits, double& sum);
  // prob_[i] = exp((logits[cand_[i]] - max_logit) / temperature), i < n (all_in_order: cand_
  // is every token in id order).
  void exp_of_candidates(const float* logits, size_t n, float max_logit, bool all_in_order);
  double sum_of_probs(size_t n) const;   // Σ prob_[0, n), in double
  // Steps of distribution() over cand_/prob_[0, n) of total sum; each returns the new n.
  void dynamic_temperature(const float* logits, size_t n, float max_logit, bool all_in_order);
  size_t typical(const float* logits, size_t n, double& sum);
  size_t mirostat(const float* logits, size_t n, double& sum, float max_logit, bool sorted);
  // The best k candidates by logit, in order, with their probabilities (k <= n).
  void sort_prefix(const float* logits, size_t k, size_t n, float max_logit);
  size_t draw(size_t n, double sum, double u);  // step 7 over cand_/prob_: the index drawn
  void write_probs(size_t n, double sum, float* probs) const;

  SamplingParams params_;
  int n_vocab_;
  uint64_t position_ = 0;           // draws so far: the next draw's u is uniform_at(seed, position_)
  std::vector<int32_t> history_;    // prompt + generated, for the repetition penalty
  std::vector<int32_t> counts_;     // per token: times generated
  std::vector<int32_t> generated_;  // distinct generated tokens, in first-seen order
  // Scratch, n_vocab each, allocated once.
  std::vector<float> work_;       // penalised logits
  std::vector<uint8_t> seen_;     // marks tokens already penalised in the repetition window
  std::vector<int32_t> cand_;     // candidate token ids
  std::vector<float> prob_;       // unnormalised probabilities, indexed like cand_
  struct Typical {                // typical_p's candidates: |surprise - entropy|, id, probability
    double score;
    int32_t id;
    float prob;
  };
  std::vector<Typical> typical_;  // (scratch)
  float temperature_ = 0;         // this token's (dynatemp moves it)
  float mu_ = 0;                  // mirostat: the surprise bound, 2 tau at first
};

}  // namespace ft
