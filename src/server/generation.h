// One generation, whatever the front end (HTTP, the binary protocol, `firsttoken run`).
//
// A front end parses into a GenerationRequest and implements a GenerationSink. Generation::start
// builds the prompt (text, token ids or chat), validates, draws the seed, admits the request
// (servers: at most max_queue waiting for their first token) and submits the EngineRequest.
// Generation::on_event turns engine events into output: stream decoder, stop strings, the
// end-of-generation filter and logprobs; it accounts the finish (metrics, the log line) and calls
// the sink: on_output per generated token, then on_finish or on_error exactly once.
//
// Threads: start() runs on the caller's thread with that thread's tokenizer. The engine's
// callback copies each event and hands it to `post`, which must run it on one thread at a time
// (a connection's strand, a CLI's main thread) and keep the sink alive until it has run.
#pragma once
#include <algorithm>
#include <atomic>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ft::server {

class ServerMetrics;

// logit_bias: (token, bias) pairs.
using LogitBias = std::vector<std::pair<int32_t, float>>;

// An error the client gets with `status` (HTTP: {"error": {"message", "type", "param", "code"}}).
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  int64_t retry_after_s = 1;  // 429 and 503: the Retry-After header
  ApiError(int status_, std::string message, std::string param_ = "",
           std::string type_ = "invalid_request_error", std::string code_ = "")
      : std::runtime_error(message), status(status_), type(std::move(type_)), param(std::move(param_)),
        code(std::move(code_)) {}
};
// A 400 naming the request's offending param.
[[noreturn]] inline void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }
// ... a prompt or max_tokens past the context: OpenAI's code, which clients (LangChain) look for.
[[noreturn]] inline void too_long(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, param, "invalid_request_error", "context_length_exceeded");
}

inline constexpr size_t kMaxBadWords = 256;  // GenerationRequest::bad_words
// Bytes of all stop strings, and of all bad words, a request may give (every choice holds its own
// matcher of them).
inline constexpr size_t kMaxStopBytes = 64 * 1024;
inline constexpr size_t kMaxStops = 256;  // stop strings a request may give (OpenAI's 4; vLLM sets none)
inline constexpr int32_t kMaxChoices = 128;  // GenerationRequest::n (OpenAI's limit)
// A response's logprobs at most: its prompts' (choices x prompt tokens x (alternatives + 1)) and,
// when the response is held for one body (not streamed), its outputs' (choices x max_tokens x
// (alternatives + 1)): ~60 MB of JSON. A request past it is a 400, but one without max_tokens
// (the rest of the context) has max_tokens cut to what fits (Generation::prepare).
inline constexpr int64_t kMaxLogprobEntries = int64_t(1) << 20;
// ApiError::code of a request that failed while generating (the engine's FinishReason::Error).
inline constexpr const char* kGenerationFailed = "generation_failed";
// ApiError::code of a 429 from admission by prediction (--reject-late).
inline constexpr const char* kDeadlineUnmeetable = "deadline_unmeetable";

// Matches stop strings on streamed text. push() returns the text that can be sent now: it holds
// back a tail that could still become a stop string, and on a match returns the text before it
// (with include_stop, the matched stop string too: vLLM's include_stop_str_in_output) and drops
// the rest. Of several matches the earliest wins, then the first in the list. Each stop string
// is followed by a Knuth-Morris-Pratt automaton, so a byte costs O(1) a stop string (amortised)
// however long the strings are.
class StopMatcher {
 public:
  // The stop strings and their automata (KMP's failure functions), shared by a request's choices.
  struct Patterns {
    std::vector<std::string> stops;
    std::vector<std::vector<uint32_t>> fail;
  };
  static std::shared_ptr<const Patterns> compile(std::vector<std::string> stops);
  explicit StopMatcher(std::vector<std::string> stops = {}, bool include_stop = false)
      : StopMatcher(compile(std::move(stops)), include_stop) {}
  StopMatcher(std::shared_ptr<const Patterns> patterns, bool include_stop);
  std::string push(std::string_view text);
  std::string flush();  // end of stream: the held-back tail
  bool stopped() const { return stopped_; }
  std::string_view matched() const { return matched_ ? std::string_view(*matched_) : std::string_view(); }  // "" until stopped

 private:
  std::shared_ptr<const Patterns> p_;
  const std::string* matched_ = nullptr;  // the stop string that ended it
  std::vector<uint32_t> state_;  // per stop string: its longest prefix the text ends with
  bool include_stop_;
  std::string held_;
  bool stopped_ = false;
};

