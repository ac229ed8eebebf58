// The OpenAI-compatible API as pure functions: request parsing/validation, response and SSE
// formatting, raw HTTP/1.1 response framing. No sockets here, so all of it
// is unit-tested directly (tests/unit/test_server.cpp); the sessions only route and move bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/generation.h"

namespace ft::server {

// The JSON body of an error: param/code are null when empty.
std::string error_body(const ApiError& e);

enum class Endpoint { Completions, Chat };

// What parsing needs to know about the served model.
struct ModelInfo {
  std::string id;     // the name clients must send as "model"
  int64_t n_ctx = 0;  // positions per sequence
  int32_t n_vocab = 0;
};

inline constexpr int64_t kCompletionsMaxTokens = 16;  // OpenAI's default for /v1/completions

// A validated /v1/completions or /v1/chat/completions request: the generation (OpenAI's
// sampling defaults; max_tokens absent: completions 16 cut to the context, chat the rest of the
// context; logprobs from completions' `logprobs: N` or chat's `logprobs: true` + `top_logprobs: N`)
// and what only HTTP has.
struct ParsedRequest : GenerationRequest {
  Endpoint kind = Endpoint::Completions;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses and validates a request body; throws ApiError (400) naming the offending param.
// Unknown fields are rejected like OpenAI does ("Unrecognized request argument supplied"),
// except a few OpenAI fields accepted at their only supported value (n=1, echo=false, best_of=1,
// user, logit_bias={}). Chat's top_logprobs needs logprobs: true.
ParsedRequest parse_request(Endpoint kind, std::string_view body, const ModelInfo& model);

// Parses a JSON body into an object (400 on malformed JSON or a non-object).
nlohmann::json parse_json_object(std::string_view body);

// --- responses ---------------------------------------------------------------------------
nlohmann::json usage_json(const Usage& u);

// Identity of one response, shared by all its chunks.
struct ResponseMeta {
  Endpoint kind = Endpoint::Completions;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
};

// One generated token's log-probability and its best alternatives (best first); text is the
// tokenizer's token_to_piece (raw bytes, maybe a partial UTF-8 sequence).
struct TokenLogprob {
  std::string text;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};
// The choice's "logprobs" object for these tokens.
//   completions: {"tokens": [text], "token_logprobs": [lp], "top_logprobs": [{text: lp}],
//                 "text_offset": [byte offset of each token in the completion, from text_offset0]}
//   chat:        {"content": [{"token", "logprob", "bytes": [u8], "top_logprobs": [{"token",
//                 "logprob", "bytes"}]}]}
nlohmann::json logprobs_json(Endpoint kind, const std::vector<TokenLogprob>& toks, int64_t text_offset0 = 0);

// Non-streaming body. finish_reason: "stop" | "length". logprobs: the choice's "logprobs"
// (null when not requested).
nlohmann::json completion_response(const ResponseMeta& m, const std::string& text,
                                   const std::string& finish_reason, const Usage& u,
                                   const nlohmann::json& logprobs = nullptr);
// One streamed chunk's JSON: text (completions) or delta.content (chat). first: chat's delta
// carries role "assistant". finish_reason empty -> null. with_usage_null: include "usage": null
// (OpenAI does so on every chunk when stream_options.include_usage is set).
nlohmann::json stream_chunk(const ResponseMeta& m, const std::string& text, bool first,
                            const std::string& finish_reason, bool with_usage_null,
                            const nlohmann::json& logprobs = nullptr);
// The final usage-only chunk (choices []).
nlohmann::json usage_chunk(const ResponseMeta& m, const Usage& u);
// "data: {json}\n\n" and "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// --- HTTP framing --------------------------------------------------------------------------
// A complete HTTP/1.1 response with Content-Length. extra_headers: "Name: value\r\n" lines.
std::string http_response(int status, std::string_view content_type, std::string_view body,
                          bool keep_alive, std::string_view extra_headers = {});
// The head of a chunked text/event-stream response.
std::string sse_response_head(bool keep_alive);
// One chunk of chunked transfer encoding ("" -> the last chunk "0\r\n\r\n").
std::string http_chunk(std::string_view data);
const char* status_text(int status);

}  // namespace ft::server
