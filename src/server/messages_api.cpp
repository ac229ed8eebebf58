// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as a chat request on
// the one generation path: the request is translated into OpenAI's chat form and parsed by
// parse_request, so every limit and check is the chat endpoint's; the answer's formatting is
// here (api.h). Served as llama.cpp and vLLM serve it, for the Anthropic SDKs and Claude Code.
#include <algorithm>
#include <map>

#include "core/json_depth.h"
#include "engine/json_schema.h"
#include "server/api.h"

namespace ft::server {

using json = nlohmann::json;

namespace {

// One Anthropic turn into OpenAI chat messages: an assistant turn's tool_use blocks become its
// tool_calls, a user turn's tool_result blocks tool messages (pushed to out, ahead of its text,
// as Anthropic orders them). Returns the turn itself (null: a user turn of tool results only).
// names: tool_use id -> function name, for the tool messages that answer them.
json translate_turn(const json& msg, const std::string& pm, std::map<std::string, std::string>& names, json& out) {
  if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
    bad(pm, "'" + pm + "' must be an object with a string 'role'");
  const std::string role = msg["role"].get<std::string>();
  if (role != "user" && role != "assistant")
    bad(pm + ".role", "role '" + role + "' is not supported (user, assistant; a system prompt is the top-level 'system')");
  if (!msg.contains("content") || msg["content"].is_null()) bad(pm + ".content", "'" + pm + ".content' is required");
  const json& c = msg["content"];
  json turn = {{"role", role}};
  if (c.is_string()) {
    turn["content"] = c;
  } else if (c.is_array()) {
    std::string text, reasoning;
    json calls = json::array();
    bool results = false;
    for (size_t k = 0; k < c.size(); ++k) {
      const json& b = c[k];
      const std::string pb = cat(pm, ".content[", k, "]");
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
        bad(pb, "'" + pb + "' must be an object with a string 'type'");
      const std::string type = b["type"].get<std::string>();
      auto need_string = [&](const char* key) {
        if (!b.contains(key) || !b[key].is_string()) bad(cat(pb, ".", key), cat("'", pb, ".", key, "' must be a string"));
        return b[key].get<std::string>();
      };
      if (type == "text") {
        text += need_string("text");
      } else if (type == "tool_use" && role == "assistant") {
        const std::string id = need_string("id"), name = need_string("name");
        const json input = b.contains("input") && !b["input"].is_null() ? b["input"] : json::object();
        if (!input.is_object()) bad(pb + ".input", "'" + pb + ".input' must be an object");
        names[id] = name;
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", input.dump()}}}});
      } else if (type == "tool_result" && role == "user") {
        const std::string id = need_string("tool_use_id");
        std::string result = b.contains("content") && !b["content"].is_null() ? content_text(b["content"], pb + ".content") : "";
        if (b.contains("is_error") && !b["is_error"].is_null()) {
          if (!b["is_error"].is_boolean()) bad(pb + ".is_error", "'" + pb + ".is_error' must be a boolean");
          if (b["is_error"] == true) result = "Error: " + result;  // (a chat template has no field for it)
        }
        json tool = {{"role", "tool"}, {"tool_call_id", id}, {"content", result}};
        if (const auto it = names.find(id); it != names.end()) tool["name"] = it->second;
        out.push_back(std::move(tool));
        results = true;
      } else if (type == "thinking" && role == "assistant") {  // an earlier answer's reasoning: the template's to render
        const std::string thought = need_string("thinking");
        if (!thought.empty()) reasoning += (reasoning.empty() ? "" : "\n\n") + thought;
      } else if (type == "thinking" || type == "redacted_thinking") {
        // (redacted: nothing to read)
      } else {
        bad(pb + ".type", "content blocks of type '" + type + "' are not supported" +
                              (type == "tool_use" || type == "tool_result" ? " in a " + role + " turn" : " (this model reads text only)"));
      }
    }
    if (role == "user" && text.empty() && results) return nullptr;  // only tool results
    turn["content"] = calls.empty() || !text.empty() ? json(text) : json(nullptr);
    if (!calls.empty()) turn["tool_calls"] = calls;
    if (!reasoning.empty()) turn["reasoning_content"] = reasoning;
  } else {
    bad(pm + ".content", "'" + pm + ".content' must be a string or an array of content blocks");
  }
  return turn;
}

// Consecutive turns of one role are one turn (Anthropic combines them): their texts and reasoning
// joined by blank lines, their calls one list. The parts are kept while turns join and each
// joined once, when the turn is complete (joining as each came copied the text so far: 54,794
// one-line user turns took 4.3 s).
class TurnMerger {
 public:
  explicit TurnMerger(json& out) : out_(out) {}
  // A turn from translate_turn (null: none), after any tool messages it pushed to out.
  void add(json turn) {
    if (open_ != kNone && open_ + 1 != out_.size()) close();  // (tool messages came between)
    if (turn.is_null()) return;
    const auto text = [](const json& t) { return t["content"].is_string() ? t["content"].get<std::string>() : std::string(); };
    if (open_ != kNone && out_[open_]["role"] == turn["role"]) {
      json& prev = out_[open_];
      texts_.push_back(text(turn));
      if (turn.contains("tool_calls")) {
        if (!prev.contains("tool_calls")) prev["tool_calls"] = json::array();
        for (json& t : turn["tool_calls"]) prev["tool_calls"].push_back(std::move(t));
      }
      if (turn.contains("reasoning_content")) reasoning_.push_back(turn["reasoning_content"].get<std::string>());
      return;
    }
    close();
    texts_ = {text(turn)};
    if (turn.contains("reasoning_content")) reasoning_ = {turn["reasoning_content"].get<std::string>()};
    out_.push_back(std::move(turn));
    open_ = out_.size() - 1;
  }
  // The open turn's parts joined (before out is read).
  void close() {
    if (open_ == kNone) return;
    json& t = out_[open_];
    if (texts_.size() > 1) {
      const std::string joined = join(texts_);
      t["content"] = joined.empty() && t.contains("tool_calls") ? json(nullptr) : json(joined);
    }
    if (texts_.size() > 1 && !reasoning_.empty()) t["reasoning_content"] = join(reasoning_);
    open_ = kNone;
    texts_.clear();
    reasoning_.clear();
  }