enum class PromptKind { Text, Tokens, Chat };

// llama.cpp's /infill: the text before and after the insertion, and other files of the project
// as (filename, text), put before them.
struct InfillParts {
  std::string prefix, suffix;
  std::vector<std::pair<std::string, std::string>> extra;
};
// The fill-in-the-middle tokens infill_prompt uses (-1: none; pre, suf, mid are required).
struct FimIds {
  int32_t pre = -1, suf = -1, mid = -1, rep = -1, sep = -1;
  int32_t bos = -1;  // put before the prefix when >= 0 (the vocabulary adds one)
};
// llama.cpp's format_infill (its server's /infill prompt), repository-level where the vocabulary
// has the tokens:
//   [rep "myproject\n"] ([sep filename "\n"] | "\n\n--- snippet ---\n\n") text ... [sep "filename\n"]
//   [bos] pre prefix prompt suf suffix mid
// encode: text -> ids, special tokens not parsed. The prefix keeps its last 3/4 of n_batch tokens
// (fewer when the prompt leaves less of n_batch),
// the suffix its first n_batch/4 - (2 + prompt's), the extra part its last n_ctx - n_batch -
// 2 n_predict (all at least 0), where n_batch = min(2048, n_ctx - reserve), llama.cpp's default
// batch where the context has room for it, reserve = the FIM tokens, BOS and one generated token;
// and the extra part at most what the context leaves past the rest and that token. Only a prompt
// longer than the context makes the whole longer than n_ctx - 1.
std::vector<int32_t> infill_prompt(const FimIds& fim, const std::function<std::vector<int32_t>(std::string_view)>& encode,
                                   const InfillParts& parts, const std::vector<int32_t>& prompt, int64_t n_ctx,
                                   int64_t n_predict);

