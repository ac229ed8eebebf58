#include "tokenizer/chat_template.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace ft {
namespace {

constexpr std::array<std::pair<ChatFormat, std::string_view>, 5> kNames = {{
    {ChatFormat::Llama2, "llama2"},
    {ChatFormat::Llama3, "llama3"},
    {ChatFormat::ChatML, "chatml"},
    {ChatFormat::Mistral, "mistral"},
    {ChatFormat::Zephyr, "zephyr"},
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
  fail("chat template: unknown message role '", role, "' (expected system, user or assistant)");
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

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

}  // namespace

std::string_view chat_format_name(ChatFormat f) {
  for (const auto& [fmt, name] : kNames)
    if (fmt == f) return name;
  return "unknown";
}

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  for (const auto& [fmt, n] : kNames) {
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < n.size() && eq; ++i) {
      eq = std::tolower(static_cast<unsigned char>(name[i])) == n[i];
    }
    if (eq) return fmt;
  }
  return std::nullopt;
}

ChatFormat detect_chat_format(std::string_view t) {
  if (auto named = parse_chat_format(strip(t))) return *named;
  if (contains(t, "<|start_header_id|>")) return ChatFormat::Llama3;
  if (contains(t, "<|im_start|>")) return ChatFormat::ChatML;
  if (contains(t, "[INST]")) return contains(t, "<<SYS>>") ? ChatFormat::Llama2 : ChatFormat::Mistral;
  // Zephyr closes every turn with the EOS token; Phi-3 (also <|user|>) uses <|end|> instead and
  // is not supported, so it falls through to the fallback.
  if (contains(t, "<|user|>") && !contains(t, "<|end|>") &&
      (contains(t, "</s>") || contains(t, "eos_token") || contains(t, "<|assistant|>"))) {
    return ChatFormat::Zephyr;
  }
  return ChatFormat::ChatML;
}

std::string render_chat(ChatFormat fmt, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, std::string_view bos_text,
                        std::string_view eos_text) {
  std::string out;
  switch (fmt) {
    case ChatFormat::Llama2: render_llama2(messages, bos_text, eos_text, out); break;
    case ChatFormat::Mistral: render_mistral(messages, bos_text, eos_text, out); break;
    case ChatFormat::Llama3:
      out += bos_text;
      for (const auto& m : messages) {
        parse_role(m.role);
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
        parse_role(m.role);
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
        parse_role(m.role);
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

}  // namespace ft