 private:
  static constexpr size_t kNone = size_t(-1);
  // The non-empty parts, a blank line between two.
  static std::string join(const std::vector<std::string>& parts) {
    size_t n = 0;
    for (const std::string& p : parts) n += p.size() + 2;
    std::string s;
    s.reserve(n);
    for (const std::string& p : parts) {
      if (p.empty()) continue;
      if (!s.empty()) s += "\n\n";
      s += p;
    }
    return s;
  }
  json& out_;
  size_t open_ = kNone;  // the index in out of the turn the next may join
  std::vector<std::string> texts_, reasoning_;
};

// Anthropic's structured output ({"type": "json_schema", "schema"}) as OpenAI's response_format.
json response_format_of(const json& f, const std::string& param) {
  if (!f.is_object() || !f.contains("type") || f["type"] != "json_schema" || !f.contains("schema"))
    bad(param, "'" + param + "' must be {\"type\": \"json_schema\", \"schema\": {...}}");
  return {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", f["schema"]}}}};
}

}  // namespace

ParsedRequest parse_messages_request(std::string_view body, const ModelInfo& model, bool count_only) {
  json j = parse_json_object(body);
  for (auto it = j.begin(); it != j.end();) it = it.value().is_null() ? j.erase(it) : std::next(it);
  static const char* const kKnown[] = {
      "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k",
      "tools", "tool_choice", "metadata", "thinking", "service_tier", "output_format", "output_config",
      "container", "mcp_servers", "context_management",
      // vLLM / llama.cpp extensions, passed to the chat request as they are
      "seed", "min_p", "repetition_penalty", "chat_template_kwargs", "priority", "ttft_slo_ms", "guided_choice",
      "guided_json", "grammar"};
  std::vector<std::string> unknown;
  for (const auto& [k, v] : j.items())
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown)) unknown.push_back(k);
  if (j.contains("mcp_servers") && !(j["mcp_servers"].is_array() && j["mcp_servers"].empty()))
    bad("mcp_servers", "MCP servers are not supported (this server runs no tools)");
  if (j.contains("container")) bad("container", "containers are not supported (this server runs no tools)");