// What every front end parses into.
struct GenerationRequest {
  PromptKind prompt_kind = PromptKind::Text;
  std::string prompt_text;             // Text: tokenized here, special tokens parsed
  bool add_bos = true;                 // Text: BOS first when the vocabulary wants it
  std::vector<int32_t> prompt_tokens;  // Tokens: used as given (no BOS)
  // Text or Tokens (completions' suffix): fill in the middle, the prompt is what comes before
  // the insertion and this what comes after ([BOS] <fim_prefix> prompt <fim_suffix> suffix
  // <fim_middle>, the PSM order); "" = none.
  std::string suffix;
  std::vector<ChatMessage> messages;   // Chat: rendered with the served chat format
  SamplingParams sampling;
  bool seed_set = false;               // false: start() draws a seed
  std::optional<int64_t> max_tokens;   // absent: the rest of the context
  bool fit_max_tokens = false;         // a max_tokens past the context: cut to it (true) or 400 (false)
  bool ignore_eos = false;
  std::vector<std::string> stop;       // at most kMaxStops, non-empty
  bool include_stop_str = false;       // a matched stop string ends the output, included (vLLM's include_stop_str_in_output)
  bool skip_special_tokens = true;     // false: control tokens (other than the one that ends it) are output as their text
  // vLLM's return_token_ids: a choice's first Output carries the prompt's ids (Output::prompt_ids)
  // and Output::tokens keeps the token that ends a choice (end-of-generation, stop_token_ids).
  bool return_token_ids = false;
  int64_t truncate_prompt_tokens = 0;  // > 0: only the prompt's last this many tokens are used (vLLM's); 0: all
  // The output goes out as it is made (SSE, the binary port's stream): a held response's output
  // logprobs count against kMaxLogprobEntries, a stream's do not.
  bool stream = false;
  bool holds_output = false;  // a stream whose output may be held whole (tool calls; Responses' completed event): counted as held
  // Prompts of one response (a batched completions request's): each may take this share of its
  // logprob entries when max_tokens is not given.
  int32_t logprob_share = 1;
  int32_t logprobs = -1;               // -1: off; N >= 0: each token's logprob and its N best alternatives
  int32_t prompt_logprobs = -1;        // -1: off; N >= 0: the same for the prompt's tokens (Output::prompt_logprobs)
  // Choices: n independent generations from the prompt (choice i samples with seed + i), one
  // engine request whose forks (EngineRequest::forks) are choices 1..: the prompt is prefilled
  // once, every choice samples its first token from the same logits and decodes on a fork of its KV.
  int32_t n = 1;
  // Completions' best_of (0: n): generate this many choices (>= n) and return the n with the
  // highest mean logprob per generated token (OpenAI's "highest log probability per token"), best
  // first, as choices 0..n-1; usage counts every generated token. Not streamable (api.cpp refuses).
  int32_t best_of = 0;
  double ttft_slo_ms = 0;              // extension: the TTFT deadline from arrival; 0 = the server's default
  int32_t priority = 0;                // extension (vLLM's): lower is scheduled first
  // (token, bias) added to its logit before sampling: sorted, one value a token (the last given:
  // sort_logit_bias), so at most the vocabulary ("1", "01", "001" are one token, and 280,000 keys
  // were kept, copied per choice and added per step), shared by the choices.
  LogitBias logit_bias;
  // llama.cpp's logit_bias with texts, its entries in the order given: a token id, or a text every
  // token of which (tokenized as it is, special tokens not parsed) gets the bias. prepare() makes
  // them logit_bias (resolve_logit_bias: the last given for a token wins). Empty unless a text is
  // given (ids alone go to logit_bias at once).
  struct BiasEntry {
    int32_t id = -1;  // >= 0: a token id, else the text's tokens
    std::string text;
    float bias = 0;
    bool operator==(const BiasEntry&) const = default;
  };
  std::vector<BiasEntry> logit_bias_text;
  int64_t min_tokens = 0;              // end-of-generation tokens and stop_token_ids are masked before this many
  // Both sorted, without repeats (at most the vocabulary: a 4 MB body of 2M repeats of one id was
  // scanned per token on the I/O thread and per step on the engine's, and copied per choice).
  std::vector<int32_t> stop_token_ids; // sampling one ends the generation ("stop"; the token is not output)
  std::vector<int32_t> allowed_token_ids;  // vLLM's: non-empty = only these may be sampled
  // vLLM's bad_words: never generated. Each is tokenized as it is and after a space (at a word's
  // start); its last token is masked wherever the output ends with the ones before it.
  std::vector<std::string> bad_words;
  bool add_generation_prompt = true;   // Chat: open the assistant's turn
  // Chat (vLLM's continue_final_message): the final message, an assistant's, is left open and
  // continued (rendered without a generation prompt, cut after its content).
  bool continue_final_message = false;
  // Chat: the function definitions the template shows (null: none), in the client's key order
  // (template_tools).
  nlohmann::ordered_json tools;
  nlohmann::json template_vars;        // Chat: more template variables (vLLM's chat_template_kwargs, documents); null: none
  std::string grammar;                 // GBNF (engine/grammar.h) the output must match; "" = none
  std::string name;                    // the log line's first words ("cmpl-1 completion"); "" = no log line
  std::string adapter;                 // a loaded LoRA adapter's name (Engine::load_adapter); "" = the base
  std::string cache_salt;              // vLLM's: prefix-cache blocks are shared only under the same salt; "" = none
  // llama.cpp's /infill: the prompt (prompt_text / prompt_tokens) continues parts.prefix, and
  // prompt_tokens() builds the whole with infill_prompt.
  std::optional<InfillParts> infill;
  // An embedding, not a generation: the prompt's hidden states pooled as GenerationContext::pooling
  // says (Output::embedding at the finish); nothing is sampled, so the prompt may fill the context.
  bool embed = false;
  // Counts against the server's max_queue (admission). False: an embeddings request's input but
  // its last, which counts for the whole request (up to kMaxEmbeddingInputs inputs, more than a
  // queue may hold).
  bool queue_slot = true;
  // abandon() leaves it running and its sink hearing the rest (a background response, whose
  // result is kept when its client leaves); cancel() stops it.
  bool outlives_client = false;
};

