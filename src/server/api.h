// The OpenAI-compatible API as pure functions: request parsing/validation, response and SSE
// formatting, raw HTTP/1.1 response framing. No sockets here, so all of it
// is unit-tested directly (tests/unit/test_server.cpp); the sessions only route and move bytes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/generation.h"
#include "server/response_store.h"

namespace ft::server {

// The JSON body of an error: param/code are null when empty.
std::string error_body(const ApiError& e);

// Native: llama.cpp's /completion, Infill its /infill; Embeddings: /v1/embeddings,
// NativeEmbeddings llama.cpp's /embedding (parsed into an Embeddings request); Messages:
// Anthropic's /v1/messages.
enum class Endpoint { Completions, Chat, Responses, Native, Infill, Embeddings, NativeEmbeddings, Messages };

// What parsing needs to know about the served model.
struct ModelInfo {
  std::string id;     // the name clients must send as "model"
  int64_t n_ctx = 0;  // positions per sequence
  int32_t n_vocab = 0;
  // Whether a LoRA adapter of this name is loaded (clients may send it as "model"); null: none.
  std::function<bool(const std::string&)> has_adapter;
  int32_t n_embd = 0;  // an embedding's dimensions
  std::vector<std::string> aliases = {};  // other names of the served model (--served-model-name NAME,ALIAS)
  // name as the model's id when it is one of its aliases, else name.
  std::string canonical(const std::string& name) const {
    return std::find(aliases.begin(), aliases.end(), name) != aliases.end() ? id : name;
  }
};

inline constexpr int64_t kCompletionsMaxTokens = 16;  // OpenAI's default for /v1/completions
// A batched completions request: at most this many choices in all (prompts x max(n, best_of)).
inline constexpr int64_t kMaxBatchChoices = 256;
inline constexpr int64_t kMaxEmbeddingInputs = 2048;  // an embeddings request's inputs (OpenAI's limit)
inline constexpr int64_t kPriorityBound = int64_t(1) << 30;  // vLLM's priority field: within +-this

// A validated /v1/completions or /v1/chat/completions request: the generation (OpenAI's
// sampling defaults; max_tokens absent: completions 16 cut to the context, chat the rest of the
// context; logprobs from completions' `logprobs: N` or chat's `logprobs: true` + `top_logprobs: N`)
// and what only HTTP has.
enum class ToolChoice { None, Auto, Required, Named };

struct ParsedRequest : GenerationRequest {
  Endpoint kind = Endpoint::Completions;
  std::string model;
  bool include_usage = false;  // stream_options.include_usage
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries the
  // usage so far (the prompts', and the tokens streamed until then).
  bool continuous_usage = false;
  bool echo = false;           // completions: the prompt before each choice's text (with logprobs: its tokens' too)
  bool echo_only = false;      // echo with max_tokens 0 (native: n_predict 0): the prompt alone (its one generated token is dropped)
  // vLLM's prompt_logprobs = N (-1: off): each prompt token's logprob, rank and N best
  // alternatives, in the response (completions: each choice's "prompt_logprobs"; chat: the
  // response's), never streamed. GenerationRequest::prompt_logprobs is what the engine scores:
  // the larger of this and echo's.
  int32_t report_prompt_logprobs = -1;
  bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
  // Completions' prompt as an array of prompts: the second and later ones (the first is
  // prompt_text / prompt_tokens, of the same kind), each generated as a request of its own with
  // the same parameters; prompt i's choices are the response's i*n .. i*n + n - 1 (OpenAI's order).
  std::vector<std::string> more_texts;
  std::vector<std::vector<int32_t>> more_tokens;
  nlohmann::json response_format;  // {"type": "json_object" | "json_schema", ...}; null: text
  ToolChoice tool_choice = ToolChoice::None;
  std::string tool_name;           // Named: the function
  // parallel_tool_calls (Anthropic: !disable_parallel_tool_use): false keeps at most one call,
  // the first, under every tool choice (Required: the grammar allows one).
  bool parallel_tool_calls = true;
  // Chat: `functions` given, not `tools` (OpenAI's deprecated form): one call at most, answered as
  // message.function_call and finish_reason "function_call" (as_function_call).
  bool legacy_functions = false;
  // Responses API: what the response object echoes of the request (tools and tool_choice as
  // given, parallel_tool_calls, text, instructions, sampling, limits, metadata).
  nlohmann::json responses_echo = nlohmann::json::object();
  // Responses API: keep the response when it finishes (store: true, and a store to keep it in),
  // with its request's own input items (references resolved, each with an id: ResponseStore::Entry).
  bool store_response = false;
  // Responses API: background: true (stored at once as queued; the generation outlives the request,
  // its answer or stream only a view of it; POST /v1/responses/{id}/cancel stops it).
  bool background = false;
  // Responses API: the conversation it continues (the Conversations API's id; "" when none), which
  // takes its input's items (responses_input, then, stored or not) and its output's when it ends
  // completed or incomplete.
  std::string conversation;
  // ... held for it (ConversationStore::claim: one response at a time on a conversation) until
  // the last copy goes: its reply's, which lets it go when it ends.
  std::shared_ptr<void> conversation_claim;
  nlohmann::json responses_input = nlohmann::json::array();
  bool base64 = false;  // embeddings: encoding_format "base64" (little-endian float32s)
  bool llama_embeddings = false;  // embeddings: llama.cpp's /embedding answer (llama_embeddings_response)
  // embeddings: llama.cpp's embd_normalize: -1 none, 0 max-abs to 32760, 2 euclidean (the
  // default), p > 0 the p-norm; vLLM's normalize false = -1.
  int32_t embd_normalize = 2;
  // Fields that are neither OpenAI's nor a known vLLM/llama.cpp extension (the server warns), and
  // known ones that mean nothing here (the server logs them at debug).
  std::vector<std::string> unknown_fields, ignored_fields;
};

// The raw text of the schemas a request carries, each empty where it has none (the parsed value,
// keys sorted, stands in): views into the client's body. A schema's properties are generated in
// the order its text lists them, so each is read again from its own text (a body is parsed with
// its objects' keys sorted; never the whole body as ordered_json: its lookups scan the keys, and
// a logit_bias of 100,000 keys would be quadratic).
struct SchemaTexts {
  std::string_view response_format;     // response_format.json_schema.schema
  std::string_view guided_json;         // guided_json or json_schema, as an object (a string is its own text)
  std::vector<std::string_view> tools;  // each tool's parameters, as the chat body lists them (tools, then functions)
};
// Those of a chat or completions body.
SchemaTexts schema_texts(std::string_view body);
// The raw text of a valid JSON text's parts: the value at keys (members of nested objects; empty
// where there is none, or it is null), the elements of an array (none: not an array).
std::string_view raw_at(std::string_view json_text, std::initializer_list<std::string_view> keys);
std::vector<std::string_view> raw_elements(std::string_view json_text);

// Parses and validates a request body; throws ApiError naming the offending param: 400 for a
// malformed value or one that cannot be built here ("... is not supported"), 404 model_not_found
// for another model. Every field of OpenAI's Chat Completions / Completions schemas and the vLLM /
// llama.cpp extensions is accepted; an explicit null is the field's absence; any other field is
// listed in unknown_fields, not refused (vLLM's behaviour). Chat's top_logprobs needs logprobs: true.
// schemas: the schemas' text where body is not the client's (a request translated into a chat or
// completions body: the Responses and Messages APIs, /completion); null: body's own.
ParsedRequest parse_request(Endpoint kind, std::string_view body, const ModelInfo& model, const SchemaTexts* schemas = nullptr);

// Content as text: a string, null, or an array of parts (blocks). Text parts ("text", and the
// Responses API's "input_text"/"output_text") are concatenated; "refusal" parts carry no prompt
// text; anything else (images, audio, files) is a 400 naming param[i].type: it cannot be built here.
std::string content_text(const nlohmann::json& c, const std::string& param);
// OpenAI messages -> ChatMessage: content as a string or text parts; roles system, developer
// (= system), user, assistant (with tool_calls / function_call), tool, function (= tool).
// Throws ApiError (400) naming param[i]... .
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages, const std::string& param);

