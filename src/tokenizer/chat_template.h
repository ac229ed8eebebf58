// Chat prompt formats, rendered natively (no Jinja interpreter) to match the Hugging Face
// reference templates of each model family byte for byte:
//
//   Llama2   <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
//            (meta-llama/Llama-2-*-chat; message text is strip()ped; no generation prompt needed)
//   Llama3   <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>...
//            generation prompt <|start_header_id|>assistant<|end_header_id|>\n\n (content trimmed)
//   ChatML   <|im_start|>{role}\n{content}<|im_end|>\n ... generation prompt <|im_start|>assistant\n
//            (no BOS)
//   Mistral  <s>[INST] {system}\n\n{user} [/INST]{assistant}</s>[INST] {user} [/INST]
//            (Mistral-7B-Instruct v0.1/v0.2; the system message is prepended to the next user
//             message, separated by a blank line as in Mistral's later official templates)
//   Zephyr   <|system|>\n{content}</s>\n<|user|>\n{content}</s>\n<|assistant|>\n{content}</s>\n
//            generation prompt <|assistant|>\n (HuggingFaceH4/zephyr-7b-beta; no BOS)
//   Gemma    <bos><start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n{assistant}<end_of_turn>\n
//            generation prompt <start_of_turn>model\n (google/gemma-2-*-it; content trimmed; Gemma
//            has no system role: its text goes before the next user message, then a blank line,
//            as llama.cpp does, where the official template refuses it)
//   Phi3     <|system|>\n{content}<|end|>\n<|user|>\n{content}<|end|>\n<|assistant|>\n{content}<|end|>\n
//            generation prompt <|assistant|>\n, else eos (microsoft/Phi-3.5-mini-instruct; an
//            empty system message is left out; no BOS)
//   Harmony  gpt-oss's (openai/gpt-oss-*): <|start|>system<|message|>{model identity, knowledge
//            cutoff, date, reasoning effort, valid channels}<|end|>, a developer message
//            <|start|>developer<|message|># Instructions\n\n{system}\n\n[# Tools\n\n{namespace}]<|end|>
//            when there is a system message or tools, then <|start|>{role}<|message|>{content}<|end|>
//            per turn (assistant: <|channel|>final; calls and results: see render_harmony);
//            generation prompt <|start|>assistant (no BOS)
//
// "<s>", "</s>", "<|begin_of_text|>" above stand for the bos_text / eos_text arguments. In the
// Llama2/Mistral formats a system message that is not first is folded into the following user
// turn the same way. Tool calls and results: see builtin_messages in chat_template.cpp (calls as
// {"name", "arguments"} JSON lines after the assistant's text; results as a "tool" turn, "ipython"
// in Llama 3, a user turn in Llama 2/Mistral). Roles other than system/user/assistant/tool ->
// ft::Error.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ft {

class Tokenizer;
namespace jinja {
class Template;
}

// A call the assistant made: arguments is JSON text, as OpenAI carries it.
struct ToolCall {
  std::string id, name, arguments;
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role_, std::string content_) : role(std::move(role_)), content(std::move(content_)) {}
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool: the call it answers
  std::string name;                  // tool: the function's name (when given)
  std::string reasoning;             // assistant: its reasoning as the client sent it back
                                     // (reasoning_content; a Responses reasoning item; a thinking block)
};

enum class ChatFormat { Llama2, Llama3, ChatML, Mistral, Zephyr, Gemma, Phi3, Harmony };

// "llama2", "llama3", "chatml", "mistral", "zephyr", "gemma", "phi3", "gpt-oss" (Harmony).
std::string_view chat_format_name(ChatFormat f);
// Every format's name, comma-separated ("llama2, llama3, ...").
std::string chat_format_names();
// Inverse of chat_format_name (case-insensitive; "harmony" too for gpt-oss); nullopt for other names.
std::optional<ChatFormat> parse_chat_format(std::string_view name);

// Recognises the format from the Jinja source in GGUF `tokenizer.chat_template` by distinctive
// markers, like llama.cpp's llm_chat_detect_template:
//   "<|start_header_id|>"                              -> Llama3
//   "<|im_start|>"                                     -> ChatML
//   "[INST]" with "<<SYS>>"                            -> Llama2
//   "[INST]" without "<<SYS>>"                         -> Mistral
//   "<start_of_turn>"                                  -> Gemma
//   "<|user|>" with "<|end|>"                          -> Phi3
//   "<|user|>" with "<|assistant|>" or "</s>"/eos_token -> Zephyr
//   "<|channel|>"                                      -> Harmony (checked first)
// A template that is a format name itself ("chatml", ...) selects that format.
// Fallback: an empty or unrecognised template gives `fallback`: ChatML, the most widely used
// format for models without a template of their own (ChatTemplate::for_model: Harmony for a
// vocabulary with gpt-oss's <|channel|> and <|start|> tokens).
ChatFormat detect_chat_format(std::string_view jinja_template, ChatFormat fallback = ChatFormat::ChatML);

// Renders the conversation as text to be tokenized WITH special-token parsing and WITHOUT an
// automatic BOS: the text contains bos_text itself where the format wants it. With
// add_generation_prompt the assistant header that opens the model's reply is appended (formats
// whose user turn already ends in the reply position, Llama2/Mistral, append nothing).
std::string render_chat(ChatFormat fmt, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, std::string_view bos_text,
                        std::string_view eos_text);