// id as a token of the vocabulary; throws ApiError (400) naming param when out of [0, n_vocab).
int32_t check_token_id(int64_t id, int32_t n_vocab, const std::string& param);
// The checks that need no tokenizer: prompt present, token ids in [0, n_vocab) (prompt, logit_bias,
// stop_token_ids), max_tokens >= 1, min_tokens <= max_tokens, stop strings, logprobs, n in
// [1, kMaxChoices], best_of 0 or in [n, kMaxChoices], sampling ranges. Throws ApiError (400)
// naming the param.
void validate(const GenerationRequest& r, int32_t n_vocab);
// The effective max_tokens for a prompt of n_prompt tokens (checked arithmetic: max_tokens may be
// anything up to INT64_MAX). Throws ApiError when the prompt leaves no room or max_tokens does not
// fit and fit_max_tokens is off.
int64_t resolve_max_tokens(const GenerationRequest& r, int64_t n_prompt, int64_t n_ctx);
// A max_tokens not given (the rest of the context) cut so that a held response's logprobs fit:
// per_token entries a token (choices x (alternatives + 1)), the prompt's entries already counted,
// this prompt's 1/share of kMaxLogprobEntries. Unchanged when not even one token fits (the
// check below refuses it then).
int64_t fit_logprob_entries(int64_t max_tokens, int64_t per_token, int64_t prompt_entries, int32_t share);
// Throws ApiError (400) when a response's logprob entries (Generation::prompt_logprob_entries and
// output_logprob_entries, summed over its prompts) exceed kMaxLogprobEntries.
void check_logprob_entries(int64_t prompt_entries, int64_t output_entries);
// logit_bias as a request keeps it: sorted by token, one pair a token, the last of a token's given
// (stable: pairs given in order).
void sort_logit_bias(LogitBias& bias);
// The request's logit_bias_text resolved (its texts tokenized with tok) into logit_bias, in order
// (a later entry's bias for a token replaces an earlier one's), then sort_logit_bias.
void resolve_logit_bias(GenerationRequest& r, const Tokenizer& tok);
// What shapes the request's logits before sampling (logit_bias; min_tokens masking eog_ids and
// stop_token_ids; allowed_token_ids; bad_words, as bad_word_ids tokenized them; then the
// grammar's mask), or null when nothing does. bias: the request's logit_bias, shared by its
// choices (null: a copy of r.logit_bias).
using BadWordIds = std::vector<std::vector<int32_t>>;
std::shared_ptr<LogitsProcessor> make_logits_processor(const GenerationRequest& r, const std::vector<int32_t>& eog_ids,
                                                       std::shared_ptr<GrammarProcessor> grammar = nullptr,
                                                       std::shared_ptr<const BadWordIds> bad_words = nullptr,
                                                       std::shared_ptr<const LogitBias> bias = nullptr);
// vLLM's bad_words as token sequences: each word as it is and, where that makes another first
// token of the same length, after a space (so it is caught at a word's start and within text).
BadWordIds bad_word_ids(const Tokenizer& tok, const std::vector<std::string>& words);
// A random seed, for a request that gave none.
uint64_t draw_seed();

// A piece of output: the text released now (complete UTF-8 where the decoder can tell; a tail
// that may become a stop string is held back, a matched stop string and what follows are cut),
// the tokens that produced it (end-of-generation tokens filtered unless ignore_eos) and, when
// requested, their logprobs. index: the choice (GenerationRequest::n).
struct Output {
  int32_t index = 0;
  // A choice's first output, with prompt_logprobs: every prompt token, the first one's logprob
  // NaN (nothing precedes it: OpenAI's null) and no alternatives.
  std::vector<TokenLogprobs> prompt_logprobs;
  std::shared_ptr<const std::vector<int32_t>> prompt_ids;  // a choice's first output, with return_token_ids: the prompt as run
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::vector<float> embedding;  // an embedding's (GenerationRequest::embed), at its finish: pooled, unnormalized
};
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t reasoning_tokens = 0;  // of completion_tokens, a reasoning model's before </think> (where counted)
  // Of prompt_tokens, those the prefix cache served (the first finished choice's: RequestTimings::
  // cached_tokens; 0 until one finishes with its timings).
  int64_t cached_tokens = 0;
};
struct Finish {
  int32_t index = 0;                        // the choice that finished
  bool last = true;                         // the request's last choice: nothing follows
  std::string reason;                       // "stop" | "length"
  Usage usage;                              // the request's so far: the prompt once, every choice's tokens
  const RequestTimings* timings = nullptr;  // null when a stop string ends it before the engine does
  std::string stop_word;                    // the stop string that ended it ("" when none did)
  int32_t stop_token = -1;                  // the stop_token_ids entry that ended it (-1 when none did)
};

class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void on_output(Output&& o) = 0;                       // one generated token of choice o.index
  virtual void on_finish(Output&& last, const Finish& f) = 0;  // the rest of a choice's output, and its end
  // Cancelled (shutdown, an engine cancel) or failed; once, and nothing follows (a choice that
  // fails fails the request).
  virtual void on_error(const ApiError& e, const Usage& u) = 0;
};

