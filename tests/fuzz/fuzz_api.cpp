// libFuzzer target: the OpenAI request parser (server/api.cpp) on arbitrary bodies, as the HTTP
// session uses it: byte 0 picks the endpoint (bit 1: /v1/embeddings, else bit 0: chat or
// completions), the rest is the body. A bad body must be an
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
  try {
    if (data[0] & 2) {
      const ft::server::ParsedRequest r = ft::server::parse_embeddings_request(body, model);
      FT_FUZZ_CHECK(r.model == model.id && r.embed);
      FT_FUZZ_CHECK(int64_t(1 + r.more_texts.size() + r.more_tokens.size()) <= ft::server::kMaxEmbeddingInputs);
      for (const int32_t id : r.prompt_tokens) FT_FUZZ_CHECK(id >= 0 && id < model.n_vocab);
      FT_FUZZ_CHECK(r.embd_normalize >= -1);
      std::vector<float> v(16, 0.25f);
      ft::server::normalize_embedding(v, r.embd_normalize);
      (void)ft::server::embeddings_response(r.model, {v}, r.base64, 1).dump();
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
    FT_FUZZ_CHECK(nlohmann::json::accept(ft::server::error_body(e)));
  }
  return 0;
}