// gpt-oss's harmony format (render_chat's Harmony, with tools), as the model's own template
// renders it:
//   <|start|>system<|message|>{model_identity}\nKnowledge cutoff: 2024-06\nCurrent date: {today,
//   YYYY-MM-DD}\n\nReasoning: {reasoning_effort}\n\n# Valid channels: analysis, commentary, final.
//   Channel must be included for every message.[\nCalls to these tools must go to the commentary
//   channel: 'functions'.]<|end|>
//   [<|start|>developer<|message|>[# Instructions\n\n{first system message}\n\n]
//    [# Tools\n\n## functions\n\nnamespace functions {\n\n// {description}\ntype {name} = (_: {\n
//    // {param description}\n{param}[?]: {TypeScript type}[, // default: {default}],\n...}) => any;\n
//    ...\n} // namespace functions]<|end|>]                      (a system message or tools)
//   <|start|>user<|message|>{content}<|end|>
//   <|start|>assistant<|channel|>final<|message|>{content}<|end|>
//   [<|start|>assistant<|channel|>analysis<|message|>{reasoning}<|end|>]
//    <|start|>assistant<|channel|>final<|message|>{content}<|return|>   (the last turn, no generation prompt)
//   <|start|>assistant<|channel|>analysis<|message|>{reasoning, else content}<|end|>
//                                        (a turn with calls, while no final answer follows it)
//   <|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{arguments}<|call|>
//   <|start|>functions.{name} to=assistant<|channel|>commentary<|message|>{result as a JSON string}<|end|>
//   <|start|>developer<|message|># Instructions\n\n{content}\n\n<|end|>  (a later system message)
//   generation prompt <|start|>assistant
// extra (an object or null): "reasoning_effort" (default "medium"; vLLM's and the Responses API's
// reasoning effort arrive as it) and "model_identity" (default "You are ChatGPT, a large language
// model trained by OpenAI."), as the model's template reads them; other variables are ignored.
// A tool result names the call it answers by its tool_call_id (else its name, else the latest
// call). Throws ft::Error on a role other than system, developer, user, assistant or tool.
std::string render_harmony(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                           bool add_generation_prompt, const nlohmann::json& extra = nullptr);

// The variables a Jinja chat template gets, as Hugging Face transformers and vLLM pass them:
// messages [{"role", "content"} + "tool_calls": [{"id", "type": "function", "function": {"name",
// "arguments"}}] (arguments as an object when the JSON text is one, as templates index it; content
// null when an assistant turn is only calls) + "tool_call_id" / "name" for tool results], tools
// (omitted when null), add_generation_prompt, bos_token, eos_token; an assistant turn's reasoning
// as reasoning_content and thinking (see ChatMessage). object_arguments false: the arguments as
// their JSON text and content "" instead of null (templates that concatenate them);
// null_call_content false: content "" instead of null only (gpt-oss's, which tests `in` it).
// Ordered: tools and arguments keep the client's (the model's) key order, as Hugging Face's
// templates see them (Python dicts from JSON); the messages' keys are in the order above.
nlohmann::ordered_json chat_template_context(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                                             bool add_generation_prompt, std::string_view bos_text,
                                             std::string_view eos_text, bool object_arguments = true,
                                             bool null_call_content = true);

// The chat template a model is served with: the GGUF's own Jinja template run by our interpreter
// (tokenizer/jinja.h), or a built-in format.
class ChatTemplate {
 public:
  // A built-in format (implicit: a ChatFormat is a template).
  ChatTemplate(ChatFormat builtin = ChatFormat::ChatML, std::string bos_text = {}, std::string eos_text = {});
  // The GGUF's tokenizer.chat_template: run as Jinja when it parses and renders a probe
  // conversation; otherwise the built-in format detect_chat_format recognises, with `warning` set
  // to why (empty when the Jinja template is used or there is none).
  // fallback: detect_chat_format's, for a template that names no format.
  static ChatTemplate from_gguf(std::string_view jinja_source, std::string bos_text, std::string eos_text,
                                std::string& warning, ChatFormat fallback = ChatFormat::ChatML);
  // A model's: `forced` (a user's --chat-format) or from_gguf of its tokenizer.chat_template, with
  // the tokenizer's BOS/EOS texts. A template that is empty or cannot be run and names no format
  // gives gpt-oss's Harmony where the vocabulary has <|channel|> and <|start|> tokens.
  static ChatTemplate for_model(const Tokenizer& tok, std::string_view jinja_source,
                                std::optional<ChatFormat> forced, std::string& warning);

  // Text to tokenize with special-token parsing and no automatic BOS. Throws ft::Error (the
  // template's own raise_exception included) when the conversation cannot be rendered. A Jinja
  // template that fails on tool calls with object arguments is given them as JSON text (templates
  // differ: Llama 3.1 indexes them, DeepSeek and Functionary concatenate them).
  // extra (an object or null): more variables for a Jinja template (vLLM's chat_template_kwargs,
  // e.g. Llama 3.1's date_string; its documents); it cannot set the ones above (ft::Error). The
  // built-in formats have none but Harmony's reasoning_effort and model_identity (render_harmony).
  // tools: in the client's key order (a json's are sorted).
  std::string render(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::json& extra = nullptr) const;
  bool is_jinja() const { return jinja_ != nullptr; }
  ChatFormat format() const { return format_; }  // the built-in one (used when !is_jinja())
  // gpt-oss's harmony format, built in or the model's own template (detected by its markers): the
  // output is harmony messages (server: HarmonySplit).
  bool harmony() const { return format_ == ChatFormat::Harmony; }
  std::string describe() const;                  // "the model's Jinja template" | "built-in llama3"

 private:
  ChatFormat format_;
  std::string bos_, eos_;
  std::shared_ptr<const jinja::Template> jinja_;
};

}  // namespace ft