// The body's "model" against the served one (its id or an alias) or a loaded LoRA adapter: 404
// model_not_found when it is neither; 400 when it is not a string, or absent and required.
// Returns the name requests carry: the id for an alias or an absent model, else the name.
std::string check_model(const nlohmann::json& body, const ModelInfo& model, bool required);
// body[name] as a boolean; otherwise ApiError (400) naming it. (name must be present.)
bool get_bool(const nlohmann::json& body, const char* name);

// POST /v1/responses, mapped onto a chat request (the same generation path): input (a string or
// items: messages with input_text/output_text parts, function_call, function_call_output,
// reasoning, and item_reference or an item with only its id: the stored item of that id),
// previous_response_id (its stored conversation first: its chain's input and output items) or
// conversation ("conv_..." or {"id"}: its items first, from `conversations`; unknown: a 404),
// instructions (a system message first; this request's alone), max_output_tokens, temperature,
// top_p, tools ({"type": "function", "name", "parameters"}), tool_choice, text.format (text,
// json_object, json_schema), include "message.output_text.logprobs" (with top_logprobs: each
// output_text token's logprobs, as chat's), store (default true: kept in `store` when it finishes; null store:
// nothing is, and nothing can be referred to). An unknown previous_response_id (or a link of its
// chain no longer stored) is OpenAI's 400 previous_response_not_found; an unknown item id a 400
// naming input[i].id; an item id twice in the conversation a 400; metadata as check_metadata takes
// it. Stored prompts and built-in tools are 400 "... is not supported".
ParsedRequest parse_responses_request(std::string_view body, const ModelInfo& model,
                                      const ResponseStore* store = nullptr,
                                      ConversationStore* conversations = nullptr);
