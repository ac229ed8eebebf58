#include "server/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "profile/trace.h"
#include "server/metrics.h"

namespace ft::server {

namespace {

using Clock = std::chrono::steady_clock;

const char* prompt_param(const GenerationRequest& r) {
  return r.embed ? "input" : r.prompt_kind == PromptKind::Chat ? "messages" : "prompt";
}

}  // namespace

int32_t check_token_id(int64_t id, int32_t n_vocab, const std::string& param) {
  if (id < 0 || id >= n_vocab) bad(param, cat("token id ", id, " is out of range [0, ", n_vocab, ")"));
  return int32_t(id);
}

void validate(const GenerationRequest& r, int32_t n_vocab) {
  const char* param = prompt_param(r);
  switch (r.prompt_kind) {
    case PromptKind::Text:  // "" is a document's start (OpenAI's): BOS alone, where the vocabulary adds one
      break;
    case PromptKind::Tokens:
      if (r.prompt_tokens.empty()) bad(param, cat("'", param, "' is empty"));
      for (const int32_t t : r.prompt_tokens) check_token_id(t, n_vocab, param);
      break;
    case PromptKind::Chat:
      if (r.messages.empty()) bad(param, "'messages' must be a non-empty array");
      break;
  }
  if (r.max_tokens && *r.max_tokens < 1) bad("max_tokens", cat("'max_tokens' must be at least 1, got ", *r.max_tokens));
  if (r.stop.size() > kMaxStops) bad("stop", cat("'stop' may hold at most ", kMaxStops, " strings"));
  size_t stop_bytes = 0, bad_bytes = 0;
  for (const auto& x : r.stop) {
    if (x.empty()) bad("stop", "stop strings must not be empty");
    stop_bytes += x.size();
  }
  if (stop_bytes > kMaxStopBytes) bad("stop", cat("stop strings of ", stop_bytes, " bytes in all: at most ", kMaxStopBytes));
  for (const auto& [t, b] : r.logit_bias) {
    check_token_id(t, n_vocab, "logit_bias");
    if (!std::isfinite(b)) bad("logit_bias", "'logit_bias' values must be finite");
  }
  for (const auto& e : r.logit_bias_text) {
    if (e.id >= 0) check_token_id(e.id, n_vocab, "logit_bias");
    if (!std::isfinite(e.bias)) bad("logit_bias", "'logit_bias' values must be finite");
  }
  for (const int32_t t : r.stop_token_ids) check_token_id(t, n_vocab, "stop_token_ids");
  for (const int32_t t : r.allowed_token_ids) check_token_id(t, n_vocab, "allowed_token_ids");
  if (r.bad_words.size() > kMaxBadWords) bad("bad_words", cat("'bad_words' may hold at most ", kMaxBadWords, " words"));
  for (const auto& w : r.bad_words) {
    if (w.empty()) bad("bad_words", "bad words must not be empty");
    bad_bytes += w.size();
  }
  if (bad_bytes > kMaxStopBytes) bad("bad_words", cat("bad words of ", bad_bytes, " bytes in all: at most ", kMaxStopBytes));
  if (r.min_tokens < 0) bad("min_tokens", cat("'min_tokens' must be >= 0, got ", r.min_tokens));
  if (r.max_tokens && r.min_tokens > *r.max_tokens)
    bad("min_tokens", cat("'min_tokens' (", r.min_tokens, ") must not exceed 'max_tokens' (", *r.max_tokens, ")"));
  if (r.logprobs < -1 || r.logprobs > kMaxLogprobs)
    bad("logprobs", cat("'logprobs' must be -1 (off) or in [0, ", kMaxLogprobs, "], got ", r.logprobs));
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > kMaxLogprobs)
    bad("logprobs", cat("'prompt_logprobs' must be -1 (off) or in [0, ", kMaxLogprobs, "], got ", r.prompt_logprobs));
  if (r.n < 1 || r.n > kMaxChoices) bad("n", cat("'n' must be in [1, ", kMaxChoices, "], got ", r.n));
  if (r.best_of != 0 && (r.best_of < r.n || r.best_of > kMaxChoices))
    bad("best_of", cat("'best_of' must be in [n, ", kMaxChoices, "] (n = ", r.n, "), got ", r.best_of));
  try {
    validate(r.sampling);
  } catch (const Error& e) {
    bad("", e.what());
  }
}

int64_t fit_logprob_entries(int64_t max_tokens, int64_t per_token, int64_t prompt_entries, int32_t share) {
  const int64_t room = kMaxLogprobEntries / std::max<int32_t>(1, share) - prompt_entries;
  return per_token > 0 && room >= per_token ? std::min(max_tokens, room / per_token) : max_tokens;
}

void check_logprob_entries(int64_t prompt_entries, int64_t output_entries) {
  if (prompt_entries + output_entries <= kMaxLogprobEntries) return;
  bad(output_entries > prompt_entries ? "logprobs" : "prompt_logprobs",
      cat("the response's logprobs would be ", prompt_entries + output_entries,
          " entries (choices x tokens x (alternatives + 1): the prompt's (echo or prompt_logprobs) ", prompt_entries,
          ", the output's (max_tokens, held for one response body) ", output_entries, "), more than ", kMaxLogprobEntries,
          "; ask fewer choices, tokens or alternatives, or stream the output"));
}