// What generations share: the engine, the served model, and (servers) admission and accounting.
struct GenerationContext {
  GenerationContext(Engine& e, const Tokenizer& tok, ChatTemplate chat);
  Engine& engine;
  const Tokenizer& tokenizer;  // immutable: decodes on the consumer's thread
  ChatTemplate chat;
  std::vector<int32_t> eog_ids;    // the vocabulary's end-of-generation tokens
  // The vocabulary as constrained decoding sees it, built at the first request with a grammar.
  std::shared_ptr<const GrammarVocab> grammar_vocab() const;
  int64_t n_ctx = 0;
  int32_t n_vocab = 0;
  Pooling pooling = Pooling::Last;  // embeddings' (GenerationRequest::embed)
  // The work a grammar's state may take to mask (GrammarMatcher's limit; its default but in tests).
  uint64_t grammar_mask_work = GrammarMatcher::kMaxMaskWork;
  std::atomic<int64_t>* waiting = nullptr;  // requests with no token or finish yet; null: no admission limit
  int64_t max_queue = 0;
  ServerMetrics* metrics = nullptr;         // null: no metrics
  mutable std::once_flag vocab_once;
  mutable std::shared_ptr<const GrammarVocab> vocab;
  const char* emit_span = nullptr;          // profiler span around each event's handling; null: none
};

// The request's prompt as token ids, as a generation would run it: a chat rendered with ctx.chat
// (the text into *rendered when given), text tokenized (BOS by add_bos), truncate_prompt_tokens
// applied. Throws ApiError (400) naming the prompt's param.
std::vector<int32_t> prompt_tokens(const GenerationContext& ctx, const Tokenizer& tok, const GenerationRequest& req,
                                   std::string* rendered = nullptr);
// A chat request's prompt text (its messages, tools and template_vars through chat); with
// continue_final_message, cut after the final message's content (vLLM's rule: its last occurrence
// in the rendering), whatever the template closes it with. Throws ApiError (400) when that content
// is not in the rendering, ft::Error when the template fails.
std::string render_chat(const ChatTemplate& chat, const GenerationRequest& req);
// Whether a rendered chat prompt ends inside a reasoning block: its last non-space text is
// "<think>" (DeepSeek R1's templates, and templates that open it on request, e.g. by
// chat_template_kwargs), so the model's output starts as reasoning.
bool ends_in_reasoning(std::string_view rendered);