// OpenAI's metadata (a Responses request's, a conversation's): an object of at most 16 pairs, keys
// of at most 64 characters, values strings of at most 512; otherwise ApiError (400) naming param.
void check_metadata(const nlohmann::json& metadata, const std::string& param);
// The Conversations API: items added at a time (POST /v1/conversations, .../items), at most.
inline constexpr int64_t kMaxConversationItems = 20;
// The Conversations API's items (its `items`, at most kMaxConversationItems): checked and
// normalised as a Responses request's input items are (references resolved from `store`, each
// given an id where it has none, as a stored response keeps them); otherwise ApiError (400)
// naming items[i]... .
nlohmann::json conversation_items(const nlohmann::json& items, const ResponseStore* store);
// A Responses request's `conversation`: "conv_..." or {"id": "conv_..."} -> its id (else a 400).
std::string conversation_id(const nlohmann::json& conversation);
// OpenAI's 404 for a conversation not stored (never, evicted or deleted), naming param.
ApiError conversation_not_found(std::string_view id, const std::string& param);
// OpenAI's 400 conversation_locked: a response runs on it (ConversationStore::Change::kBusy).
ApiError conversation_locked();
// What refuses a conversation grown past its cap (ConversationStore::max_conversation_bytes):
// "conversation '{id}' would be larger than ..." (id "": the new conversation).
std::string conversation_over_cap(std::string_view id, uint64_t cap);
// What refuses what needs the response store where it is off: "{what} need the response store, ...".
std::string needs_the_store(std::string_view what);
// llama.cpp's native POST /completion: {"prompt": text | token ids, "n_predict", "stream", its
// sampling fields, "logit_bias" as [[id, bias | false], ...] or an object, "seed" (-1: random),
// "return_tokens"} parsed as a completions request of one choice; "model" optional.
ParsedRequest parse_native_request(std::string_view body, const ModelInfo& model);
// llama.cpp's POST /infill: its /completion request (parse_native_request; "prompt" optional, ""
// when absent) with "input_prefix", "input_suffix" (strings, "" when absent) and "input_extra"
// ([{"filename", "text"}]) into GenerationRequest::infill. The request's kind stays Native: the
// answer is /completion's.
ParsedRequest parse_infill_request(std::string_view body, const ModelInfo& model);
// POST /v1/embeddings (OpenAI's, with vLLM's and llama.cpp's extensions): input (a string, token
// ids, or an array of up to kMaxEmbeddingInputs of either; each its own generation, pooled by the
// server's --pooling), model (optional), encoding_format (float | base64), dimensions (only the
// model's own), add_special_tokens, truncate_prompt_tokens, normalize / embd_normalize, priority,
// cache_salt. Other fields are listed in unknown_fields.
ParsedRequest parse_embeddings_request(std::string_view body, const ModelInfo& model);
// llama.cpp's POST /embedding (and /embeddings): its "content" (or "input") as /v1/embeddings'
// input, its embd_normalize; answered by llama_embeddings_response.
ParsedRequest parse_native_embeddings_request(std::string_view body, const ModelInfo& model);
// [{"index", "embedding": [[floats]]}]: llama.cpp's /embedding answer, one pooled vector per input.
nlohmann::json llama_embeddings_response(const std::vector<std::vector<float>>& vectors);
// v scaled by its norm (ParsedRequest::embd_normalize; -1: unchanged; a zero vector stays zero).
void normalize_embedding(std::vector<float>& v, int32_t norm);
// v's float32s, little-endian, in base64 (OpenAI's encoding_format "base64").
std::string base64_floats(const std::vector<float>& v);
// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}.
nlohmann::json embeddings_response(const std::string& model, const std::vector<std::vector<float>>& vectors, bool base64,
                                   int64_t prompt_tokens);