int64_t resolve_max_tokens(const GenerationRequest& r, int64_t n_prompt, int64_t n_ctx) {
  const char* param = prompt_param(r);
  if (n_prompt < 1) bad(param, "the prompt is empty");
  if (n_prompt >= n_ctx)
    too_long(param, cat("This model's maximum context length is ", n_ctx, " tokens; the prompt has ", n_prompt,
                   " tokens (room must be left for at least one generated token)"));
  const int64_t room = n_ctx - n_prompt;  // > 0
  if (!r.max_tokens) return room;
  const int64_t want = *r.max_tokens;
  if (want < 1) bad("max_tokens", cat("'max_tokens' must be at least 1, got ", want));
  if (want <= room) return want;
  if (r.fit_max_tokens) return room;
  // n_prompt + want, saturated: want may be anything up to INT64_MAX.
  const int64_t total = want > std::numeric_limits<int64_t>::max() - n_prompt ? std::numeric_limits<int64_t>::max()
                                                                              : n_prompt + want;
  too_long("max_tokens", cat("This model's maximum context length is ", n_ctx, " tokens. However, you requested ", total,
                        " tokens (", n_prompt, " in the prompt, ", want, " for the completion)"));
}

namespace {

// logit_bias, then min_tokens: the stop tokens (end-of-generation and stop_token_ids) at -inf while
// fewer than min_tokens have been generated; then allowed_token_ids and bad words.
class RequestLogits : public LogitsProcessor {
 public:
  RequestLogits(std::shared_ptr<const LogitBias> bias, int64_t min_tokens, std::vector<int32_t> stops,
                const std::vector<int32_t>& allowed, std::shared_ptr<const BadWordIds> bad,
                std::shared_ptr<GrammarProcessor> grammar)
      : bias_(std::move(bias)), min_tokens_(min_tokens), stops_(std::move(stops)), bad_(std::move(bad)), grammar_(std::move(grammar)) {
    if (!allowed.empty()) {
      allowed_.assign(size_t(*std::max_element(allowed.begin(), allowed.end())) + 1, 0);
      for (const int32_t t : allowed) allowed_[size_t(t)] = 1;
    }
  }
  void apply(float* logits, int32_t n_vocab, int64_t n_generated) override {
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    if (bias_)
      for (const auto& [t, b] : *bias_)
        if (t < n_vocab) logits[t] += b;
    if (n_generated < min_tokens_)
      for (const int32_t t : stops_)
        if (t < n_vocab) logits[t] = kNever;
    if (!allowed_.empty())
      for (int32_t t = 0; t < n_vocab; ++t)
        if (size_t(t) >= allowed_.size() || !allowed_[size_t(t)]) logits[t] = kNever;
    for (const std::vector<int32_t>& w : bad_ ? *bad_ : BadWordIds{}) {  // the last token, where the output ends with the rest
      const size_t k = w.size() - 1;
      if (k <= out_.size() && std::equal(w.begin(), w.end() - 1, out_.end() - std::ptrdiff_t(k)) && w.back() < n_vocab)
        logits[w.back()] = kNever;
    }
    if (grammar_ && grammar_->done_after() < 0) grammar_->apply(logits, n_vocab, n_generated);  // last: bias cannot undo it
  }
  void accept(int32_t token) override {
    if (bad_) out_.push_back(token);
    if (grammar_ && grammar_->done_after() < 0) grammar_->accept(token);  // past its end the output is cut anyway
  }

 private:
  std::shared_ptr<const LogitBias> bias_;  // (null: none)
  int64_t min_tokens_;
  std::vector<int32_t> stops_;
  std::vector<uint8_t> allowed_;          // per token: may be sampled (empty: all may)
  std::shared_ptr<const BadWordIds> bad_;  // token sequences never completed (null: none)
  std::vector<int32_t> out_;              // generated so far (with bad words)
  std::shared_ptr<GrammarProcessor> grammar_;
};

}  // namespace

std::shared_ptr<LogitsProcessor> make_logits_processor(const GenerationRequest& r, const std::vector<int32_t>& eog_ids,
                                                       std::shared_ptr<GrammarProcessor> grammar,
                                                       std::shared_ptr<const BadWordIds> bad_words,
                                                       std::shared_ptr<const LogitBias> bias) {
  if (bad_words && bad_words->empty()) bad_words = nullptr;
  if (!bias && !r.logit_bias.empty()) bias = std::make_shared<const LogitBias>(r.logit_bias);
  if (bias && bias->empty()) bias = nullptr;
  if (!bias && r.min_tokens == 0 && !grammar && r.allowed_token_ids.empty() && !bad_words) return nullptr;
  std::vector<int32_t> stops;
  if (r.min_tokens > 0) {
    if (!r.ignore_eos) stops = eog_ids;
    stops.insert(stops.end(), r.stop_token_ids.begin(), r.stop_token_ids.end());
  }
  return std::make_shared<RequestLogits>(std::move(bias), r.min_tokens, std::move(stops), r.allowed_token_ids,
                                         std::move(bad_words), std::move(grammar));
}