using Post = std::function<void(std::function<void()>)>;

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  // An engine event copied off the engine thread (its timings are only valid during the callback).
  struct Event {
    int32_t index;  // the choice
    EngineEvent::Kind kind;
    int32_t token;
    FinishReason reason;
    float logprob;
    std::vector<std::pair<int32_t, float>> top_logprobs;
    std::shared_ptr<RequestTimings> timings;  // Finished only
    std::string error;                        // Finished(Error): why
    bool request_error;                       // Finished(Error): the request's own input (400)
    std::vector<TokenLogprobs> prompt_logprobs;
    std::vector<float> embedding;
  };

  // tok: the calling thread's tokenizer. Throws ApiError: 400 (invalid), 429 (queue full), 503
  // (the engine is shutting down).
  static std::shared_ptr<Generation> start(const GenerationContext& ctx, const Tokenizer& tok, GenerationRequest req,
                                           std::shared_ptr<GenerationSink> sink, Post post);
  // start() in two halves, for a request of several prompts: prepare each (tokenize, validate,
  // admit: whatever a bad prompt fails with, before any is submitted), then submit each. A
  // prepared generation dropped unsubmitted gives its admission back.
  static std::shared_ptr<Generation> prepare(const GenerationContext& ctx, const Tokenizer& tok, GenerationRequest req,
                                             std::shared_ptr<GenerationSink> sink, Post post);
  void submit_prepared();  // throws ApiError: 429 (DeadlineError), 503 (shutting down), 400
  ~Generation();
  // Never throws: what fails while handling it fails this generation alone (the sink's on_error).
  void on_event(const Event& e);
  // The client left: cancel; the sink hears nothing more (outlives_client: nothing changes).
  void abandon();
  // Stopped on request (a background response's cancel): the sink gets a 500, "the request was
  // cancelled".
  void cancel();
  // The shutdown deadline passed: cancel; the sink gets a 503 error.
  void cancel_for_shutdown();

  uint64_t id() const { return choices_.front().engine_id; }  // choice 0's engine request
  int64_t n_prompt() const { return n_prompt_; }
  // Entries of logprobs its response holds (kMaxLogprobEntries): every choice's prompt tokens x
  // (alternatives + 1), and unless streamed, every choice's max_tokens x (alternatives + 1); a
  // request's, summed over its prompts, is at most kMaxLogprobEntries.
  int64_t prompt_logprob_entries() const {
    return req_.prompt_logprobs < 0 ? 0 : int64_t(n_candidates()) * n_prompt_ * (req_.prompt_logprobs + 1);
  }
  int64_t output_logprob_entries() const {
    return req_.logprobs < 0 || (req_.stream && !req_.holds_output) ? 0
                                                                   : int64_t(n_candidates()) * max_tokens_ * (req_.logprobs + 1);
  }
  bool responded() const { return responded_; }
  // A chat whose rendered prompt ends_in_reasoning.
  bool opens_reasoning() const { return opens_reasoning_; }

  // For start() (make_shared); ctx must outlive the generation.
  Generation(const GenerationContext& ctx, GenerationRequest req, std::shared_ptr<GenerationSink> sink);

 private:
  struct Choice {
    Choice(const Tokenizer& tok, std::shared_ptr<const StopMatcher::Patterns> stops, bool include_stop, bool keep_special)
        : dec(tok, keep_special), stop(std::move(stops), include_stop) {}
    std::shared_ptr<GrammarProcessor> grammar;  // null: unconstrained
    StreamDecoder dec;
    StopMatcher stop;
    uint64_t engine_id = 0;
    bool done = false;          // done: its on_finish was called (best_of: its output is complete)
    bool first_output = true;   // its next Output is its first
    int64_t n_tokens = 0;
    double logprob_sum = 0;     // of its sampled tokens (best_of's ranking)
    std::string finish;  // "stop" | "length" once decided
    int32_t end_token = -1;     // with return_token_ids: the end-of-generation token that ended it
    int32_t stop_token = -1;    // the stop_token_ids entry that ended it
    // best_of: its outputs, held until every candidate has finished.
    std::vector<Output> held;
    std::shared_ptr<RequestTimings> timings;
  };
  // Submits proto_ with a fork per further choice (choice i: seed + i, its own grammar). Throws
  // ApiError: 429 (DeadlineError), 503 (shutting down), 400.
  void submit();
  int32_t n_candidates() const { return std::max(req_.n, req_.best_of); }
  bool ranking() const { return req_.best_of > req_.n; }
  // A choice's output for the sink, or held (best_of).
  void deliver(int32_t i, Output&& o);
  void handle(const Event& e);
  Output output(int32_t i);  // an Output of choice i (its first carries the prompt's logprobs)
  void finish(int32_t i, Output&& last, const RequestTimings* t);
  // best_of: every candidate has finished: the n best go to the sink, best first.
  void deliver_best();
  void fail(const ApiError& e);  // the sink's on_error; every choice cancelled
  void cancel_all();
  Usage usage() const;
  void account(int32_t i, const RequestTimings& t, FinishReason reason);

  const GenerationContext& ctx_;
  GenerationRequest req_;
  // The grammar at its start, its first mask found (on the I/O thread, not the engine's); each
  // choice runs a copy. Empty: unconstrained.
  std::optional<GrammarMatcher> grammar_;
  std::shared_ptr<GenerationSink> sink_;
  std::deque<Choice> choices_;
  EngineRequest proto_;  // what every choice runs (its prompt, sampling, limits)
  Post post_;
  bool submitted_ = false;
  std::vector<TokenLogprobs> prompt_lp_;  // with prompt_logprobs: from choice 0's first event
  int32_t prompt0_ = -1;  // the prompt's first token
  std::shared_ptr<const std::vector<int32_t>> prompt_ids_;  // with return_token_ids: the prompt as run
  std::shared_ptr<const BadWordIds> bad_words_;               // bad_word_ids of the request's bad_words
  std::shared_ptr<const LogitBias> logit_bias_;               // the request's logit_bias, one for every choice
  int64_t n_prompt_ = 0;
  int64_t cached_ = 0;  // usage's cached_tokens (the first timings a choice finished with)
  bool cached_known_ = false;
  int64_t max_tokens_ = 0;  // resolve_max_tokens's
  int32_t n_done_ = 0;
  bool first_token_ = false;  // choice 0 has had a token
  bool opens_reasoning_ = false;
  bool admitted_ = false;  // counted in ctx_.waiting (left_queue_: no longer)
  bool left_queue_ = false, responded_ = false, client_gone_ = false, shutdown_cancel_ = false;
  bool detached_ = false;  // outlives_client, and its client left (for the log)
  bool ended_ = false;  // the sink had its last call: the last choice's on_finish returned, or on_error was made
  int64_t p_tok0_ = 0, p_tok1_ = 0;  // profiler clock around tokenizing (0: not profiling)
};

}  // namespace ft::server