// Its response, or a streamed piece of it: {"index", "content", "tokens" (ids, with return_tokens),
// "id_slot", "stop", "model"}, and once stop: "tokens_predicted", "tokens_evaluated", "stop_type"
// ("eos" | "word" | "limit"), "stopping_word", "truncated", "has_new_line", with timings
// "tokens_cached" and "timings" (prompt_n, prompt_ms, predicted_n, predicted_ms, ... cache_n).
// Its completion_probabilities (n_probs) of these tokens: [{"id", "token", "bytes", "logprob",
// "top_logprobs": [{"id", "token", "bytes", "logprob"}]}] (token: the piece, bytes its raw bytes).
nlohmann::json native_probs(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps);
struct NativeTimings {
  int64_t prompt_n = 0, cached_n = 0, predicted_n = 0;
  double prompt_ms = 0, predicted_ms = 0;
};
nlohmann::json native_chunk(const std::string& model, const std::string& content, const std::vector<int32_t>& tokens,
                            bool stop, int64_t predicted, int64_t evaluated, const std::string& stop_type = "none",
                            const std::string& stopping_word = "", const NativeTimings* timings = nullptr);

// Parses a JSON body into an object (400 on malformed JSON or a non-object).
nlohmann::json parse_json_object(std::string_view body);

// --- responses ---------------------------------------------------------------------------
// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}
// (details false: without prompt_tokens_details, for vLLM's continuous_usage_stats chunks, which
// come before the prefix cache's count is known).
nlohmann::json usage_json(const Usage& u, bool details = true);