  json chat = json::object();
  for (const char* k : {"model", "stream", "temperature", "top_p", "top_k", "seed", "min_p", "repetition_penalty",
                        "chat_template_kwargs", "priority", "ttft_slo_ms", "guided_choice", "guided_json", "grammar"})
    if (j.contains(k)) chat[k] = j[k];
  if (j.contains("stream") && j["stream"] == true) chat["stream_options"] = {{"include_usage", true}};
  if (j.contains("max_tokens")) {
    const json& m = j["max_tokens"];
    if (!m.is_number_integer() || (m.is_number_unsigned() ? m.get<uint64_t>() < 1 : m.get<int64_t>() < 1))
      bad("max_tokens", "'max_tokens' must be an integer of at least 1");
    // A cap: what the context cannot hold is cut (ParsedRequest::fit_max_tokens).
    chat["max_tokens"] = m.is_number_unsigned() ? int64_t(std::min<uint64_t>(m.get<uint64_t>(), uint64_t(model.n_ctx)))
                                                : std::min<int64_t>(m.get<int64_t>(), model.n_ctx);
  } else if (!count_only) {
    bad("max_tokens", "'max_tokens' is required");
  }
  if (j.contains("stop_sequences")) {
    if (!j["stop_sequences"].is_array()) bad("stop_sequences", "'stop_sequences' must be an array of strings");
    chat["stop"] = j["stop_sequences"];
  }

  json messages = json::array();
  if (j.contains("system")) messages.push_back({{"role", "system"}, {"content", content_text(j["system"], "system")}});
  if (!j.contains("messages")) bad("messages", "'messages' is required");
  const json& in = j["messages"];
  if (!in.is_array() || in.empty()) bad("messages", "'messages' must be a non-empty array");
  std::map<std::string, std::string> names;
  TurnMerger merged(messages);
  for (size_t i = 0; i < in.size(); ++i) merged.add(translate_turn(in[i], cat("messages[", i, "]"), names, messages));
  merged.close();
  // A final assistant turn is a prefill: the answer continues it.
  if (const json& last = messages.back(); last["role"] == "assistant") {
    if (last.contains("tool_calls") || !last["content"].is_string() || last["content"] == "")
      bad("messages", "a final assistant turn must be text (a prefill the answer continues)");
    chat["continue_final_message"] = true;
    chat["add_generation_prompt"] = false;
  }
  chat["messages"] = messages;

  if (j.contains("tools")) {
    if (!j["tools"].is_array()) bad("tools", "'tools' must be an array");
    json tools = json::array();
    for (size_t i = 0; i < j["tools"].size(); ++i) {
      const json& t = j["tools"][i];
      const std::string p = cat("tools[", i, "]");
      if (!t.is_object()) bad(p, "'" + p + "' must be an object");
      if (t.contains("type") && t["type"] != "custom")
        bad(p + ".type", "only custom tools ({\"name\", \"input_schema\"}) are supported (this server runs no tools)");
      if (!t.contains("name") || !t["name"].is_string()) bad(p + ".name", "'" + p + ".name' must be a string");
      json f = {{"name", t["name"]}, {"parameters", t.contains("input_schema") ? t["input_schema"] : json::object()}};
      if (t.contains("description")) f["description"] = t["description"];
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    chat["tools"] = tools;
  }
  if (j.contains("tool_choice")) {
    const json& c = j["tool_choice"];
    const std::string type = c.is_object() && c.contains("type") && c["type"].is_string() ? c["type"].get<std::string>() : "";
    if (type == "auto" || type == "none") {
      chat["tool_choice"] = type;
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "tool" && c.contains("name") && c["name"].is_string()) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    } else {
      bad("tool_choice", "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}");
    }
    if (c.contains("disable_parallel_tool_use") && c["disable_parallel_tool_use"].is_boolean())
      chat["parallel_tool_calls"] = !c["disable_parallel_tool_use"].get<bool>();
  }
  // Extended thinking: the template's switch (Qwen3's enable_thinking, DeepSeek V3.1's thinking),
  // off unless asked for (Anthropic's default), unless chat_template_kwargs sets it; a budget has
  // no effect here.
  bool thinking = false;
  if (j.contains("thinking")) {
    const json& t = j["thinking"];
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
      bad("thinking", "'thinking' must be {\"type\": \"enabled\" | \"disabled\", ...}");
    thinking = t["type"] != "disabled";
  }
  if (!chat.contains("chat_template_kwargs")) chat["chat_template_kwargs"] = json::object();
  if (json& kw = chat["chat_template_kwargs"]; kw.is_object())
    for (const char* k : {"enable_thinking", "thinking"})
      if (!kw.contains(k)) kw[k] = thinking;
  if (j.contains("output_format")) chat["response_format"] = response_format_of(j["output_format"], "output_format");
  const bool config_format = j.contains("output_config") && j["output_config"].is_object() && j["output_config"].contains("format");
  if (config_format) chat["response_format"] = response_format_of(j["output_config"]["format"], "output_config.format");

