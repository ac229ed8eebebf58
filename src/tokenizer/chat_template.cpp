#include "tokenizer/chat_template.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <ctime>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/json_ordered.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

constexpr std::array<std::pair<ChatFormat, std::string_view>, 8> kNames = {{
    {ChatFormat::Llama2, "llama2"},
    {ChatFormat::Llama3, "llama3"},
    {ChatFormat::ChatML, "chatml"},
    {ChatFormat::Mistral, "mistral"},
    {ChatFormat::Zephyr, "zephyr"},
    {ChatFormat::Gemma, "gemma"},
    {ChatFormat::Phi3, "phi3"},
    {ChatFormat::Harmony, "gpt-oss"},
}};

// Python str.strip() / Jinja |trim over ASCII whitespace.
std::string_view strip(std::string_view s) {
  const auto ws = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

enum class Role { System, User, Assistant };

Role parse_role(const std::string& role) {
  if (role == "system") return Role::System;
  if (role == "user") return Role::User;
  if (role == "assistant") return Role::Assistant;
  fail("chat template: unknown message role '", role, "' (expected system, user, assistant or tool)");
}

// {"name": N, "arguments": A}, always one line of valid JSON: N as a JSON string; A the text as
// given where it is JSON on one line (what the model wrote, byte for byte: its prefix stays
// cached), JSON written again compactly where it spans lines, a JSON string where it is no JSON
// ("not json"; too deep to parse), {} where it is empty. (Pasted as they came, a name `a"b` or
// arguments `not json` made a line no JSON parser reads.)
std::string tool_call_line(const ToolCall& t) {
  using ojson = nlohmann::ordered_json;
  constexpr auto kReplace = ojson::error_handler_t::replace;
  std::string line = "{\"name\": " + ojson(t.name).dump(-1, ' ', false, kReplace) + ", \"arguments\": ";
  if (t.arguments.empty()) return line + "{}}";
  const ojson args = json_depth_within(t.arguments) ? ojson::parse(t.arguments, nullptr, /*allow_exceptions=*/false)
                                                    : ojson(ojson::value_t::discarded);
  if (args.is_discarded()) line += ojson(t.arguments).dump(-1, ' ', false, kReplace);
  else if (t.arguments.find_first_of("\r\n") == std::string::npos) line += t.arguments;
  else line += args.dump(-1, ' ', false, kReplace);
  return line + "}";
}

// The built-in formats have no tool syntax of their own: an assistant's calls follow its text as
// one JSON object per line, {"name": N, "arguments": A} (Hermes/Llama 3.1 style; tool_call_line);
// a tool result becomes a turn of tool_role ("tool", "ipython" for Llama 3) or, where the format
// has no such role (tool_role empty), a user turn.
std::vector<ChatMessage> builtin_messages(const std::vector<ChatMessage>& in, std::string_view tool_role) {
  std::vector<ChatMessage> out;
  out.reserve(in.size());
  for (const auto& m : in) {
    ChatMessage c{m.role == "tool" ? std::string(tool_role.empty() ? "user" : tool_role) : m.role, m.content};
    for (const auto& t : m.tool_calls) {
      if (!c.content.empty()) c.content += '\n';
      c.content += tool_call_line(t);
    }
    if (m.role != "tool") parse_role(m.role);  // throws on a role no format knows
    out.push_back(std::move(c));
  }
  return out;
}

// Llama 2 chat (HF): each user turn is bos + "[INST] " + strip(content) + " [/INST]", each
// assistant turn " " + strip(content) + " " + eos; a system message becomes a <<SYS>> block
// at the start of the next user turn's content (before stripping).
void render_llama2(const std::vector<ChatMessage>& msgs, std::string_view bos,
                   std::string_view eos, std::string& out) {
  std::string pending_system;
  bool has_system = false;
  auto user_turn = [&](std::string_view content) {
    std::string text;
    if (has_system) {
      text = "<<SYS>>\n" + pending_system + "\n<</SYS>>\n\n";
      has_system = false;
      pending_system.clear();
    }
    text += content;
    out += bos;
    out += "[INST] ";
    out += strip(text);
    out += " [/INST]";
  };
  for (const auto& m : msgs) {
    switch (parse_role(m.role)) {
      case Role::System:
        if (has_system) pending_system += "\n\n";
        pending_system += m.content;
        has_system = true;
        break;
      case Role::User: user_turn(m.content); break;
      case Role::Assistant:
        out += ' ';
        out += strip(m.content);
        out += ' ';
        out += eos;
        break;
    }
  }
  if (has_system) user_turn("");  // a trailing system message still reaches the model
}

// Mistral Instruct v0.1/v0.2: bos once, "[INST] " + content + " [/INST]" per user turn,
// content + eos per assistant turn; no stripping. System text is prepended to the next user
// message followed by a blank line.
void render_mistral(const std::vector<ChatMessage>& msgs, std::string_view bos,
                    std::string_view eos, std::string& out) {
  out += bos;
  std::string pending_system;
  bool has_system = false;
  auto user_turn = [&](std::string_view content) {
    out += "[INST] ";
    if (has_system) {
      out += pending_system;
      out += "\n\n";
      has_system = false;
      pending_system.clear();
    }
    out += content;
    out += " [/INST]";
  };
  for (const auto& m : msgs) {
    switch (parse_role(m.role)) {
      case Role::System:
        if (has_system) pending_system += "\n\n";
        pending_system += m.content;
        has_system = true;
        break;
      case Role::User: user_turn(m.content); break;
      case Role::Assistant:
        out += m.content;
        out += eos;
        break;
    }
  }
  if (has_system) user_turn("");
}

// Gemma 2 (google/gemma-2-*-it): bos, then per turn "<start_of_turn>" + (user | model) + "\n" +
// trim(content) + "<end_of_turn>\n". No system role: system text is held for the next user
// turn, before its content and a blank line (llama.cpp's fallback), and a trailing one still
// reaches the model as a user turn.
void render_gemma(const std::vector<ChatMessage>& msgs, bool add_generation_prompt, std::string_view bos,
                  std::string& out) {
  out += bos;
  std::string pending_system;
  auto turn = [&](std::string_view role, std::string_view content) {
    out += "<start_of_turn>";
    out += role;
    out += '\n';
    out += strip(content);
    out += "<end_of_turn>\n";
  };
  for (const auto& m : msgs) {
    switch (parse_role(m.role)) {
      case Role::System:
        if (!pending_system.empty()) pending_system += "\n\n";
        pending_system += strip(m.content);
        break;
      case Role::User:
        turn("user", pending_system.empty() ? m.content : pending_system + "\n\n" + m.content);
        pending_system.clear();
        break;
      case Role::Assistant: turn("model", m.content); break;
    }
  }
  if (!pending_system.empty()) turn("user", pending_system);
  if (add_generation_prompt) out += "<start_of_turn>model\n";
}

// Phi-3.5 (microsoft/Phi-3.5-mini-instruct): per turn "<|" + role + "|>\n" + content +
// "<|end|>\n" (an empty system message left out); then "<|assistant|>\n", or eos without a
// generation prompt.
void render_phi3(const std::vector<ChatMessage>& msgs, bool add_generation_prompt, std::string_view eos,
                 std::string& out) {
  for (const auto& m : msgs) {
    if (m.role == "system" && m.content.empty()) continue;
    out += "<|";
    out += m.role;
    out += "|>\n";
    out += m.content;
    out += "<|end|>\n";
  }
  out += add_generation_prompt ? std::string_view("<|assistant|>\n") : eos;
}

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// --- gpt-oss's harmony format -------------------------------------------------------------------

using json = nlohmann::ordered_json;  // (tools and arguments in the client's order, as templates show them)

// A JSON schema as the TypeScript-like type the harmony tool namespace shows (the model's template
// renders the same subset; anything else is "any").
std::string ts_type(const json& s) {
  if (!s.is_object()) return "any";
  std::string t;
  const json type = s.value("type", json());
  if (s.contains("enum") && s["enum"].is_array() && !s["enum"].empty()) {
    for (const json& v : s["enum"]) t += cat(t.empty() ? "" : " | ", v.dump());
  } else if (type.is_array() && !type.empty()) {
    for (const json& v : type) t += cat(t.empty() ? "" : " | ", v.is_string() ? v.get<std::string>() : v.dump());
  } else if (type == "string") {
    t = "string";
  } else if (type == "number" || type == "integer") {
    t = "number";
  } else if (type == "boolean") {
    t = "boolean";
  } else if (type == "array") {
    const std::string item = s.contains("items") ? ts_type(s["items"]) : "any";
    t = item.find(' ') == std::string::npos ? item + "[]" : "Array<" + item + ">";
  } else if (type == "object") {
    t = "object";
  } else if (type == "null") {
    t = "null";
  } else {
    t = "any";
  }
  if (s.contains("nullable") && s["nullable"] == true) t += " | null";
  return t;
}

// "## functions\n\nnamespace functions {\n\n" + each tool + "\n} // namespace functions".
std::string harmony_tools(const json& tools) {
  std::string out = "## functions\n\nnamespace functions {\n\n";
  for (const json& entry : tools) {
    const json& f = entry.contains("function") ? entry["function"] : entry;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    if (f.contains("description") && f["description"].is_string()) out += "// " + f["description"].get<std::string>() + "\n";
    out += "type " + f["name"].get<std::string>() + " = (";
    const json params = f.value("parameters", json::object());
    const json props = params.is_object() ? params.value("properties", json::object()) : json::object();
    if (props.is_object() && !props.empty()) {
      std::unordered_set<std::string> required;  // (a set: a request may list 100,000s of names)
      if (const json r = params.value("required", json::array()); r.is_array())
        for (const json& n : r)
          if (n.is_string()) required.insert(n.get<std::string>());
      out += "_: {\n";
      for (const auto& [name, spec] : props.items()) {
        if (spec.is_object() && spec.contains("description") && spec["description"].is_string())
          out += "// " + spec["description"].get<std::string>() + "\n";
        const bool req = required.contains(name);
        out += name + (req ? ": " : "?: ") + ts_type(spec);
        if (spec.is_object() && spec.contains("default"))  // (as the template writes it: an enum's as it is)
          out += ", // default: " + (spec.contains("enum") && spec["default"].is_string() ? spec["default"].get<std::string>()
                                                                                         : spec["default"].dump());
        out += ",\n";
      }
      out += "}";
    }
    out += ") => any;\n\n";
  }
  out += "} // namespace functions";
  return out;
}

// Today's date as the model's template writes it (strftime_now("%Y-%m-%d"): local time).
std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  return std::string(buf, std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm));
}

