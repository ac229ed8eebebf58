#include "server/api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <limits>

#include "core/error.h"

namespace ft::server {

using json = nlohmann::json;

std::string error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  // The message may quote the client's bytes (an HTTP target): invalid UTF-8 is replaced.
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

json parse_json_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& msg) { throw ApiError(400, msg, param); }

double get_number(const json& j, const char* name, double lo, double hi) {
  const json& v = j.at(name);
  if (!v.is_number()) bad(name, cat("'", name, "' must be a number"));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad(name, cat("'", name, "' must be in [", lo, ", ", hi, "], got ", x));
  return x;
}

int64_t get_int(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json& v = j.at(name);
  if (!v.is_number_integer()) bad(name, cat("'", name, "' must be an integer"));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(name, cat("'", name, "' is out of range"));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(name, cat("'", name, "' must be in [", lo, ", ", hi, "], got ", x));
  return x;
}

bool get_bool(const json& j, const char* name) {
  const json& v = j.at(name);
  if (!v.is_boolean()) bad(name, cat("'", name, "' must be a boolean"));
  return v.get<bool>();
}

std::vector<int32_t> get_token_ids(const json& arr, const std::string& param, int32_t n_vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const json& t : arr) {
    if (!t.is_number_integer()) bad(param, cat("'", param, "' must be a string or an array of token ids"));
    ids.push_back(check_token_id(t.get<int64_t>(), n_vocab, param));
  }
  return ids;
}

std::string message_content(const json& c, size_t i) {
  const std::string param = cat("messages[", i, "].content");
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) bad(param, "'" + param + "' must be a string or an array of text parts");
  std::string out;  // OpenAI content parts: [{"type": "text", "text": "..."}]
  for (const json& part : c) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
    out += part["text"].get<std::string>();
  }
  return out;
}

}  // namespace