// Identity of one response, shared by all its chunks.
struct ResponseMeta {
  Endpoint kind = Endpoint::Completions;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// One generated token's log-probability and its best alternatives (best first); text is the
// tokenizer's token_to_piece (raw bytes, maybe a partial UTF-8 sequence). An echoed prompt's first
// token has logprob NaN: completions report null for it and its top_logprobs.
struct TokenLogprob {
  std::string text;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};
// A reasoning model's output split as DeepSeek R1's is written (llama.cpp's reasoning_format
// deepseek, vLLM's deepseek_r1 parser): what comes before "</think>" is reasoning, what follows it
// is content. The reasoning opens with a "<think>" at the output's start, or is already open when
// the prompt's generation turn ended with one (open_at_start: R1's templates). push() takes text
// as it streams and returns what can be released of each; a tail that may still become a tag is
// held back until the next push or the end (final). Without "<think>" it is all content.
struct ReasoningParts {
  std::string reasoning, content;
};

// gpt-oss's output in its harmony format (the text after the prompt's "<|start|>assistant", its
// control tokens rendered as text: HttpSession generates a harmony model's chat with
// skip_special_tokens off): messages
//   [<|start|>assistant][<|channel|>CHANNEL][ to=RECIPIENT][ <|constrain|>TYPE]<|message|>BODY<|end|>
// (the recipient may come before the channel too; the last message's <|return|> or <|call|> ends
// the generation: not in the text). A body goes by its channel: analysis -> reasoning; final,
// commentary and any other -> content; to=functions.NAME -> a call (its body the arguments'
// JSON text, whatever the channel); to= another recipient (a built-in tool's: browser, python)
// -> reasoning. Headers and the markers between messages are dropped. An output that does not
// start as harmony (a grammar's JSON, a model off its format) is content throughout. raw
// (--reasoning-format none): every byte but the calls' messages is content, markup and all.
// push() takes text as it streams and returns what can be released; a tail that may become a
// marker is held back until the next push or the end (final).
class HarmonySplit {
 public:
  explicit HarmonySplit(bool raw = false) : raw_(raw) {}
  ReasoningParts push(std::string_view text, bool final);
  bool reasoned() const { return reasoned_; }  // an analysis body was seen (it may be empty)
  bool in_reasoning() const { return state_ == State::Body && kind_ == Kind::Reasoning; }
  // The calls whose messages have ended (all of them after the final push): id, name (the
  // recipient less "functions.") and arguments (the body, trimmed); taken.
  std::vector<ToolCall> take_calls() { return std::exchange(calls_, {}); }
  // Before the final push of a generation cut short (max_tokens): a call whose message is still
  // open is unfinished (its <|call|> never came), so it is not a call: its arguments so far are
  // content.
  void cut_short() { cut_ = true; }

 private:
  enum class State { Start, Header, Body, Plain } state_ = State::Start;
  enum class Kind { Reasoning, Content, Call } kind_ = Kind::Content;
  void open_body(ReasoningParts& out);  // header_ is complete: classify the message
  void close_body();                    // the message ended
  void close_last(ReasoningParts& out);  // the final push's open message
  void emit(ReasoningParts& out, std::string_view text);  // body text by kind_
  bool raw_;
  std::string held_;    // not yet looked at (a tail that may become a marker)
  std::string header_;  // the header so far (with its markers)
  std::string call_name_, call_args_;
  std::vector<ToolCall> calls_;
  bool reasoned_ = false;
  bool cut_ = false;
};

// A chat's reasoning split off its output: R1-style <think> (ReasoningSplit(open_at_start)) or
// gpt-oss's harmony channels (ReasoningSplit(HarmonySplit)).
class ReasoningSplit {
 public:
  explicit ReasoningSplit(bool open_at_start) : state_(open_at_start ? State::Reasoning : State::Start) {}
  explicit ReasoningSplit(HarmonySplit h) : state_(State::Start), harmony_(std::move(h)) {}
  using Parts = ReasoningParts;
  Parts push(std::string_view text, bool final);
  bool reasoned() const { return harmony_ ? harmony_->reasoned() : reasoned_; }  // a reasoning part was seen (it may be empty)
  bool in_reasoning() const { return harmony_ ? harmony_->in_reasoning() : state_ == State::Reasoning; }
  HarmonySplit* harmony() { return harmony_ ? &*harmony_ : nullptr; }
  void cut_short() {
    if (harmony_) harmony_->cut_short();
  }