void sort_logit_bias(LogitBias& bias) {
  const auto not_increasing = [](const auto& a, const auto& b) { return a.first >= b.first; };
  if (std::adjacent_find(bias.begin(), bias.end(), not_increasing) == bias.end()) return;  // (already)
  std::stable_sort(bias.begin(), bias.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t out = 0;  // (the last of each run of one token)
  for (size_t i = 0; i < bias.size(); ++i)
    if (i + 1 == bias.size() || bias[i + 1].first != bias[i].first) bias[out++] = bias[i];
  bias.resize(out);
  bias.shrink_to_fit();
}

void resolve_logit_bias(GenerationRequest& r, const Tokenizer& tok) {
  for (const GenerationRequest::BiasEntry& e : r.logit_bias_text) {
    if (e.id >= 0) {
      r.logit_bias.emplace_back(e.id, e.bias);
      continue;
    }
    for (const int32_t id : tok.encode(e.text, false, /*parse_special=*/false)) r.logit_bias.emplace_back(id, e.bias);
  }
  r.logit_bias_text.clear();
  sort_logit_bias(r.logit_bias);
}

BadWordIds bad_word_ids(const Tokenizer& tok, const std::vector<std::string>& words) {
  BadWordIds out;
  for (const std::string& word : words) {  // (left-stripped of whitespace, as vLLM's lstrip())
    const std::string_view w = std::string_view(word).substr(std::min(word.find_first_not_of(" \t\n\r\f\v"), word.size()));
    if (w.empty()) continue;
    std::vector<int32_t> plain = tok.encode(w, false, true);
    std::vector<int32_t> spaced = tok.encode(" " + std::string(w), false, true);
    // (vLLM's rule. SentencePiece's own space prefix makes plain the word's start already, and
    // its spaced form one token longer: not taken.)
    const bool other = !spaced.empty() && !plain.empty() && spaced.size() == plain.size() && spaced.front() != plain.front();
    if (!plain.empty()) out.push_back(std::move(plain));
    if (other) out.push_back(std::move(spaced));
  }
  return out;
}

uint64_t draw_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

std::shared_ptr<const StopMatcher::Patterns> StopMatcher::compile(std::vector<std::string> stops) {
  auto p = std::make_shared<Patterns>();
  for (const std::string& s : stops) {
    std::vector<uint32_t>& f = p->fail.emplace_back(s.size(), 0);  // f[i]: s[0, i]'s longest proper border
    for (size_t i = 1, q = 0; i < s.size(); ++i) {
      while (q > 0 && s[i] != s[q]) q = f[q - 1];
      if (s[i] == s[q]) ++q;
      f[i] = uint32_t(q);
    }
  }
  p->stops = std::move(stops);
  return p;
}

StopMatcher::StopMatcher(std::shared_ptr<const Patterns> patterns, bool include_stop)
    : p_(std::move(patterns)), state_(p_->stops.size(), 0), include_stop_(include_stop) {}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  const size_t fresh = held_.size();  // held_ holds no whole stop string: matches end in text
  held_.append(text);
  const std::vector<std::string>& stops = p_->stops;
  if (stops.empty()) return std::exchange(held_, {});
  size_t best = std::string::npos;
  const std::string* matched = nullptr;
  for (size_t k = 0; k < stops.size(); ++k) {
    const std::string& s = stops[k];
    size_t q = state_[k];
    for (size_t i = fresh; i < held_.size(); ++i) {
      while (q > 0 && held_[i] != s[q]) q = p_->fail[k][q - 1];
      if (held_[i] == s[q]) ++q;
      if (q == s.size()) {  // its first match, so its earliest
        if (i + 1 - s.size() < best) best = i + 1 - s.size(), matched = &s;
        break;
      }
    }
    state_[k] = uint32_t(q);
  }
  if (matched) {
    stopped_ = true;
    matched_ = matched;
    std::string out = held_.substr(0, best);
    if (include_stop_) out += *matched;
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  const size_t keep = *std::max_element(state_.begin(), state_.end());
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

GenerationContext::GenerationContext(Engine& e, const Tokenizer& tok, ChatTemplate chat_template)
    : engine(e), tokenizer(tok), chat(std::move(chat_template)), n_ctx(e.n_ctx()), n_vocab(tok.n_vocab()) {
  for (int32_t t = 0; t < n_vocab; ++t)
    if (tok.is_eog(t)) eog_ids.push_back(t);
}

std::shared_ptr<const GrammarVocab> GenerationContext::grammar_vocab() const {
  std::call_once(vocab_once, [this] {
    std::vector<std::string> pieces(static_cast<size_t>(n_vocab));
    std::vector<bool> eog(static_cast<size_t>(n_vocab));
    for (int32_t t = 0; t < n_vocab; ++t) {
      eog[size_t(t)] = tokenizer.is_eog(t);
      pieces[size_t(t)] = tokenizer.token_to_piece(t);  // "" for control tokens: never allowed
    }
    vocab = std::make_shared<const GrammarVocab>(std::move(pieces), std::move(eog));
  });
  return vocab;
}

Generation::Generation(const GenerationContext& ctx, GenerationRequest req, std::shared_ptr<GenerationSink> sink)
    : ctx_(ctx), req_(std::move(req)), sink_(std::move(sink)) {
  const auto stops = StopMatcher::compile(req_.stop);
  for (int32_t i = 0; i < n_candidates(); ++i) choices_.emplace_back(ctx.tokenizer, stops, req_.include_stop_str, !req_.skip_special_tokens);
}

std::string render_chat(const ChatTemplate& chat, const GenerationRequest& req) {
  if (!req.continue_final_message) return chat.render(req.messages, req.tools, req.add_generation_prompt, req.template_vars);
  std::string text = chat.render(req.messages, req.tools, false, req.template_vars);
  const std::string& last = req.messages.back().content;
  const size_t at = last.empty() ? std::string::npos : text.rfind(last);
  if (at == std::string::npos)
    throw ApiError(400, "continue_final_message: the chat template's rendering does not contain the final message's content",
                   "continue_final_message");
  text.resize(at + last.size());
  return text;
}

namespace {

// Engine::submit's refusals as the client sees them.
ApiError submit_error(const Error& e) {
  if (const auto* late = dynamic_cast<const DeadlineError*>(&e)) {
    ApiError a(429, e.what(), "", "rate_limit_error", kDeadlineUnmeetable);
    a.retry_after_s = late->retry_after_s;
    return a;
  }
  const std::string msg = e.what();
  if (msg.find("shutting down") != std::string::npos) return ApiError(503, msg, "", "server_error", "server_shutdown");
  return ApiError(400, msg);
}

}  // namespace

std::vector<int32_t> infill_prompt(const FimIds& fim, const std::function<std::vector<int32_t>(std::string_view)>& encode,
                                   const InfillParts& parts, const std::vector<int32_t>& prompt, int64_t n_ctx,
                                   int64_t n_predict) {
  constexpr int64_t kBatch = 2048;  // llama.cpp's default n_batch, which its budgets are shares of
  // ... less what the FIM tokens, BOS and a first generated token need where the context is
  // shorter (llama.cpp's own budgets could overrun it). (Not all of n_predict: a cap, which the
  // context's end cuts, as llama.cpp's does; reserving it could leave no room for the code.)
  const int64_t reserve = 3 + (fim.bos >= 0) + 1;
  const int64_t n_batch = std::max<int64_t>(0, std::min(kBatch, n_ctx - reserve));
  auto append = [](std::vector<int32_t>& to, const std::vector<int32_t>& ids) { to.insert(to.end(), ids.begin(), ids.end()); };
  std::vector<int32_t> extra;
  if (fim.rep >= 0) {
    extra.push_back(fim.rep);
    append(extra, encode("myproject\n"));
  }
  for (const auto& [filename, text] : parts.extra) {
    if (fim.sep >= 0) {
      extra.push_back(fim.sep);
      append(extra, encode(filename + "\n"));
    } else {
      append(extra, encode("\n\n--- snippet ---\n\n"));
    }
    append(extra, encode(text));
  }
  if (fim.sep >= 0) {
    extra.push_back(fim.sep);
    append(extra, encode("filename\n"));
  }
  const std::vector<int32_t> pre = encode(parts.prefix), suf = encode(parts.suffix);
  const int64_t n_pre = std::min<int64_t>(int64_t(pre.size()),  // (and room for the prompt, which continues it)
                                          std::max<int64_t>(0, std::min<int64_t>(3 * (n_batch / 4), n_batch - int64_t(prompt.size()))));
  const int64_t n_suf = std::min<int64_t>(int64_t(suf.size()), std::max<int64_t>(0, n_batch / 4 - (2 + int64_t(prompt.size()))));
  const int64_t core = 3 + (fim.bos >= 0) + n_pre + int64_t(prompt.size()) + n_suf;  // all but the extra part
  const int64_t room = std::min(n_ctx - n_batch - 2 * n_predict, n_ctx - core - 1);
  const int64_t n_extra = std::min<int64_t>(int64_t(extra.size()), std::max<int64_t>(0, room));
  std::vector<int32_t> out(extra.end() - n_extra, extra.end());
  if (fim.bos >= 0) out.push_back(fim.bos);
  out.push_back(fim.pre);
  out.insert(out.end(), pre.end() - n_pre, pre.end());
  append(out, prompt);
  out.push_back(fim.suf);
  out.insert(out.end(), suf.begin(), suf.begin() + n_suf);
  out.push_back(fim.mid);
  return out;
}

bool ends_in_reasoning(std::string_view rendered) {
  while (!rendered.empty() && std::isspace(static_cast<unsigned char>(rendered.back()))) rendered.remove_suffix(1);
  return rendered.ends_with("<think>");
}

namespace {
// A 400 naming param (what: the feature, for the message) when the vocabulary has no FIM tokens.
void require_fim(const Tokenizer& tok, const std::string& what, const char* param) {
  if (tok.fim_prefix() < 0 || tok.fim_suffix() < 0 || tok.fim_middle() < 0)
    throw ApiError(400, what + " needs a model with fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, <fim_middle>); this one has none",
                   param);
}
}  // namespace

std::vector<int32_t> prompt_tokens(const GenerationContext& ctx, const Tokenizer& tok, const GenerationRequest& req,
                                   std::string* rendered) {
  std::vector<int32_t> prompt;
  if (req.infill) {  // llama.cpp's /infill
    require_fim(tok, "/infill", "input_prefix");
    const std::vector<int32_t> own = req.prompt_kind == PromptKind::Tokens ? req.prompt_tokens
                                                                            : tok.encode(req.prompt_text, false, /*parse_special=*/true);
    const FimIds fim{tok.fim_prefix(), tok.fim_suffix(), tok.fim_middle(), tok.fim_repo(), tok.fim_file_sep(),
                     tok.add_bos_default() ? tok.bos() : -1};
    return infill_prompt(fim, [&](std::string_view s) { return tok.encode(s, false, /*parse_special=*/false); },
                         *req.infill, own, ctx.n_ctx, std::clamp<int64_t>(req.max_tokens.value_or(0), 0, ctx.n_ctx));
  }
  if (!req.suffix.empty() && req.prompt_kind != PromptKind::Chat) {  // fill in the middle
    require_fim(tok, "'suffix'", "suffix");
    if (req.prompt_kind == PromptKind::Text && req.add_bos && tok.add_bos_default()) prompt.push_back(tok.bos());
    prompt.push_back(tok.fim_prefix());
    if (req.prompt_kind == PromptKind::Tokens) {
      prompt.insert(prompt.end(), req.prompt_tokens.begin(), req.prompt_tokens.end());
    } else {
      const std::vector<int32_t> pre = tok.encode(req.prompt_text, false, /*parse_special=*/true);
      prompt.insert(prompt.end(), pre.begin(), pre.end());
    }
    prompt.push_back(tok.fim_suffix());
    const std::vector<int32_t> suf = tok.encode(req.suffix, false, /*parse_special=*/true);
    prompt.insert(prompt.end(), suf.begin(), suf.end());
    prompt.push_back(tok.fim_middle());
    if (req.truncate_prompt_tokens > 0 && int64_t(prompt.size()) > req.truncate_prompt_tokens)
      throw ApiError(400, "'truncate_prompt_tokens' would cut a fill-in-the-middle prompt", "truncate_prompt_tokens");
    return prompt;
  }
  try {
    switch (req.prompt_kind) {
      case PromptKind::Chat: {
        const std::string text = render_chat(ctx.chat, req);
        prompt = tok.encode(text, /*add_bos=*/false, /*parse_special=*/true);
        if (rendered) *rendered = text;
        break;
      }
      case PromptKind::Tokens:
        prompt = req.prompt_tokens;
        break;
      case PromptKind::Text:
        prompt = tok.encode(req.prompt_text, req.add_bos && tok.add_bos_default(), /*parse_special=*/true);
        break;
    }
  } catch (const Error& e) {
    throw ApiError(400, e.what(), prompt_param(req));
  } catch (const nlohmann::json::exception& e) {  // (the request's tools or variables as a template read them)
    throw ApiError(400, cat("chat template: ", e.what()), prompt_param(req));
  }
  // An embedding model's vocabulary may end a text with EOS too (llama.cpp's add_special), whose
  // state last pooling takes.
  if (req.embed && req.prompt_kind == PromptKind::Text && req.add_bos && tok.add_eos_default() && tok.eos() >= 0)
    prompt.push_back(tok.eos());
  if (req.truncate_prompt_tokens > 0 && int64_t(prompt.size()) > req.truncate_prompt_tokens)  // its last tokens
    prompt.erase(prompt.begin(), prompt.end() - req.truncate_prompt_tokens);
  if (prompt.empty()) throw ApiError(400, cat("'", prompt_param(req), "' is empty (and no BOS token starts it)"), prompt_param(req));
  return prompt;
}

std::shared_ptr<Generation> Generation::start(const GenerationContext& ctx, const Tokenizer& tok,
                                              GenerationRequest req, std::shared_ptr<GenerationSink> sink,
                                              Post post) {
  auto gen = prepare(ctx, tok, std::move(req), std::move(sink), std::move(post));
  gen->submit_prepared();
  return gen;
}

Generation::~Generation() {
  if (admitted_ && !submitted_ && !left_queue_ && ctx_.waiting) ctx_.waiting->fetch_sub(1);
}

std::shared_ptr<Generation> Generation::prepare(const GenerationContext& ctx, const Tokenizer& tok,
                                                GenerationRequest req, std::shared_ptr<GenerationSink> sink,
                                                Post post) {
  validate(req, ctx.n_vocab);
  const auto t0 = Clock::now();
  const int64_t p_tok0 = profile::enabled() ? profile::now_ns() : 0;
  std::string rendered;
  std::vector<int32_t> prompt = prompt_tokens(ctx, tok, req, &rendered);
  const double tokenize_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const int64_t p_tok1 = profile::enabled() ? profile::now_ns() : 0;

  auto gen = std::make_shared<Generation>(ctx, std::move(req), std::move(sink));
  GenerationRequest& r = gen->req_;
  gen->n_prompt_ = int64_t(prompt.size());
  gen->opens_reasoning_ = ends_in_reasoning(rendered);
  if (r.embed && gen->n_prompt_ > ctx.n_ctx)
    too_long(prompt_param(r), cat("This model's maximum context length is ", ctx.n_ctx, " tokens; the input has ",
                             gen->n_prompt_, " tokens"));
  int64_t max_tokens = r.embed ? 0 : resolve_max_tokens(r, gen->n_prompt_, ctx.n_ctx);
  gen->max_tokens_ = max_tokens;
  if (!r.max_tokens && gen->output_logprob_entries() > 0)
    gen->max_tokens_ = max_tokens = fit_logprob_entries(max_tokens, gen->output_logprob_entries() / max_tokens,
                                                        gen->prompt_logprob_entries(), r.logprob_share);
  check_logprob_entries(gen->prompt_logprob_entries(), gen->output_logprob_entries());
  if (!r.seed_set) r.sampling.seed = draw_seed();

  if (gen->req_.queue_slot && ctx.waiting && ctx.waiting->fetch_add(1) >= ctx.max_queue) {
    ctx.waiting->fetch_sub(1);
    throw ApiError(429, cat("too many requests are waiting (limit ", ctx.max_queue, "); retry later"), "",
                   "rate_limit_error", "queue_full");
  }
  gen->admitted_ = gen->req_.queue_slot;  // (given back by the destructor if it is never submitted)
  if (!r.grammar.empty()) {  // (once admitted: a refused request costs no mask)
    // The prompts of a batched request share one grammar: it is parsed and its first mask found
    // once (this I/O thread's last grammar), each prompt taking a copy.
    thread_local std::pair<std::string, std::optional<GrammarMatcher>> last;
    try {
      if (!last.second || last.first != r.grammar || last.second->vocab() != ctx.grammar_vocab()) {
        last.second.reset();
        GrammarMatcher m(Grammar::parse(r.grammar), ctx.grammar_vocab(), ctx.grammar_mask_work);
        m.prepare_mask();
        last = {r.grammar, m.fork()};  // (its first mask only: the walks it took may be 64 MB)
      }
      gen->grammar_ = last.second->fork();  // (caches of its own: the engine thread fills them)
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "grammar");
    }
  }
  EngineRequest& er = gen->proto_;
  if (!r.adapter.empty() && !(er.adapter = ctx.engine.find_adapter(r.adapter))) {
    throw ApiError(404, cat("The LoRA adapter '", r.adapter, "' is not loaded"), "model", "invalid_request_error",
                   "model_not_found");
  }
  gen->prompt0_ = prompt.front();  // resolve_max_tokens: not empty
  if (gen->req_.return_token_ids) gen->prompt_ids_ = std::make_shared<const std::vector<int32_t>>(prompt);
  resolve_logit_bias(gen->req_, tok);
  if (!gen->req_.logit_bias.empty()) gen->logit_bias_ = std::make_shared<const LogitBias>(std::move(gen->req_.logit_bias));
  gen->req_.logit_bias.clear();
  if (!gen->req_.bad_words.empty()) gen->bad_words_ = std::make_shared<const BadWordIds>(bad_word_ids(tok, gen->req_.bad_words));
  er.prompt = std::move(prompt);
  er.sampling = r.sampling;
  er.max_tokens = max_tokens;
  er.ignore_eos = r.ignore_eos;
  er.tokenize_ms = tokenize_ms;
  er.logprobs = gen->ranking() ? std::max(r.logprobs, 0) : r.logprobs;  // best_of ranks by logprob
  er.prompt_logprobs = r.prompt_logprobs;
  if (r.embed) er.pooling = ctx.pooling;
  er.ttft_slo_ms = r.ttft_slo_ms;
  er.priority = r.priority;
  if (!r.cache_salt.empty()) er.cache_salt = std::max<uint64_t>(1, std::hash<std::string>{}(r.cache_salt));
  gen->post_ = std::move(post);
  gen->p_tok0_ = p_tok0;
  gen->p_tok1_ = p_tok1;
  return gen;
}

void Generation::submit_prepared() {
  submit();
  if (p_tok0_ > 0)  // recorded once the engine's id is known, to tie it to the request's track
    profile::complete("tokenize", "request", p_tok0_, p_tok1_, profile::Args().i("req", int64_t(id())).i("tokens", n_prompt_));
}

void Generation::submit() {
  EngineRequest er = std::move(proto_);
  EventCallback cb0;
  for (int32_t i = 0; i < n_candidates(); ++i) {
    Choice& c = choices_[size_t(i)];
    if (grammar_) c.grammar = std::make_shared<GrammarProcessor>(i + 1 < n_candidates() ? *grammar_ : std::move(*grammar_));
    // Runs on the engine thread: copy the event and post it to the consumer. (post holds the
    // consumer, which holds this generation: the engine drops each callback at its choice's finish.)
    EventCallback cb = [gen = shared_from_this(), i, post = post_](const EngineEvent& ev) {
      Event e{i, ev.kind, ev.token, ev.reason, ev.logprob, ev.top_logprobs, nullptr, ev.error, ev.request_error,
              ev.prompt_logprobs, ev.embedding};
      if (ev.kind == EngineEvent::Kind::Finished && ev.timings) e.timings = std::make_shared<RequestTimings>(*ev.timings);
      post([gen, e = std::move(e)] { gen->on_event(e); });
    };
    auto processor = req_.embed ? nullptr : make_logits_processor(req_, ctx_.eog_ids, c.grammar, bad_words_, logit_bias_);
    if (i == 0) {
      er.logits_processor = std::move(processor);
      cb0 = std::move(cb);
    } else {
      er.forks.push_back({er.sampling.seed + uint64_t(i) /* wraps: any seed is fine */, std::move(processor), std::move(cb)});
    }
  }
  post_ = nullptr;
  uint64_t id;
  try {
    id = ctx_.engine.submit(std::move(er), std::move(cb0));
  } catch (const Error& e) {
    throw submit_error(e);
  }
  for (int32_t i = 0; i < n_candidates(); ++i) choices_[size_t(i)].engine_id = id + uint64_t(i);
  submitted_ = true;
}

void Generation::on_event(const Event& e) {
  try {
    handle(e);
  } catch (const std::exception& x) {  // decoding, formatting: this request fails, the thread goes on
    spdlog::error("{}: handling an engine event failed: {}", req_.name.empty() ? "request" : req_.name, x.what());
    // Ended, or nobody reading: nothing to add. A last on_finish that threw wrote no end (each
    // sink's last act), so the error ends the response.
    if (ended_ || client_gone_) return cancel_all();
    try {
      fail(ApiError(500, cat("generation failed: ", x.what()), "", "server_error", kGenerationFailed));
    } catch (const std::exception&) {  // the sink itself is broken: nothing more to tell
    }
  }
}

Usage Generation::usage() const {
  Usage u{n_prompt_, 0};
  u.cached_tokens = cached_;
  for (const Choice& c : choices_) u.completion_tokens += c.n_tokens;
  return u;
}

void Generation::cancel_all() {
  if (!submitted_) return;
  for (const Choice& c : choices_) ctx_.engine.cancel(c.engine_id);  // a finished one's id is unknown by now: ignored
}

void Generation::fail(const ApiError& err) {
  responded_ = ended_ = true;  // (an on_error that throws is not made again)
  cancel_all();
  sink_->on_error(err, usage());
}

Output Generation::output(int32_t i) {
  Choice& c = choices_[size_t(i)];
  Output o;
  o.index = i;
  if (c.first_output) {
    c.first_output = false;
    if (req_.prompt_logprobs >= 0) o.prompt_logprobs = prompt_lp_;
    o.prompt_ids = prompt_ids_;
  }
  return o;
}

void Generation::handle(const Event& e) {
  std::optional<profile::Scope> sc;  // decode, stop strings, the sink's formatting and queueing
  if (ctx_.emit_span) sc.emplace(ctx_.emit_span, "http");
  if (!left_queue_) {
    left_queue_ = true;
    if (admitted_ && ctx_.waiting) ctx_.waiting->fetch_sub(1);
  }
  const int32_t i = e.index;
  Choice& c = choices_[size_t(i)];
  const Tokenizer& tok = ctx_.tokenizer;
  if (e.kind == EngineEvent::Kind::Token) {
    if (i == 0 && !first_token_) {
      first_token_ = true;
      if (req_.prompt_logprobs >= 0) {  // the first prompt token: nothing precedes it
        prompt_lp_.push_back({prompt0_, std::numeric_limits<float>::quiet_NaN(), {}});
        prompt_lp_.insert(prompt_lp_.end(), e.prompt_logprobs.begin(), e.prompt_logprobs.end());
      }
    }
    if (responded_ || c.done) return;  // stopped, or the client left: tokens until the cancel lands
    ++c.n_tokens;
    c.logprob_sum += e.logprob;
    if (!req_.name.empty() && spdlog::should_log(spdlog::level::trace))
      spdlog::trace("{} token {} {}", req_.name, e.token,
                    nlohmann::json(tok.token_to_piece(e.token)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (tok.is_eog(e.token) && !req_.ignore_eos) {  // not output, and no logprob (OpenAI); its id on request
      if (req_.return_token_ids) c.end_token = e.token;
      return;
    }
    if (std::binary_search(req_.stop_token_ids.begin(), req_.stop_token_ids.end(), e.token)) {
      ctx_.engine.cancel(c.engine_id);  // a stop token: not output, like an end-of-generation one
      c.finish = "stop";
      c.stop_token = e.token;
      Output o = output(i);
      o.text = c.stop.push(c.dec.flush());
      if (!c.stop.stopped()) o.text += c.stop.flush();
      if (req_.return_token_ids) o.tokens.push_back(e.token);
      return finish(i, std::move(o), nullptr);
    }
    Output o = output(i);
    o.tokens.push_back(e.token);
    o.text = c.stop.push(c.dec.push(e.token));
    if (req_.logprobs >= 0) o.logprobs.push_back({e.token, e.logprob, e.top_logprobs});
    if (c.grammar && c.grammar->done_after() == c.n_tokens) {  // the grammar's end: nothing may follow
      ctx_.engine.cancel(c.engine_id);
      c.finish = "stop";
      o.text += c.stop.push(c.dec.flush());
      if (!c.stop.stopped()) o.text += c.stop.flush();
      return finish(i, std::move(o), nullptr);
    }
    if (!c.stop.stopped()) return deliver(i, std::move(o));
    ctx_.engine.cancel(c.engine_id);
    c.finish = "stop";
    return finish(i, std::move(o), nullptr);
  }
  // Finished.
  if (!responded_ && !c.done) {
    if (e.reason == FinishReason::Error) {
      // (A grammar too ambiguous to follow further, GrammarMatcher::kMaxMaskWork: a 400, as when
      // its start already is.)
      if (e.request_error) fail(ApiError(400, e.error));
      else fail(ApiError(500, e.error, "", "server_error", kGenerationFailed));
    } else if (e.reason == FinishReason::Cancelled) {
      fail(shutdown_cancel_ ? ApiError(503, "the server is shutting down; the request was cancelled", "", "server_error",
                                       "server_shutdown")
                            : ApiError(500, "the request was cancelled", "", "server_error"));
    } else {
      Output o = output(i);
      o.text = c.stop.push(c.dec.flush());
      if (!c.stop.stopped()) o.text += c.stop.flush();
      if (c.end_token >= 0) o.tokens.push_back(c.end_token);
      for (float x : e.embedding)
        if (!std::isfinite(x)) {
          fail(ApiError(500, "the embedding is not finite (the model's hidden state overflowed)", "", "server_error",
                        kGenerationFailed));
          if (e.timings) account(i, *e.timings, FinishReason::Error);
          return;
        }
      o.embedding = e.embedding;
      c.finish = c.stop.stopped() || e.reason == FinishReason::Stop ? "stop" : "length";
      finish(i, std::move(o), e.timings.get());
    }
  }
  if (e.timings) account(i, *e.timings, e.reason);
}

void Generation::deliver(int32_t i, Output&& o) {
  if (!ranking()) return sink_->on_output(std::move(o));
  choices_[size_t(i)].held.push_back(std::move(o));
}

void Generation::finish(int32_t i, Output&& last, const RequestTimings* t) {
  Choice& c = choices_[size_t(i)];
  if (t && !cached_known_) {
    cached_known_ = true;
    cached_ = std::min(t->cached_tokens, n_prompt_);
  }
  c.done = true;
  const bool all = ++n_done_ == n_candidates();
  if (ranking()) {
    c.held.push_back(std::move(last));
    if (t) c.timings = std::make_shared<RequestTimings>(*t);
    return all ? deliver_best() : void();
  }
  if (all) responded_ = true;
  sink_->on_finish(std::move(last), Finish{i, all, c.finish, usage(), t, std::string(c.stop.matched()), c.stop_token});
  if (all) ended_ = true;
}

void Generation::deliver_best() {
  responded_ = true;
  std::vector<int32_t> order(static_cast<size_t>(n_candidates()));
  for (int32_t i = 0; i < n_candidates(); ++i) order[size_t(i)] = i;
  auto mean = [&](int32_t i) {
    const Choice& c = choices_[size_t(i)];
    return c.n_tokens > 0 ? c.logprob_sum / double(c.n_tokens) : -std::numeric_limits<double>::infinity();
  };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return mean(a) > mean(b); });
  const Usage u = usage();  // every candidate's tokens
  for (int32_t k = 0; k < req_.n; ++k) {
    Choice& c = choices_[size_t(order[size_t(k)])];
    for (Output& o : c.held) o.index = k;
    Output last = std::move(c.held.back());
    c.held.pop_back();
    for (Output& o : c.held) sink_->on_output(std::move(o));
    sink_->on_finish(std::move(last), Finish{k, k + 1 == req_.n, c.finish, u, c.timings.get(), std::string(c.stop.matched()), c.stop_token});
  }
  ended_ = true;
}

void Generation::account(int32_t i, const RequestTimings& t, FinishReason reason) {
  const Choice& c = choices_[size_t(i)];
  std::string finish = c.finish;
  if (finish.empty())
    finish = reason == FinishReason::Stop     ? "stop"
             : reason == FinishReason::Length ? "length"
             : reason == FinishReason::Error  ? "error"
                                              : "abort";
  // The prompt is the request's: counted with its first choice.
  if (ctx_.metrics) ctx_.metrics->observe_finished(t, finish, i == 0 ? n_prompt_ : 0, c.n_tokens);
  if (!req_.name.empty()) {
    // Speculative decoding: verifications, accepted / drafted tokens (acceptance rate).
    const std::string spec =
        t.spec.drafts == 0 ? std::string()
                           : fmt::format(" spec_drafts={} spec_accepted={}/{} ({:.1f}%)", t.spec.drafts, t.spec.accepted_tokens,
                                         t.spec.draft_tokens, 100.0 * double(t.spec.accepted_tokens) / double(t.spec.draft_tokens));
    spdlog::info("{}{} finish={} prompt={} cached={} gen={} tokenize={:.2f}ms queue={:.2f}ms prefill={:.2f}ms "
                 "ttft={:.2f}ms decode={:.2f}ms total={:.2f}ms{}{}",
                 req_.name, req_.n > 1 ? fmt::format(" choice={}", i) : std::string(), finish, n_prompt_, t.cached_tokens,
                 c.n_tokens, t.tokenize_ms, t.queue_ms(), t.prefill_ms(), t.ttft_ms(), t.decode_ms(), t.total_ms(), spec,
                 client_gone_ ? " (client disconnected)" : detached_ ? " (client disconnected; kept running in the background)" : "");
  }
}

void Generation::abandon() {
  if (responded_) return;
  if (req_.outlives_client) {
    detached_ = true;
    return;
  }
  responded_ = client_gone_ = true;
  cancel_all();
}

void Generation::cancel() {
  if (!responded_) cancel_all();
}

void Generation::cancel_for_shutdown() {
  if (responded_ || shutdown_cancel_) return;
  shutdown_cancel_ = true;
  cancel_all();
}

}  // namespace ft::server