std::string extra_string(const nlohmann::json& extra, const char* key, std::string_view fallback) {
  if (extra.is_object() && extra.contains(key) && extra[key].is_string()) return extra[key].get<std::string>();
  return std::string(fallback);
}

}  // namespace

std::string render_harmony(const std::vector<ChatMessage>& messages, const json& tools, bool add_generation_prompt,
                           const nlohmann::json& extra) {
  const bool with_tools = tools.is_array() && !tools.empty();
  std::string out = "<|start|>system<|message|>";
  out += extra_string(extra, "model_identity", "You are ChatGPT, a large language model trained by OpenAI.");
  out += "\nKnowledge cutoff: 2024-06\nCurrent date: " + today() + "\n\n";
  out += "Reasoning: " + extra_string(extra, "reasoning_effort", "medium") + "\n\n";
  out += "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
  if (with_tools) out += "\nCalls to these tools must go to the commentary channel: 'functions'.";
  out += "<|end|>";
  size_t first = 0;
  std::string developer;
  if (!messages.empty() && (messages[0].role == "system" || messages[0].role == "developer")) {
    developer = messages[0].content;
    first = 1;
  }
  if (!developer.empty() || with_tools) {
    out += "<|start|>developer<|message|>";
    if (!developer.empty()) out += "# Instructions\n\n" + developer + "\n\n";
    if (with_tools) out += "# Tools\n\n" + harmony_tools(tools);
    out += "<|end|>";
  }
  // What a tool result answers: the latest call with its id (by a map: a scan of every earlier
  // call per result was quadratic), else the latest call.
  std::unordered_map<std::string_view, std::string_view> call_names;
  const ToolCall* latest_call = nullptr;
  // final_after[i]: a final answer (an assistant turn without calls) comes after message i (one
  // backward pass: a scan of the rest per turn with calls took 11 s for 67,000 such turns).
  std::vector<bool> final_after(messages.size() + 1, false);
  for (size_t i = messages.size(); i-- > first;)
    final_after[i] = final_after[i + 1] || (messages[i].role == "assistant" && messages[i].tool_calls.empty());
  const auto analysis = [&](const std::string& text) { out += "<|start|>assistant<|channel|>analysis<|message|>" + text + "<|end|>"; };
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out += "<|start|>user<|message|>" + m.content + "<|end|>";
    } else if (m.role == "system" || m.role == "developer") {
      out += "<|start|>developer<|message|># Instructions\n\n" + m.content + "\n\n<|end|>";  // (as the first)
    } else if (m.role == "assistant") {
      // (As gpt-oss's own template writes them: earlier turns' reasoning dropped; the last
      // turn's, with no generation prompt, before its final message, which ends in <|return|>.)
      if (m.tool_calls.empty()) {
        const bool last = i + 1 == messages.size() && !add_generation_prompt;
        if (last && !m.reasoning.empty()) analysis(m.reasoning);
        out += "<|start|>assistant<|channel|>final<|message|>" + m.content + (last ? "<|return|>" : "<|end|>");
        continue;
      }
      // A call's reasoning (or else its text: a preamble) as analysis unless a final answer
      // follows (llama.cpp's gpt-oss handler passes the reasoning as thinking and drops the
      // content); each call addressed before its channel.
      const bool final_follows = final_after[i + 1];
      if (!final_follows && !(m.content.empty() && m.reasoning.empty())) analysis(m.reasoning.empty() ? m.content : m.reasoning);
      for (const ToolCall& c : m.tool_calls) {
        out += "<|start|>assistant to=functions." + c.name + "<|channel|>commentary json<|message|>" +
               (c.arguments.empty() ? "{}" : c.arguments) + "<|call|>";
        if (!c.name.empty()) call_names[c.id] = c.name;  // (a nameless call names nothing)
        latest_call = &c;
      }
    } else if (m.role == "tool") {
      std::string_view name = m.name;
      if (name.empty() && !m.tool_call_id.empty())
        if (const auto it = call_names.find(m.tool_call_id); it != call_names.end()) name = it->second;
      if (name.empty() && latest_call) name = latest_call->name;
      if (name.empty()) fail("chat template: a tool message with no earlier assistant tool call (gpt-oss names a result by its call)");
      // (its content as a JSON string, as the template's `message.content|tojson`)
      out += "<|start|>functions.";
      out += name;
      out += " to=assistant<|channel|>commentary<|message|>" + nlohmann::json(m.content).dump() + "<|end|>";
    } else {
      fail("chat template: unknown message role '", m.role, "' (expected system, developer, user, assistant or tool)");
    }
  }
  if (add_generation_prompt) out += "<|start|>assistant";
  return out;
}