 private:
  enum class State { Start, Reasoning, Content } state_;
  std::string held_;
  size_t lead_ = 0;  // Start: held_'s leading whitespace so far
  bool reasoned_ = false;
  std::optional<HarmonySplit> harmony_;
};

// The choice's "logprobs" object for these tokens.
//   completions: {"tokens": [text], "token_logprobs": [lp], "top_logprobs": [{text: lp}],
//                 "text_offset": [character offset of each token in the completion, from text_offset0]}
// (text_offset counts code points, as OpenAI and vLLM do: text_offset_length of the pieces before.)
//   chat:        {"content": [{"token", "logprob", "bytes": [u8], "top_logprobs": [{"token",
//                 "logprob", "bytes"}]}]}
nlohmann::json logprobs_json(Endpoint kind, const std::vector<TokenLogprob>& toks, int64_t text_offset0 = 0);
// A piece's length as text_offset counts it: its code points, i.e. the bytes that are not UTF-8
// continuation bytes (10xxxxxx). A character split over tokens counts once, at the token with its
// first byte; the pieces of a text add up to its code points; never negative.
int64_t text_offset_length(std::string_view piece);

// One choice of a non-streaming body. finish_reason: "stop" | "length" | "tool_calls".
// logprobs: the choice's "logprobs" (null when not requested). tool_calls (chat;
// tool_calls_json): the message's calls, its content null when text is empty.
nlohmann::json completion_choice(Endpoint kind, int32_t index, const std::string& text, const std::string& finish_reason,
                                 const nlohmann::json& logprobs = nullptr, const nlohmann::json& tool_calls = nullptr);
// The deprecated functions API's shape of a chat choice (response or chunk; ParsedRequest::
// legacy_functions): its message's (delta's) first tool call's function as "function_call" (a
// streamed one's "name" on its first delta, then "arguments" pieces), finish_reason "tool_calls"
// as "function_call".
void as_function_call(nlohmann::json& choice);
// vLLM's stop_reason of a finished choice: the stop string or stop_token_ids entry that ended it,
// else null (an end-of-generation token, a length limit).
nlohmann::json stop_reason_json(const Finish& f);
// Non-streaming body of these choices (completion_choice's, in index order).
nlohmann::json completion_response(const ResponseMeta& m, nlohmann::json choices, const Usage& u);
// ... of one choice (index 0).
nlohmann::json completion_response(const ResponseMeta& m, const std::string& text,
                                   const std::string& finish_reason, const Usage& u,
                                   const nlohmann::json& logprobs = nullptr, const nlohmann::json& tool_calls = nullptr);
// One streamed chunk's JSON: text (completions) or delta.content (chat) of choice `index`.
// first: chat's delta carries role "assistant". finish_reason empty -> null. with_usage_null:
// include "usage": null (OpenAI does so on every chunk when stream_options.include_usage is set).
nlohmann::json stream_chunk(const ResponseMeta& m, const std::string& text, bool first,
                            const std::string& finish_reason, bool with_usage_null,
                            const nlohmann::json& logprobs = nullptr, int32_t index = 0);
// The final usage-only chunk (choices []).
nlohmann::json usage_chunk(const ResponseMeta& m, const Usage& u);
// The Responses API: the response object (status "in_progress" | "completed" | "incomplete";
// incomplete_reason e.g. "max_output_tokens"; u null while in progress; request: the fields it
// echoes, ParsedRequest::responses_echo, over OpenAI's defaults), its output items, and one
// streamed event ("event: TYPE\ndata: {json with type and sequence_number}\n\n").
nlohmann::json responses_object(const ResponseMeta& m, const std::string& status, const nlohmann::json& output,
                                const Usage* u, const std::string& incomplete_reason = "",
                                const nlohmann::json& request = nlohmann::json::object());
// logprobs: its output_text part's (chat's "content" entries: {"token", "logprob", "bytes", "top_logprobs"}).
nlohmann::json responses_message_item(const std::string& id, const std::string& text, const std::string& status,
                                      const nlohmann::json& logprobs = nlohmann::json::array());
nlohmann::json responses_call_item(const ToolCall& c, const std::string& status);
// A reasoning model's thinking: {"type": "reasoning", "id", "status", "summary": [], "content":
// [{"type": "reasoning_text", "text"}]} (content empty while in progress).
nlohmann::json responses_reasoning_item(const std::string& id, const std::string& text, const std::string& status);
std::string responses_event(const std::string& type, nlohmann::json data, int64_t sequence_number);
// A typed SSE event (the Responses and Messages APIs'): "event: TYPE\ndata: {json with type}\n\n".
std::string typed_event(const std::string& type, nlohmann::json data);

// --- Anthropic's Messages API ------------------------------------------------------------
// POST /v1/messages (and /v1/messages/count_tokens: count_only, max_tokens not required), mapped
// onto a chat request (the same generation path): model, max_tokens (a cap: cut to the context,
// as llama.cpp does), messages (user/assistant turns; content a string or blocks: text, tool_use,
// tool_result, thinking (dropped: earlier reasoning is not re-read); consecutive turns of one role
// combined, as Anthropic does; a final assistant turn is a prefill the answer continues), system
// (a string or text blocks), stop_sequences, stream, temperature, top_p, top_k, tools ({"name",
// "description", "input_schema"}), tool_choice (auto, any, tool, none; disable_parallel_tool_use),
// thinking (enabled/disabled: the template's enable_thinking), output_format / output_config.format
// (json_schema). Images, documents, server tools and MCP servers are 400 "... not supported".
// The vLLM / llama.cpp sampling and structured-output extensions (seed, min_p, repetition_penalty,
// chat_template_kwargs, priority, ttft_slo_ms, guided_choice, guided_json, grammar) pass through;
// other fields are listed in unknown_fields.
ParsedRequest parse_messages_request(std::string_view body, const ModelInfo& model, bool count_only = false);
// Anthropic's error: {"type": "error", "error": {"type", "message"}}, its type from the status
// (invalid_request_error, authentication_error, not_found_error, rate_limit_error, api_error, ...).
std::string anthropic_error_body(const ApiError& e);
const char* anthropic_error_type(int status);
// Why a message ended: "end_turn", "max_tokens", "stop_sequence" (sequence: the stop string) or
// "tool_use" (tool_use: the answer holds calls).
struct MessagesStop {
  std::string reason;
  nlohmann::json sequence = nullptr;
};
MessagesStop messages_stop(const Finish& f, bool tool_use);
// {"input_tokens", "output_tokens"}.
nlohmann::json messages_usage(const Usage& u);
// The message object: {"id", "type": "message", "role": "assistant", "model", "content",
// "stop_reason", "stop_sequence", "usage"} (stop null: in progress, message_start's). Ordered: a
// tool_use block's input keeps the order its arguments were written in (the schema's).
nlohmann::ordered_json messages_response(const ResponseMeta& m, nlohmann::ordered_json content, const MessagesStop* stop,
                                         const Usage& u);
// A call as a content block: {"type": "tool_use", "id": "toolu_...", "name", "input": its arguments,
// their keys in the order written}.
nlohmann::ordered_json messages_tool_use_block(const ToolCall& c);

// "data: {json}\n\n" and "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// --- tool calls ------------------------------------------------------------------------------
// The calls in a generation's text and the text around them. Named: the text is the function's
// arguments (the grammar made it so). Required: a JSON array [{"name", "arguments"}] (ditto).
// Auto: the formats models emit on their own: <tool_call>{"name", "arguments"}</tool_call>
// (Hermes, Qwen2.5; repeated), [TOOL_CALLS][...] (Mistral), <|python_tag|>{...} and a whole
// output {"name", "parameters" | "arguments"} or an array of them (Llama 3.x), and
// <function=NAME>{...}</function> (Functionary); text may precede a marker's calls (it is the
// content); a call naming no function of `tools` is not one.
// Arguments come back as JSON text; ids are "call_" + 24 hex digits.
struct FoundToolCalls {
  std::vector<ToolCall> calls;
  std::string content;  // the text outside the calls (all of it when there are none)
};
// held: text that a stream held back (ToolCallHold::take) after releasing what came before it:
// the content keeps the whitespace between that and the calls ("Hello" released, then "\n\n<tool_call>
// ...</tool_call>\n\nBye": "\n\n\n\nBye"), so released + content is the whole text's content.
FoundToolCalls extract_tool_calls(ToolChoice choice, const std::string& tool_name, const nlohmann::json& tools,
                                  std::string_view text, bool held = false);
// A streamed generation's text under a tool choice: what may go out as content at once, and what
// is held back for extract_tool_calls at the end. Auto: the output's start while it may be a call
// (all of it when its first non-space bytes are "{", "[" or a marker: the JSON forms are whole
// outputs; while they may become a marker), then, once it is text, everything from
// the first call marker on (text before a call streams, as vLLM's and llama.cpp's parsers stream
// it), and meanwhile a tail that may become a marker and trailing whitespace (around a call it is
// not content). Required and Named (all): everything.
class ToolCallHold {
 public:
  explicit ToolCallHold(bool all = false) : in_call_(all) {}
  // Appends text; returns the part that may be released now (maybe empty).
  std::string push(std::string_view text);
  // What is held (at the end: the text to look for calls in, extract_tool_calls' held), leaving
  // nothing held.
  std::string take() {
    ws_tail_ = 0;
    return std::exchange(held_, {});
  }
  bool released() const { return released_; }  // some text went out