ParsedRequest parse_request(Endpoint kind, std::string_view body, const ModelInfo& model) {
  const json j = parse_json_object(body);
  ParsedRequest r;
  r.kind = kind;
  r.sampling = kOpenAISampling;

  for (const auto& [key, v] : j.items()) {
    static const char* const kKnown[] = {
        "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
        "min_p", "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos",
        "stream", "stream_options", "logprobs", "top_logprobs", "n", "echo", "best_of", "user", "logit_bias",
        "ttft_slo_ms", "priority"};
    bool known = false;
    for (const char* k : kKnown) known = known || key == k;
    if (kind == Endpoint::Completions && (key == "messages" || key == "max_completion_tokens" || key == "top_logprobs"))
      known = false;
    if (kind == Endpoint::Chat && (key == "prompt" || key == "echo" || key == "best_of")) known = false;
    if (!known) bad(key, "Unrecognized request argument supplied: " + key);
    (void)v;
  }

  if (!j.contains("model")) bad("model", "'model' is required");
  if (!j["model"].is_string()) bad("model", "'model' must be a string");
  r.model = j["model"].get<std::string>();
  if (r.model != model.id)
    throw ApiError(400, "The model '" + r.model + "' does not exist; this server serves '" + model.id + "'",
                   "model", "invalid_request_error", "model_not_found");

  if (kind == Endpoint::Completions) {
    if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
    const json& p = j["prompt"];
    if (p.is_string()) {
      r.prompt_text = p.get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      r.prompt_tokens = get_token_ids(p, "prompt", model.n_vocab);
      r.prompt_kind = PromptKind::Tokens;
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt_text = p[0].get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_array()) {
      r.prompt_tokens = get_token_ids(p[0], "prompt", model.n_vocab);
      r.prompt_kind = PromptKind::Tokens;
    } else if (p.is_array() && p.size() > 1 && (p[0].is_string() || p[0].is_array())) {
      bad("prompt", "batched prompts (more than one prompt per request) are not supported yet");
    } else {
      bad("prompt", "'prompt' must be a string or an array of token ids");
    }
  } else {
    r.prompt_kind = PromptKind::Chat;
    if (!j.contains("messages")) bad("messages", "'messages' is required");
    const json& m = j["messages"];
    if (!m.is_array() || m.empty()) bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < m.size(); ++i) {
      const json& msg = m[i];
      const std::string param = cat("messages[", i, "]");
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
        bad(param, "'" + param + "' must be an object with a string 'role'");
      const std::string role = msg["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant")
        bad(param + ".role", "role '" + role + "' is not supported (system, user, assistant)");
      r.messages.push_back({role, msg.contains("content") ? message_content(msg["content"], i) : ""});
    }
  }

  const char* mt = kind == Endpoint::Chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (j.contains(mt) && !j[mt].is_null()) {
    r.max_tokens = get_int(j, mt, 1, model.n_ctx);
  } else if (kind == Endpoint::Completions) {
    r.max_tokens = kCompletionsMaxTokens;
    r.fit_max_tokens = true;
  }
  if (j.contains("temperature") && !j["temperature"].is_null())
    r.sampling.temperature = float(get_number(j, "temperature", 0, 2));
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    r.sampling.top_p = float(get_number(j, "top_p", 0, 1));
    if (r.sampling.top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    const int64_t k = get_int(j, "top_k", -1, std::numeric_limits<int32_t>::max());
    r.sampling.top_k = k < 0 ? 0 : int(k);  // -1 = off (vLLM)
  }
  if (j.contains("min_p") && !j["min_p"].is_null()) r.sampling.min_p = float(get_number(j, "min_p", 0, 1));
  if (j.contains("presence_penalty") && !j["presence_penalty"].is_null())
    r.sampling.presence_penalty = float(get_number(j, "presence_penalty", -2, 2));
  if (j.contains("frequency_penalty") && !j["frequency_penalty"].is_null())
    r.sampling.frequency_penalty = float(get_number(j, "frequency_penalty", -2, 2));
  if (j.contains("repetition_penalty") && !j["repetition_penalty"].is_null()) {
    r.sampling.repetition_penalty = float(get_number(j, "repetition_penalty", 0, 10));
    if (r.sampling.repetition_penalty <= 0) bad("repetition_penalty", "'repetition_penalty' must be > 0");
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    r.sampling.seed = uint64_t(get_int(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    r.seed_set = true;
  }
  if (j.contains("ignore_eos")) r.ignore_eos = get_bool(j, "ignore_eos");
  // Scheduling extensions: a TTFT deadline (ms from arrival) and vLLM's priority (lower first).
  if (j.contains("ttft_slo_ms") && !j["ttft_slo_ms"].is_null()) {
    r.ttft_slo_ms = get_number(j, "ttft_slo_ms", 0, 1e9);
    if (r.ttft_slo_ms <= 0) bad("ttft_slo_ms", "'ttft_slo_ms' must be > 0");
  }
  if (j.contains("priority") && !j["priority"].is_null())
    r.priority = int32_t(get_int(j, "priority", -(1 << 30), 1 << 30));
  if (j.contains("stream") && !j["stream"].is_null()) r.stream = get_bool(j, "stream");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& so = j["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    for (const auto& [k, v] : so.items()) {
      if (k != "include_usage") bad("stream_options." + k, "Unrecognized request argument supplied: stream_options." + k);
      if (!v.is_boolean()) bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
      r.include_usage = v.get<bool>();
    }
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& x : s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or an array of strings");
    }
  }
  // Completions: logprobs = N (null/false = off). Chat: logprobs = bool, top_logprobs = N only
  // with logprobs true (OpenAI's rule).
  const bool has_lp = j.contains("logprobs") && !j["logprobs"].is_null();
  if (kind == Endpoint::Completions) {
    if (has_lp && !(j["logprobs"].is_boolean() && !j["logprobs"].get<bool>()))
      r.logprobs = int32_t(get_int(j, "logprobs", 0, kMaxLogprobs));
  } else {
    const bool lp = has_lp && get_bool(j, "logprobs");
    if (j.contains("top_logprobs") && !j["top_logprobs"].is_null()) {
      const int64_t n = get_int(j, "top_logprobs", 0, kMaxLogprobs);
      if (!lp) bad("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
      r.logprobs = int32_t(n);
    } else if (lp) {
      r.logprobs = 0;
    }
  }
  if (j.contains("n") && !j["n"].is_null() && get_int(j, "n", 1, 1) != 1) bad("n", "only n = 1 is supported");
  if (j.contains("best_of") && !j["best_of"].is_null() && get_int(j, "best_of", 1, 1) != 1)
    bad("best_of", "only best_of = 1 is supported");
  if (j.contains("echo") && get_bool(j, "echo")) bad("echo", "'echo' is not supported yet");
  if (j.contains("user") && !j["user"].is_string() && !j["user"].is_null()) bad("user", "'user' must be a string");
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() &&
      !(j["logit_bias"].is_object() && j["logit_bias"].empty()))
    bad("logit_bias", "'logit_bias' is not supported yet");
  validate(r, model.n_vocab);
  return r;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