std::string_view chat_format_name(ChatFormat f) {
  for (const auto& [fmt, name] : kNames)
    if (fmt == f) return name;
  return "unknown";
}

std::string chat_format_names() {
  std::string s;
  for (const auto& [fmt, name] : kNames) s += cat(s.empty() ? "" : ", ", name);
  return s;
}

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  for (const auto& [fmt, n] : kNames)
    if (iequals(name, n)) return fmt;
  if (iequals(name, "harmony")) return ChatFormat::Harmony;
  return std::nullopt;
}

ChatFormat detect_chat_format(std::string_view t, ChatFormat fallback) {
  if (auto named = parse_chat_format(strip(t))) return *named;
  // gpt-oss's: it has <|start|> ... <|end|> turns too, but no other template has channels.
  if (contains(t, "<|channel|>")) return ChatFormat::Harmony;
  if (contains(t, "<|start_header_id|>")) return ChatFormat::Llama3;
  if (contains(t, "<|im_start|>")) return ChatFormat::ChatML;
  if (contains(t, "[INST]")) return contains(t, "<<SYS>>") ? ChatFormat::Llama2 : ChatFormat::Mistral;
  if (contains(t, "<start_of_turn>")) return ChatFormat::Gemma;
  // Zephyr closes every turn with the EOS token; Phi-3 (also <|user|>) with <|end|>.
  if (contains(t, "<|user|>") && contains(t, "<|end|>")) return ChatFormat::Phi3;
  if (contains(t, "<|user|>") &&
      (contains(t, "</s>") || contains(t, "eos_token") || contains(t, "<|assistant|>"))) {
    return ChatFormat::Zephyr;
  }
  return fallback;
}