 private:
  std::string held_;
  size_t ws_tail_ = 0;       // held_'s trailing whitespace (kept as it grows: each byte is looked at once)
  bool past_start_ = false;  // the output's start was text, not a call
  bool in_call_;             // a marker came (or all): everything from it is held
  bool released_ = false;
};
// gpt-oss's calls (HarmonySplit::take_calls) under a tool choice: under auto, the ones naming a
// function of `tools` are calls; the others' arguments are content (one per line), as are all of
// them under none. (Required and Named constrain the output to plain JSON: extract_tool_calls.)
FoundToolCalls harmony_tool_calls(std::vector<ToolCall> calls, ToolChoice choice, const nlohmann::json& tools);
// parallel_tool_calls false: the first call only (OpenAI: at most one); the others are dropped.
FoundToolCalls at_most_one_call(FoundToolCalls found, bool parallel);
// A fresh id: prefix + 24 random hex digits (not guessable: stored responses are read by id).
std::string new_item_id(std::string_view prefix);
// A fresh tool-call id: new_item_id("call_").
std::string new_tool_call_id();
// [{"id", "type": "function", "function": {"name", "arguments"}}] (streamed: with "index" too).
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index = false);
// A streamed chat chunk whose delta carries tool_calls (entries as tool_calls_json's, or partial).
nlohmann::json tool_calls_chunk(const ResponseMeta& m, const nlohmann::json& tool_calls, bool with_usage_null,
                                int32_t index = 0);

