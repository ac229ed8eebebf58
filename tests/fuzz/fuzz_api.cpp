// libFuzzer target: the OpenAI request parser (server/api.cpp) and Anthropic's (messages_api.cpp)
// on arbitrary bodies, as the HTTP session uses them: byte 0 picks the endpoint (bit 2:
// /v1/messages, with bit 3 its count_tokens; else bits 0, 1 and 3: /v1/responses; else bit 1:
// /v1/embeddings, with bit 3 llama.cpp's /embedding; else bit 0: chat or completions), the rest is
// the body. A bad body must be an
// ApiError with a 4xx status, whose error body (what the client gets) is valid JSON; a body that
// parses gives a request whose values are in the ranges the engine takes, and its response
// chunks serialize.
#include <cstdint>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "server/api.h"

using ft::server::ApiError;
using ft::server::Endpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Endpoint kind = data[0] & 1 ? Endpoint::Chat : Endpoint::Completions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const ft::server::ModelInfo model{"m", 64, 512, {}, 16};
  bool anthropic = false;
  try {
    if (data[0] & 4) {
      anthropic = true;
      const bool count_only = data[0] & 8;
      const ft::server::ParsedRequest r = ft::server::parse_messages_request(body, model, count_only);
      FT_FUZZ_CHECK(r.model == model.id && r.kind == Endpoint::Messages && r.fit_max_tokens && !r.messages.empty());
      FT_FUZZ_CHECK(count_only || (r.max_tokens && *r.max_tokens >= 1 && *r.max_tokens <= model.n_ctx));
      for (const auto& m : r.messages) FT_FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool");
      const ft::server::ResponseMeta meta{Endpoint::Messages, "msg_1", 0, r.model};
      const ft::server::MessagesStop stop{"end_turn"};
      nlohmann::ordered_json blocks = nlohmann::ordered_json::array({{{"type", "text"}, {"text", r.messages.back().content}}});
      for (const auto& c : r.messages.front().tool_calls) blocks.push_back(ft::server::messages_tool_use_block(c));
      (void)ft::server::typed_event("message_start", {{"message", ft::server::messages_response(meta, blocks, &stop, {1, 1})}});
      return 0;
    }
    if ((data[0] & 3) == 3 && (data[0] & 8)) {  // the Responses API (a store holding one response to refer to)
      static ft::server::ResponseStore* const store = [] {
        auto* s = new ft::server::ResponseStore(4, 1 << 20);
        ft::server::ResponseStore::Entry e;
        e.id = "resp_a";
        for (const char* id : {"msg_a", "fc_a", "rs_a"})
          e.output.push_back({id, nlohmann::json{{"type", id[0] == 'm' ? "message" : id[0] == 'f' ? "function_call" : "reasoning"},
                                                 {"id", id}, {"role", "assistant"}, {"content", "x"}, {"name", "f"}}.dump()});
        e.response = "{}";
        s->put(std::move(e));
        return s;
      }();
      const ft::server::ParsedRequest r = ft::server::parse_responses_request(body, model, store);
      FT_FUZZ_CHECK(r.model == model.id && r.kind == Endpoint::Responses && !r.messages.empty());
      const ft::server::ResponseMeta meta{Endpoint::Responses, "resp_1", 0, r.model};
      const ft::server::Usage u{1, 1};
      (void)ft::server::responses_object(meta, "completed", nlohmann::json::array(), &u, "", r.responses_echo).dump();
      return 0;
    }
    if (data[0] & 2) {
      const ft::server::ParsedRequest r = data[0] & 8 ? ft::server::parse_native_embeddings_request(body, model)
                                                      : ft::server::parse_embeddings_request(body, model);
      FT_FUZZ_CHECK(r.model == model.id && r.embed);
      FT_FUZZ_CHECK(int64_t(1 + r.more_texts.size() + r.more_tokens.size()) <= ft::server::kMaxEmbeddingInputs);
      for (const int32_t id : r.prompt_tokens) FT_FUZZ_CHECK(id >= 0 && id < model.n_vocab);
      FT_FUZZ_CHECK(r.embd_normalize >= -1);
      std::vector<float> v(16, 0.25f);
      ft::server::normalize_embedding(v, r.embd_normalize);
      (void)(r.llama_embeddings ? ft::server::llama_embeddings_response({v}) : ft::server::embeddings_response(r.model, {v}, r.base64, 1)).dump();
      return 0;
    }
    const ft::server::ParsedRequest r = ft::server::parse_request(kind, body, model);
    FT_FUZZ_CHECK(r.model == model.id);
    if (r.max_tokens) FT_FUZZ_CHECK(*r.max_tokens >= 1 && *r.max_tokens <= model.n_ctx);
    for (const int32_t id : r.prompt_tokens) FT_FUZZ_CHECK(id >= 0 && id < model.n_vocab);
    const int64_t n = ft::server::resolve_max_tokens(r, int64_t(r.prompt_tokens.size()), model.n_ctx);
    FT_FUZZ_CHECK(n >= 1 && int64_t(r.prompt_tokens.size()) + n <= model.n_ctx);
    const ft::server::ResponseMeta meta{kind, "id", 0, r.model};
    const std::string text = r.prompt_text + (r.messages.empty() ? "" : r.messages.back().content);
    (void)ft::server::sse_event(ft::server::stream_chunk(meta, text, true, "", r.include_usage));
  } catch (const ApiError& e) {
    FT_FUZZ_CHECK(e.status >= 400 && e.status < 500);
    FT_FUZZ_CHECK(nlohmann::json::accept(anthropic ? ft::server::anthropic_error_body(e) : ft::server::error_body(e)));
  }
  return 0;
}
