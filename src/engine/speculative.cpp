#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ft {

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::Off: return "off";
    case SpecMethod::Ngram: return "ngram";
    case SpecMethod::Draft: return "draft";
  }
  return "?";
}

SpecMethod parse_spec_method(const std::string& s) {
  if (s == "off") return SpecMethod::Off;
  if (s == "ngram") return SpecMethod::Ngram;
  if (s == "draft") return SpecMethod::Draft;
  fail("unknown speculative decoding method '", s, "' (ngram, draft or off)");
}

void SpecConfig::validate() const {
  if (k < 1 || k > kMaxSpecTokens) fail("num_speculative_tokens must be in [1, ", kMaxSpecTokens, "], got ", k);
  if (ngram_min < 1 || ngram_max < ngram_min || ngram_max > 64)
    fail("prompt_lookup_min/max must satisfy 1 <= min <= max <= 64, got ", ngram_min, " and ", ngram_max);
  if (method == SpecMethod::Draft && draft_model.empty())
    fail("speculative method 'draft' needs a draft model (speculative.draft_model / --draft-model)");
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> t, int32_t k, int32_t n_min, int32_t n_max) {
  const int64_t L = int64_t(t.size());
  for (int64_t n = std::min<int64_t>(n_max, L - 1); n >= n_min; --n) {
    const int32_t* suffix = t.data() + (L - n);
    // Most recent earlier occurrence first: it starts at s < L - n.
    for (int64_t s = L - n - 1; s >= 0; --s) {
      if (!std::equal(suffix, suffix + n, t.data() + s)) continue;
      const int64_t from = s + n, to = std::min<int64_t>(from + k, L);
      return std::vector<int32_t>(t.begin() + from, t.begin() + to);
    }
  }
  return {};
}

int32_t auto_spec_k(double alpha, double rel_cost, int32_t k_max) {
  alpha = std::clamp(alpha, 0.0, 0.999);
  rel_cost = std::max(rel_cost, 0.0);
  double best = 1.0;  // no drafts: one token per step of cost 1
  int32_t best_k = 0;
  for (int32_t k = 1; k <= k_max; ++k) {
    const double tokens = (1 - std::pow(alpha, k + 1)) / (1 - alpha);
    const double v = tokens / (1 + rel_cost * k);
    if (v > best * (1 + 1e-9)) {
      best = v;
      best_k = k;
    }
  }
  return best_k;
}

void SpecStats::observe(int64_t proposed, int64_t accepted) {
  if (proposed <= 0) return;
  ++drafts;
  draft_tokens += proposed;
  accepted_tokens += accepted;
  // The per-token rate this verification shows: accepted tokens in order, the first rejection
  // (if any) ends it; an EWMA over verifications.
  const double rate = double(accepted) / double(accepted < proposed ? accepted + 1 : proposed);
  alpha = 0.8 * alpha + 0.2 * rate;
}

}  // namespace ft