// --- access --------------------------------------------------------------------------------
// The Access-Control-Allow-Origin value for a request from `origin` under --allowed-origins
// (comma-separated; "*" = any), or "" when it is not allowed.
std::string cors_allow_origin(std::string_view allowed, std::string_view origin);
// Whether a request carries the key: an Authorization header "Bearer <api_key>" (OpenAI's
// clients) or an x-api-key header "<api_key>" (Anthropic's), compared in constant time.
bool authorized(std::string_view api_key, std::string_view authorization, std::string_view x_api_key = {});
// An X-Request-Id to echo and log: as given when it is 1..128 of [A-Za-z0-9._:-], else "".
std::string request_id(std::string_view header);

// --- HTTP framing --------------------------------------------------------------------------
// A complete HTTP/1.1 response with Content-Length. extra_headers: "Name: value\r\n" lines.
std::string http_response(int status, std::string_view content_type, std::string_view body,
                          bool keep_alive, std::string_view extra_headers = {});
// The head of a chunked text/event-stream response; extra_headers as above.
std::string sse_response_head(bool keep_alive, std::string_view extra_headers = {});
// One chunk of chunked transfer encoding ("" -> the last chunk "0\r\n\r\n").
std::string http_chunk(std::string_view data);
const char* status_text(int status);

}  // namespace ft::server