static json reason_json(const std::string& r) { return r.empty() ? json(nullptr) : json(r); }

// A piece's raw bytes as a JSON string: invalid UTF-8 (a lone byte token) becomes U+FFFD when
// dumped; "bytes" carries the exact bytes.
static json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

json logprobs_json(Endpoint kind, const std::vector<TokenLogprob>& toks, int64_t text_offset0) {
  if (kind == Endpoint::Chat) {
    json content = json::array();
    for (const auto& t : toks) {
      json top = json::array();
      for (const auto& [text, lp] : t.top)
        top.push_back({{"token", text}, {"logprob", lp}, {"bytes", bytes_json(text)}});
      content.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_json(t.text)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t off = text_offset0;
  for (const auto& t : toks) {
    tokens.push_back(t.text);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [text, lp] : t.top)
      if (!top.contains(text)) top[text] = lp;  // two ids with one piece: the better one (best first)
    tops.push_back(top);
    offsets.push_back(off);
    off += int64_t(t.text.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json completion_response(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                         const Usage& u, const json& logprobs) {
  json choice;
  if (m.kind == Endpoint::Chat) {
    choice = {{"index", 0},
              {"message", {{"role", "assistant"}, {"content", text}}},
              {"logprobs", logprobs},
              {"finish_reason", reason_json(finish_reason)}};
  } else {
    choice = {{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
  }
  return {{"id", m.id},
          {"object", m.kind == Endpoint::Chat ? "chat.completion" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(u)}};
}

json stream_chunk(const ResponseMeta& m, const std::string& text, bool first, const std::string& finish_reason,
                  bool with_usage_null, const json& logprobs) {
  json choice;
  if (m.kind == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    choice = {{"index", 0}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
  } else {
    choice = {{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
  }
  json j = {{"id", m.id},
            {"object", m.kind == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
            {"created", m.created},
            {"model", m.model},
            {"choices", json::array({choice})}};
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseMeta& m, const Usage& u) {
  return {{"id", m.id},
          {"object", m.kind == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", json::array()},
          {"usage", usage_json(u)}};
}

std::string sse_event(const json& j) {
  // Invalid UTF-8 (a byte-level token at the very end) is replaced, never thrown on.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

const char* status_text(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string http_response(int status, std::string_view content_type, std::string_view body, bool keep_alive,
                          std::string_view extra_headers) {
  std::string out = cat("HTTP/1.1 ", status, " ", status_text(status), "\r\nServer: firsttoken\r\nContent-Type: ",
                        content_type, "\r\nContent-Length: ", body.size(),
                        "\r\nConnection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  out.append(extra_headers);
  out += "\r\n";
  out.append(body);
  return out;
}

std::string sse_response_head(bool keep_alive) {
  return cat("HTTP/1.1 200 OK\r\nServer: firsttoken\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             "Connection: ", keep_alive ? "keep-alive" : "close", "\r\nTransfer-Encoding: chunked\r\n\r\n");
}

std::string http_chunk(std::string_view data) {
  if (data.empty()) return "0\r\n\r\n";
  char hex[32];
  std::snprintf(hex, sizeof hex, "%zx\r\n", data.size());
  std::string out = hex;
  out.append(data);
  out += "\r\n";
  return out;
}

}  // namespace ft::server