std::string render_chat(ChatFormat fmt, const std::vector<ChatMessage>& in,
                        bool add_generation_prompt, std::string_view bos_text,
                        std::string_view eos_text) {
  if (fmt == ChatFormat::Harmony) return render_harmony(in, nullptr, add_generation_prompt);  // (its own roles and calls)
  const std::string_view tool_role = fmt == ChatFormat::Llama3 ? "ipython"
                                     : fmt == ChatFormat::ChatML || fmt == ChatFormat::Zephyr ? "tool" : "";
  // (Gemma and Phi-3 have no tool role: results are user turns.)
  const std::vector<ChatMessage> messages = builtin_messages(in, tool_role);
  std::string out;
  switch (fmt) {
    case ChatFormat::Llama2: render_llama2(messages, bos_text, eos_text, out); break;
    case ChatFormat::Mistral: render_mistral(messages, bos_text, eos_text, out); break;
    case ChatFormat::Gemma: render_gemma(messages, add_generation_prompt, bos_text, out); break;
    case ChatFormat::Phi3: render_phi3(messages, add_generation_prompt, eos_text, out); break;
    case ChatFormat::Harmony: break;  // (above)
    case ChatFormat::Llama3:
      out += bos_text;
      for (const auto& m : messages) {
        out += "<|start_header_id|>";
        out += m.role;
        out += "<|end_header_id|>\n\n";
        out += strip(m.content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::ChatML:
      for (const auto& m : messages) {
        out += "<|im_start|>";
        out += m.role;
        out += '\n';
        out += m.content;
        out += "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::Zephyr:
      for (const auto& m : messages) {
        out += "<|";
        out += m.role;
        out += "|>\n";
        out += m.content;
        out += eos_text;
        out += '\n';
      }
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
  }
  return out;
}

nlohmann::ordered_json chat_template_context(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                                             bool add_generation_prompt, std::string_view bos_text,
                                             std::string_view eos_text, bool object_arguments, bool null_call_content) {
  json msgs = json::array();
  for (const auto& m : messages) {
    json j = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& t : m.tool_calls) {
        json args = object_arguments && json_depth_within(t.arguments) ? parse_ordered_json(t.arguments) : json();
        if (!args.is_object()) args = t.arguments;
        calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", args}}}});
      }
      j["tool_calls"] = calls;
      if (m.content.empty() && object_arguments && null_call_content) j["content"] = nullptr;
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) j["name"] = m.name;
    // Reasoning as templates read it: reasoning_content (Qwen3's, DeepSeek's), thinking
    // (gpt-oss's, which refuses both thinking and content beside a call: the content stays).
    if (!m.reasoning.empty()) {
      j["reasoning_content"] = m.reasoning;
      if (m.tool_calls.empty() || m.content.empty()) j["thinking"] = m.reasoning;
    }
    msgs.push_back(std::move(j));
  }
  json ctx = {{"messages", msgs},
              {"add_generation_prompt", add_generation_prompt},
              {"bos_token", bos_text},
              {"eos_token", eos_text}};
  if (!tools.is_null()) ctx["tools"] = tools;
  return ctx;
}

ChatTemplate::ChatTemplate(ChatFormat builtin, std::string bos_text, std::string eos_text)
    : format_(builtin), bos_(std::move(bos_text)), eos_(std::move(eos_text)) {}

ChatTemplate ChatTemplate::from_gguf(std::string_view source, std::string bos_text, std::string eos_text,
                                    std::string& warning, ChatFormat fallback) {
  warning.clear();
  ChatTemplate t(detect_chat_format(source, fallback), std::move(bos_text), std::move(eos_text));
  if (strip(source).empty() || parse_chat_format(strip(source))) return t;
  try {
    auto tpl = std::make_shared<const jinja::Template>(source);
    // A probe: the conversation every template must take (templates that refuse a system turn
    // raise on the first one, which is theirs to do, not a failure of the interpreter).
    const std::vector<std::vector<ChatMessage>> probes = {
        {{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "u"}},
        {{"user", "u"}, {"assistant", "a"}, {"user", "u"}}};
    std::string raised;
    for (const auto& p : probes) {
      try {
        tpl->render(chat_template_context(p, nullptr, true, t.bos_, t.eos_));
        t.jinja_ = std::move(tpl);
        return t;
      } catch (const jinja::Raised& e) {
        raised = e.what();
      }
    }
    warning = "it refuses a plain conversation (" + raised + ")";
  } catch (const Error& e) {
    warning = e.what();
  }
  warning = cat("the model's chat template cannot be run (", warning, "); using the built-in '",
                chat_format_name(t.format_), "' format it resembles");
  return t;
}

ChatTemplate ChatTemplate::for_model(const Tokenizer& tok, std::string_view source, std::optional<ChatFormat> forced,
                                    std::string& warning) {
  std::string bos = tok.bos() >= 0 ? tok.token_text(tok.bos()) : "";
  std::string eos = tok.eos() >= 0 ? tok.token_text(tok.eos()) : "";
  warning.clear();
  if (forced) return ChatTemplate(*forced, std::move(bos), std::move(eos));
  // gpt-oss's vocabulary (o200k_harmony): its control tokens, each one token.
  auto one_token = [&](std::string_view text) { return tok.encode(text, false, /*parse_special=*/true).size() == 1; };
  const bool harmony_vocab = one_token("<|channel|>") && one_token("<|start|>");
  return from_gguf(source, std::move(bos), std::move(eos), warning, harmony_vocab ? ChatFormat::Harmony : ChatFormat::ChatML);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt, const nlohmann::json& extra) const {
  if (jinja_) {
    auto context = [&](bool object_arguments, bool null_call_content) {
      json ctx =
          chat_template_context(messages, tools, add_generation_prompt, bos_, eos_, object_arguments, null_call_content);
      if (format_ == ChatFormat::Harmony)  // (as render_harmony: a call's reasoning, not its preamble)
        for (size_t i = 0; i < messages.size(); ++i)
          if (!messages[i].tool_calls.empty() && !messages[i].reasoning.empty()) {
            ctx["messages"][i]["thinking"] = messages[i].reasoning;
            ctx["messages"][i]["content"] = null_call_content ? json() : json("");
          }
      if (extra.is_object())
        for (const auto& [k, v] : extra.items()) {
          if (ctx.contains(k) || k == "tools") fail("chat template variables: '", k, "' is set by the request itself");
          ctx[k] = v;
        }
      return ctx;
    };
    // With calls, what templates take in turn (as minja's capability probes find it): null
    // content and object arguments (transformers'), then "" content (gpt-oss's tests `in` it),
    // then both as text (templates that concatenate them). A limit of the interpreter's (its work,
    // loop iterations, output size) is not retried: each try cost as much (3 renders of up to
    // kRenderWork each).
    const bool calls = std::any_of(messages.begin(), messages.end(), [](const auto& m) { return !m.tool_calls.empty(); });
    for (int attempt = 0;; ++attempt) {
      try {
        return jinja_->render(context(attempt < 2, attempt == 0));
      } catch (const jinja::Raised&) {
        throw;
      } catch (const jinja::LimitExceeded&) {
        throw;
      } catch (const Error&) {
        if (!calls || attempt == 2) throw;
      }
    }
  }
  if (format_ == ChatFormat::Harmony) return render_harmony(messages, tools, add_generation_prompt, extra);
  return render_chat(format_, messages, add_generation_prompt, bos_, eos_);
}

std::string ChatTemplate::describe() const {
  return jinja_ ? "the model's Jinja template" : cat("the built-in '", chat_format_name(format_), "' format");
}

}  // namespace ft
