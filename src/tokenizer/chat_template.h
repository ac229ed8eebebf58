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
//
// "<s>", "</s>", "<|begin_of_text|>" above stand for the bos_text / eos_text arguments. In the
// Llama2/Mistral formats a system message that is not first is folded into the following user
// turn the same way. Roles other than system/user/assistant -> ft::Error.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ft {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

enum class ChatFormat { Llama2, Llama3, ChatML, Mistral, Zephyr };

// "llama2", "llama3", "chatml", "mistral", "zephyr".
std::string_view chat_format_name(ChatFormat f);
// Inverse of chat_format_name (case-insensitive); nullopt for other names.
std::optional<ChatFormat> parse_chat_format(std::string_view name);

// Recognises the format from the Jinja source in GGUF `tokenizer.chat_template` by distinctive
// markers, like llama.cpp's llm_chat_detect_template:
//   "<|start_header_id|>"                              -> Llama3
//   "<|im_start|>"                                     -> ChatML
//   "[INST]" with "<<SYS>>"                            -> Llama2
//   "[INST]" without "<<SYS>>"                         -> Mistral
//   "<|user|>" with "<|assistant|>" or "</s>"/eos_token -> Zephyr
// A template that is a format name itself ("chatml", ...) selects that format.
// Fallback: an empty or unrecognised template gives ChatML, the most widely used format for
// models without a template of their own.
ChatFormat detect_chat_format(std::string_view jinja_template);

// Renders the conversation as text to be tokenized WITH special-token parsing and WITHOUT an
// automatic BOS: the text contains bos_text itself where the format wants it. With
// add_generation_prompt the assistant header that opens the model's reply is appended (formats
// whose user turn already ends in the reply position, Llama2/Mistral, append nothing).
std::string render_chat(ChatFormat fmt, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, std::string_view bos_text,
                        std::string_view eos_text);

}  // namespace ft