  // The schemas' own text (the chat body is a re-dump, keys sorted).
  SchemaTexts texts;
  texts.response_format = config_format ? raw_at(body, {"output_config", "format", "schema"}) : raw_at(body, {"output_format", "schema"});
  texts.guided_json = raw_at(body, {"guided_json"});
  for (const std::string_view t : raw_elements(raw_at(body, {"tools"}))) texts.tools.push_back(raw_at(t, {"input_schema"}));
  try {
    ParsedRequest r = parse_request(Endpoint::Chat, chat.dump(), model, &texts);
    r.kind = Endpoint::Messages;
    r.fit_max_tokens = true;
    r.unknown_fields = unknown;
    return r;
  } catch (ApiError& e) {  // name the Messages API's params
    if (e.param == "stop") e.param = "stop_sequences";
    if (e.param.rfind("response_format", 0) == 0) e.param = j.contains("output_format") ? "output_format" : "output_config.format";
    throw;
  }
}

const char* anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: case 431: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string anthropic_error_body(const ApiError& e) {
  const json body = {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.what()}}}};
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

MessagesStop messages_stop(const Finish& f, bool tool_use) {
  if (f.reason == "length") return {"max_tokens"};
  if (tool_use) return {"tool_use"};  // (a named call a stop string cut is no call: extract_tool_calls)
  if (!f.stop_word.empty()) return {"stop_sequence", f.stop_word};
  return {"end_turn"};
}

// Anthropic's split: input_tokens are the prompt tokens computed, cache_read_input_tokens those
// served from the prefix cache (their sum the prompt); nothing is written by cache_control here.
json messages_usage(const Usage& u) {
  const int64_t cached = std::min(u.cached_tokens, u.prompt_tokens);
  return {{"input_tokens", u.prompt_tokens - cached},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached},
          {"output_tokens", u.completion_tokens}};
}

nlohmann::ordered_json messages_response(const ResponseMeta& m, nlohmann::ordered_json content, const MessagesStop* stop,
                                         const Usage& u) {
  return {{"id", m.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", m.model},
          {"content", std::move(content)},
          {"stop_reason", stop ? json(stop->reason) : json(nullptr)},
          {"stop_sequence", stop ? stop->sequence : json(nullptr)},
          {"usage", messages_usage(u)}};
}

nlohmann::ordered_json messages_tool_use_block(const ToolCall& c) {
  nlohmann::ordered_json input = json_depth_within(c.arguments) ? parse_ordered_json(c.arguments) : nlohmann::ordered_json();
  if (input.is_discarded() || input.is_null()) input = nlohmann::ordered_json::object();  // (extract_tool_calls makes such text no call)
  const std::string id = c.id.rfind("call_", 0) == 0 ? "toolu_" + c.id.substr(5) : c.id;
  return {{"type", "tool_use"}, {"id", id}, {"name", c.name}, {"input", std::move(input)}};
}

}  // namespace ft::server
