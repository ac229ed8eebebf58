// Chat templates: each format renders a fixed conversation to the exact string its Hugging Face
// reference template produces; detection from real Jinja sources; names; errors.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json_ordered.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
};

// Whitespace around contents: Llama 2 strip()s and Llama 3 |trim()s, the others keep it.
const std::vector<ChatMessage> kPadded = {
    {"user", " Hello\n"},
    {"assistant", "   I am an assistant   "},
    {"user", "Again "},
};

TEST(ChatTemplate, Llama2) {
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
      "<s>[INST] Who are you [/INST]";
  EXPECT_EQ(render_chat(ChatFormat::Llama2, kConversation, true, "<s>", "</s>"), expected);
  // The user turn already ends where the reply starts: no generation prompt to add.
  EXPECT_EQ(render_chat(ChatFormat::Llama2, kConversation, false, "<s>", "</s>"), expected);
  EXPECT_EQ(render_chat(ChatFormat::Llama2, kPadded, true, "<s>", "</s>"),
            "<s>[INST] Hello [/INST] I am an assistant </s><s>[INST] Again [/INST]");
}

TEST(ChatTemplate, Llama3) {
  const std::string body =
      "<|begin_of_text|>"
      "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>";
  EXPECT_EQ(render_chat(ChatFormat::Llama3, kConversation, true, "<|begin_of_text|>", "<|eot_id|>"),
            body + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat(ChatFormat::Llama3, kConversation, false, "<|begin_of_text|>", "<|eot_id|>"),
            body);
  EXPECT_EQ(render_chat(ChatFormat::Llama3, kPadded, false, "<|begin_of_text|>", "<|eot_id|>"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nAgain<|eot_id|>");
}

TEST(ChatTemplate, ChatML) {
  const std::string body =
      "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
      "<|im_start|>user\nHello<|im_end|>\n"
      "<|im_start|>assistant\nHi there<|im_end|>\n"
      "<|im_start|>user\nWho are you<|im_end|>\n";
  // No BOS in ChatML even when the vocabulary has one.
  EXPECT_EQ(render_chat(ChatFormat::ChatML, kConversation, true, "<s>", "</s>"),
            body + "<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFormat::ChatML, kConversation, false, "<s>", "</s>"), body);
  EXPECT_EQ(render_chat(ChatFormat::ChatML, kPadded, false, "", ""),
            "<|im_start|>user\n Hello\n<|im_end|>\n"
            "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n"
            "<|im_start|>user\nAgain <|im_end|>\n");
}

TEST(ChatTemplate, Mistral) {
  const std::string expected =
      "<s>[INST] You are a helpful assistant\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]";
  EXPECT_EQ(render_chat(ChatFormat::Mistral, kConversation, true, "<s>", "</s>"), expected);
  EXPECT_EQ(render_chat(ChatFormat::Mistral, kConversation, false, "<s>", "</s>"), expected);
  EXPECT_EQ(render_chat(ChatFormat::Mistral, kPadded, true, "<s>", "</s>"),
            "<s>[INST]  Hello\n [/INST]   I am an assistant   </s>[INST] Again  [/INST]");
}

TEST(ChatTemplate, Zephyr) {
  const std::string body =
      "<|system|>\nYou are a helpful assistant</s>\n"
      "<|user|>\nHello</s>\n"
      "<|assistant|>\nHi there</s>\n"
      "<|user|>\nWho are you</s>\n";
  EXPECT_EQ(render_chat(ChatFormat::Zephyr, kConversation, true, "<s>", "</s>"),
            body + "<|assistant|>\n");
  EXPECT_EQ(render_chat(ChatFormat::Zephyr, kConversation, false, "<s>", "</s>"), body);
  // The EOS text is the vocabulary's, not a fixed "</s>".
  EXPECT_EQ(render_chat(ChatFormat::Zephyr, {{"user", "Hi"}}, true, "", "<|endoftext|>"),
            "<|user|>\nHi<|endoftext|>\n<|assistant|>\n");
}

TEST(ChatTemplate, Gemma) {
  // No system role: its text opens the next user turn, then a blank line.
  EXPECT_EQ(render_chat(ChatFormat::Gemma, kConversation, true, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
            "<start_of_turn>model\nHi there<end_of_turn>\n"
            "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_chat(ChatFormat::Gemma, kPadded, false, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n"
            "<start_of_turn>user\nAgain<end_of_turn>\n");
}

TEST(ChatTemplate, Phi3) {
  const std::string body =
      "<|system|>\nYou are a helpful assistant<|end|>\n"
      "<|user|>\nHello<|end|>\n"
      "<|assistant|>\nHi there<|end|>\n"
      "<|user|>\nWho are you<|end|>\n";
  EXPECT_EQ(render_chat(ChatFormat::Phi3, kConversation, true, "<s>", "<|endoftext|>"), body + "<|assistant|>\n");
  EXPECT_EQ(render_chat(ChatFormat::Phi3, kConversation, false, "<s>", "<|endoftext|>"), body + "<|endoftext|>");
  EXPECT_EQ(render_chat(ChatFormat::Phi3, {{"system", ""}, {"user", "Hi"}}, true, "<s>", "</s>"),
            "<|user|>\nHi<|end|>\n<|assistant|>\n");
}

// The built-in Gemma and Phi-3 formats render what the families' real templates
// (../shared/templates, run by the Jinja interpreter, itself checked against jinja2) render, for
// the conversations those templates accept (Gemma's refuses a system turn).
TEST(ChatTemplate, GemmaAndPhi3BuiltinsMatchTheirJinjaTemplates) {
  struct Family { const char* file; ChatFormat fmt; bool system; };
  for (const Family f : {Family{"templates/google-gemma-2-2b-it.jinja", ChatFormat::Gemma, false},
                         Family{"templates/microsoft-Phi-3.5-mini-instruct.jinja", ChatFormat::Phi3, true}}) {
    FT_REQUIRE_SHARED(path, f.file);
    const std::string src = test::read_file(path);
    EXPECT_EQ(detect_chat_format(src), f.fmt) << f.file;
    std::string warning;
    const ChatTemplate jinja = ChatTemplate::from_gguf(src, "<bos>", "<eos>", warning);
    ASSERT_TRUE(jinja.is_jinja()) << f.file << ": " << warning;
    const ChatTemplate builtin(f.fmt, "<bos>", "<eos>");
    for (const auto* conv : {&kConversation, &kPadded}) {
      std::vector<ChatMessage> msgs = *conv;
      if (!f.system && msgs.front().role == "system") msgs.erase(msgs.begin());
      for (bool gen : {true, false})
        EXPECT_EQ(builtin.render(msgs, nullptr, gen), jinja.render(msgs, nullptr, gen)) << f.file << " gen " << gen;
    }
  }
}

// More template variables (vLLM's chat_template_kwargs and documents): Llama 3.1's date_string
// (its default "26 Jul 2024" otherwise), Command R7B's documents (a tool-result turn of them);
// a variable the request sets itself cannot be replaced.
TEST(ChatTemplate, ExtraVariablesReachTheTemplate) {
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  {
    FT_REQUIRE_SHARED(path, "templates/meta-llama-Llama-3.1-8B-Instruct.jinja");
    std::string warning;
    const ChatTemplate t = ChatTemplate::from_gguf(test::read_file(path), "<|begin_of_text|>", "<|eot_id|>", warning);
    ASSERT_TRUE(t.is_jinja()) << warning;
    EXPECT_NE(t.render(msgs, nullptr, true).find("Today Date: 26 Jul 2024\n"), std::string::npos);
    const std::string dated = t.render(msgs, nullptr, true, {{"date_string", "05 Dec 2026"}});
    EXPECT_NE(dated.find("Today Date: 05 Dec 2026\n"), std::string::npos) << dated;
    EXPECT_EQ(dated.find("26 Jul 2024"), std::string::npos);
    EXPECT_THROW(t.render(msgs, nullptr, true, {{"messages", nlohmann::json::array()}}), Error);
    EXPECT_THROW(t.render(msgs, nullptr, true, {{"tools", nlohmann::json::array()}}), Error);
  }
  {
    FT_REQUIRE_SHARED(path, "templates/CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja");
    std::string warning;
    const ChatTemplate t = ChatTemplate::from_gguf(test::read_file(path), "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", warning);
    ASSERT_TRUE(t.is_jinja()) << warning;
    const nlohmann::json docs = {{"documents", {{{"title", "Tides"}, {"text", "The moon pulls the sea."}}}}};
    const std::string with = t.render(msgs, nullptr, true, docs);
    EXPECT_NE(with.find("The moon pulls the sea."), std::string::npos) << with;
    EXPECT_NE(with.find("direct-injected-document"), std::string::npos);
    EXPECT_EQ(t.render(msgs, nullptr, true).find("direct-injected-document"), std::string::npos);
  }
}

// Tools and a call's arguments reach a template in the client's key order (Hugging Face's templates
// see Python dicts of the client's JSON): a request's JSON is read sorted, so `tools | tojson` listed
// a tool's parameters alphabetically ("alpha" before "zeta"), and an answer's arguments sent back
// came out re-sorted, unlike what the model wrote. The built-in harmony renderer too.
TEST(ChatTemplate, ToolsAndArgumentsKeepTheClientsOrder) {
  const auto tools = parse_ordered_json(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}, "required": ["zeta", "alpha"]}}}])");
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"call_1", "f", R"({"zeta": "z", "alpha": 1})"});
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}, call, {"tool", "ok"}};
  std::string warning;
  const ChatTemplate t = ChatTemplate::from_gguf(
      "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}"
      "{% endif %}{% endfor %}",
      "", "", warning);
  ASSERT_TRUE(t.is_jinja()) << warning;
  const std::string out = t.render(msgs, tools, true);
  EXPECT_NE(out.find(R"("properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}})"), std::string::npos) << out;
  EXPECT_NE(out.find(R"({"zeta": "z", "alpha": 1})"), std::string::npos) << out;
  const std::string harmony = render_harmony(msgs, tools, true);
  EXPECT_LT(harmony.find("zeta"), harmony.find("alpha")) << harmony;
}

TEST(ChatTemplate, UserOnlyConversations) {
  const std::vector<ChatMessage> one = {{"user", "Hi"}};
  EXPECT_EQ(render_chat(ChatFormat::Llama2, one, true, "<s>", "</s>"), "<s>[INST] Hi [/INST]");
  EXPECT_EQ(render_chat(ChatFormat::Mistral, one, true, "<s>", "</s>"), "<s>[INST] Hi [/INST]");
  EXPECT_EQ(render_chat(ChatFormat::ChatML, one, true, "", ""),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, UnknownRoleThrows) {
  const std::vector<ChatMessage> bad = {{"user", "Hi"}, {"robot", "42"}};
  for (ChatFormat f : {ChatFormat::Llama2, ChatFormat::Llama3, ChatFormat::ChatML, ChatFormat::Mistral,
                       ChatFormat::Zephyr, ChatFormat::Gemma, ChatFormat::Phi3, ChatFormat::Harmony}) {
    try {
      render_chat(f, bad, true, "<s>", "</s>");
      ADD_FAILURE() << chat_format_name(f) << " accepted role 'robot'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("robot"), std::string::npos) << e.what();
    }
  }
}

TEST(ChatTemplate, ToolCallsAndResultsInBuiltinFormats) {
  std::vector<ChatMessage> conv = {{"user", "Weather?"}, {"assistant", ""}, {"tool", "sunny"}};
  conv[1].tool_calls.push_back({"call_1", "get_weather", R"({"city":"Paris"})"});
  EXPECT_EQ(render_chat(ChatFormat::ChatML, conv, true, "", ""),
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
            "{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}<|im_end|>\n"
            "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_NE(render_chat(ChatFormat::Llama3, conv, true, "<s>", "</s>").find("<|start_header_id|>ipython<|end_header_id|>\n\nsunny"),
            std::string::npos);
  EXPECT_EQ(render_chat(ChatFormat::Mistral, conv, false, "<s>", "</s>"),
            "<s>[INST] Weather? [/INST]{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}</s>[INST] sunny [/INST]");
}

// A call's line is one line of valid JSON whatever its name and arguments hold: the name as a JSON
// string; arguments that are JSON on one line as they are (what the model wrote), JSON over
// several lines written again on one, anything else as a JSON string. (Pasted as they came, a
// name `a"b` and arguments `not json` made a line no JSON parser reads.)
TEST(ChatTemplate, BuiltinToolCallLinesAreValidJson) {
  const auto line = [](const std::string& name, const std::string& args) {
    std::vector<ChatMessage> conv = {{"user", "q"}, {"assistant", ""}};
    conv[1].tool_calls.push_back({"call_1", name, args});
    const std::string r = render_chat(ChatFormat::ChatML, conv, false, "", "");
    const std::string open = "<|im_start|>assistant\n";
    const size_t at = r.find(open) + open.size();
    return r.substr(at, r.find("<|im_end|>", at) - at);
  };
  const std::string bad = line("a\"b\n", "not json");
  EXPECT_EQ(bad.find('\n'), std::string::npos) << bad;
  const nlohmann::json j = nlohmann::json::parse(bad, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << bad;
  EXPECT_EQ(j["name"], "a\"b\n");
  EXPECT_EQ(j["arguments"], "not json");
  EXPECT_EQ(line("f", R"({"b": 1, "a": [true, null]})"), R"({"name": "f", "arguments": {"b": 1, "a": [true, null]}})");
  EXPECT_EQ(line("f", "{\n  \"b\": 1,\n  \"a\": \"x\"\n}"), R"({"name": "f", "arguments": {"b":1,"a":"x"}})");
  EXPECT_EQ(line("f", "5"), R"({"name": "f", "arguments": 5})");
  EXPECT_EQ(line("f", ""), R"({"name": "f", "arguments": {}})");
  EXPECT_EQ(line("f", R"({"a": 1} x)"), R"({"name": "f", "arguments": "{\"a\": 1} x"})");
  const std::string deep = std::string(200, '[') + std::string(200, ']');  // (past kMaxJsonDepth: a string)
  EXPECT_EQ(nlohmann::json::parse(line("f", deep))["arguments"], deep);
}

TEST(ChatTemplate, Names) {
  for (ChatFormat f : {ChatFormat::Llama2, ChatFormat::Llama3, ChatFormat::ChatML, ChatFormat::Mistral,
                       ChatFormat::Zephyr, ChatFormat::Gemma, ChatFormat::Phi3, ChatFormat::Harmony}) {
    EXPECT_EQ(parse_chat_format(chat_format_name(f)), f);
  }
  EXPECT_EQ(chat_format_name(ChatFormat::Harmony), "gpt-oss");
  EXPECT_EQ(parse_chat_format("Harmony"), ChatFormat::Harmony);
  EXPECT_EQ(chat_format_name(ChatFormat::Llama3), "llama3");
  EXPECT_EQ(parse_chat_format("ChatML"), ChatFormat::ChatML);
  EXPECT_EQ(parse_chat_format("llama"), std::nullopt);
  EXPECT_EQ(parse_chat_format(""), std::nullopt);
  EXPECT_EQ(chat_format_names(), "llama2, llama3, chatml, mistral, zephyr, gemma, phi3, gpt-oss");
}

// Jinja sources as stored in GGUF tokenizer.chat_template (escapes are literal backslashes).
const char* kLlama3Jinja =
    R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})";
const char* kChatMLJinja =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";
const char* kLlama2Jinja =
    R"({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})";
const char* kMistralJinja =
    R"({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})";
const char* kZephyrJinja =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + "
    "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' "
    "+ message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ "
    "'<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and "
    "add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";
const char* kPhi3Jinja =
    R"({% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %})";
const char* kGemmaJinja =
    R"({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %})";

TEST(ChatTemplate, DetectsFormats) {
  EXPECT_EQ(detect_chat_format(kLlama3Jinja), ChatFormat::Llama3);
  EXPECT_EQ(detect_chat_format(kChatMLJinja), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format(kLlama2Jinja), ChatFormat::Llama2);
  EXPECT_EQ(detect_chat_format(kMistralJinja), ChatFormat::Mistral);
  EXPECT_EQ(detect_chat_format(kZephyrJinja), ChatFormat::Zephyr);
  EXPECT_EQ(detect_chat_format(kGemmaJinja), ChatFormat::Gemma);
  EXPECT_EQ(detect_chat_format(kPhi3Jinja), ChatFormat::Phi3);  // not Zephyr despite <|user|>
  // A template given as a format name.
  EXPECT_EQ(detect_chat_format("zephyr"), ChatFormat::Zephyr);
  EXPECT_EQ(detect_chat_format("llama2"), ChatFormat::Llama2);
}

TEST(ChatTemplate, FallbackIsChatML) {
  EXPECT_EQ(detect_chat_format(""), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format("{{ messages[0]['content'] }}"), ChatFormat::ChatML);
}

// --- gpt-oss's harmony format --------------------------------------------------------------------

// The date the system message carries: today, as the model's template's strftime_now("%Y-%m-%d").
std::string harmony_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  return std::string(buf, std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm));
}

std::string harmony_system(const std::string& effort, bool tools) {
  return "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
         "Knowledge cutoff: 2024-06\nCurrent date: " + harmony_date() + "\n\nReasoning: " + effort + "\n\n"
         "# Valid channels: analysis, commentary, final. Channel must be included for every message." +
         (tools ? "\nCalls to these tools must go to the commentary channel: 'functions'." : "") + "<|end|>";
}

// The structure gpt-oss's own template renders (its system message, the request's system message
// as the developer's instructions, final-channel assistant turns, <|start|>assistant to generate).
TEST(ChatTemplate, Harmony) {
  const std::string body = harmony_system("medium", false) +
                           "<|start|>developer<|message|># Instructions\n\nYou are a helpful assistant\n\n<|end|>"
                           "<|start|>user<|message|>Hello<|end|>"
                           "<|start|>assistant<|channel|>final<|message|>Hi there<|end|>"
                           "<|start|>user<|message|>Who are you<|end|>";
  EXPECT_EQ(render_chat(ChatFormat::Harmony, kConversation, true, "<bos>", "<eos>"), body + "<|start|>assistant");
  EXPECT_EQ(render_chat(ChatFormat::Harmony, kConversation, false, "<bos>", "<eos>"), body);
  // No system message: no developer message; contents as they are (no trimming).
  EXPECT_EQ(render_chat(ChatFormat::Harmony, kPadded, true, "", ""),
            harmony_system("medium", false) + "<|start|>user<|message|> Hello\n<|end|>"
            "<|start|>assistant<|channel|>final<|message|>   I am an assistant   <|end|>"
            "<|start|>user<|message|>Again <|end|><|start|>assistant");
  // A later system message is the developer's too, in its place.
  EXPECT_EQ(render_chat(ChatFormat::Harmony, {{"user", "a"}, {"system", "b"}}, true, "", ""),
            harmony_system("medium", false) + "<|start|>user<|message|>a<|end|>"
            "<|start|>developer<|message|># Instructions\n\nb\n\n<|end|><|start|>assistant");
}

// Reasoning effort and model identity, the variables gpt-oss's template reads (chat_template_kwargs,
// the Responses API's reasoning.effort, chat's reasoning_effort), reach the built-in format too.
TEST(ChatTemplate, HarmonyVariables) {
  const ChatTemplate t(ChatFormat::Harmony);
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  EXPECT_EQ(t.render(msgs, nullptr, true, {{"reasoning_effort", "high"}}),
            harmony_system("high", false) + "<|start|>user<|message|>Hi<|end|><|start|>assistant");
  const std::string who = t.render(msgs, nullptr, true, {{"model_identity", "You are Bob."}, {"other", 1}});
  EXPECT_TRUE(who.starts_with("<|start|>system<|message|>You are Bob.\nKnowledge cutoff: 2024-06\n")) << who;
  EXPECT_TRUE(t.harmony());
  EXPECT_FALSE(ChatTemplate(ChatFormat::ChatML).harmony());
}

// Tools: the system message says where calls go, the developer message lists the functions as a
// TypeScript namespace; an assistant's call is a commentary message to=functions.NAME ending in
// <|call|>, its result a message from functions.NAME to the assistant (a JSON string), as
// gpt-oss's own template writes them.
TEST(ChatTemplate, HarmonyToolsCallsAndResults) {
  const nlohmann::json tools = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Gets the weather.",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
        "days": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}}])");
  std::vector<ChatMessage> conv = {{"system", "Be brief."}, {"user", "Weather in Paris?"}, {"assistant", ""},
                                   {"tool", "sunny"}, {"assistant", "Sunny."}};
  conv[2].tool_calls.push_back({"call_1", "get_weather", R"({"city":"Paris"})"});
  conv[3].tool_call_id = "call_1";
  const ChatTemplate t(ChatFormat::Harmony);
  EXPECT_EQ(t.render(conv, tools, true),
            harmony_system("medium", true) +
                "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n## functions\n\n"
                "namespace functions {\n\n"
                "// Gets the weather.\ntype get_weather = (_: {\n// The city\ncity: string,\ndays?: number,\ntags?: string[],\n"
                "unit?: \"c\" | \"f\", // default: c,\n}) => any;\n\n"
                "type now = () => any;\n\n} // namespace functions<|end|>"
                "<|start|>user<|message|>Weather in Paris?<|end|>"
                "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}<|call|>"
                "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|>"
                "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|><|start|>assistant");
  // Tools without a system message: the developer message has the tools alone; text with calls
  // is an analysis message before them while no final answer follows (the template's rule); a
  // result without an id answers the latest call.
  conv.erase(conv.begin());
  conv[1].content = "Let me check.";
  conv[2].tool_call_id.clear();
  EXPECT_EQ(t.render(conv, tools, false).find("Let me check."), std::string::npos);
  conv.pop_back();
  const std::string r = t.render(conv, tools, false);
  EXPECT_NE(r.find("<|start|>developer<|message|># Tools\n\n## functions\n\n"), std::string::npos) << r;
  EXPECT_NE(r.find("<|start|>assistant<|channel|>analysis<|message|>Let me check.<|end|>"
                   "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"), std::string::npos) << r;
  EXPECT_NE(r.find("<|start|>functions.get_weather to=assistant<|channel|>"), std::string::npos) << r;
}

// A tool with 40,000 properties, every other one required (a 1.5 MB request): each property's
// "required" is a set lookup (a scan of the list was 8e8 comparisons, minutes of an I/O thread).
TEST(ChatTemplate, HarmonyToolsWithManyRequiredProperties) {
  nlohmann::json props = nlohmann::json::object(), required = nlohmann::json::array();
  for (int i = 0; i < 40000; ++i) {
    props["p" + std::to_string(i)] = {{"type", "string"}};
    if (i % 2 == 0) required.push_back("p" + std::to_string(i));
  }
  required.push_back(5);  // (not a name: ignored)
  const nlohmann::json tools = {{{"type", "function"},
                                 {"function", {{"name", "f"}, {"parameters", {{"type", "object"}, {"properties", props}, {"required", required}}}}}}};
  const auto t0 = std::chrono::steady_clock::now();
  const std::string r = ChatTemplate(ChatFormat::Harmony).render({{"user", "hi"}}, tools, true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.find("\np0: string,\np1?: string,\n"), std::string::npos);
  EXPECT_NE(r.find("\np39998: string,\np39999?: string,\n"), std::string::npos);
  EXPECT_LT(s, 10.0);  // (~0.1 s; the scan took minutes)
}

// Long conversations of calls render in time linear in their length: whether a final answer
// follows a turn with calls is found in one backward pass (each such turn scanned the rest: 67,000
// of them took 11 s), and a result's call by its id in a map (each result scanned every earlier
// call when its id matched none).
TEST(ChatTemplate, HarmonyManyCallsAndResultsRenderInLinearTime) {
  constexpr int N = 30000;
  const auto seconds = [](const std::vector<ChatMessage>& conv) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string r = ChatTemplate(ChatFormat::Harmony).render(conv, nullptr, true);
    EXPECT_GT(r.size(), conv.size() * 20);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<ChatMessage> plain(N + 1, ChatMessage{"user", "q"}), turns = {{"user", "q"}}, results = {{"user", "q"}, {"assistant", ""}};
  for (int i = 0; i < N; ++i) {
    turns.push_back({"assistant", ""});
    turns.back().tool_calls.push_back({"c" + std::to_string(i), "f", "{}"});
    results[1].tool_calls.push_back({"c" + std::to_string(i), "f", "{}"});
  }
  for (int i = 0; i < N; ++i) {
    results.push_back({"tool", "r"});
    results.back().tool_call_id = "x" + std::to_string(i);  // (no such call: the latest call's name)
  }
  const double base = seconds(plain), t_turns = seconds(turns), t_results = seconds(results);
  // (~10 ms each in a release build; the scans took ~2 s)
  EXPECT_LT(t_turns, 0.3 + 20 * base) << base;
  EXPECT_LT(t_results, 0.3 + 20 * base) << base;

  // A result names the latest call with its id (a nameless one names nothing), else the latest call.
  std::vector<ChatMessage> conv = {{"user", "q"}, {"assistant", ""}, {"assistant", ""}, {"tool", "1"}, {"tool", "2"}, {"tool", "3"}};
  conv[1].tool_calls = {{"a", "old_a", "{}"}, {"b", "fb", "{}"}};
  conv[2].tool_calls = {{"a", "new_a", "{}"}, {"b", "", "{}"}, {"z", "last", "{}"}};
  conv[3].tool_call_id = "a";
  conv[4].tool_call_id = "b";
  conv[5].tool_call_id = "nope";
  const std::string r = ChatTemplate(ChatFormat::Harmony).render(conv, nullptr, true);
  EXPECT_NE(r.find("<|start|>functions.new_a to=assistant<|channel|>commentary<|message|>\"1\""), std::string::npos) << r;
  EXPECT_NE(r.find("<|start|>functions.fb to=assistant<|channel|>commentary<|message|>\"2\""), std::string::npos) << r;
  EXPECT_NE(r.find("<|start|>functions.last to=assistant<|channel|>commentary<|message|>\"3\""), std::string::npos) << r;
}

// A render that fails on one of the interpreter's limits (here a string past 64 MB, before it is
// built) is not tried again in the other shapes of calls: it would cost as much again (three
// renders of up to kRenderWork). This template fails only where a call's content is null (the
// first shape): the second try would have rendered it.
TEST(ChatTemplate, InterpreterLimitsAreNotRetried) {
  std::string warning;
  const ChatTemplate t = ChatTemplate::from_gguf(
      "{%- for m in messages %}{%- if m.content is none %}{{ 'x' * 100000000 }}{%- endif %}"
      "{{ m.role }}: {{ m.content }}\n{% endfor %}",
      "", "", warning);
  ASSERT_EQ(t.describe(), "the model's Jinja template") << warning;
  std::vector<ChatMessage> conv = {{"user", "q"}, {"assistant", ""}};
  conv[1].tool_calls.push_back({"c1", "f", "{}"});
  try {
    const std::string r = t.render(conv, nullptr, true);
    ADD_FAILURE() << "rendered after a limit, in another shape: " << r;
  } catch (const jinja::LimitExceeded& e) {
    EXPECT_NE(std::string(e.what()).find("string too long"), std::string::npos) << e.what();
  }
  conv[1].tool_calls.clear();
  EXPECT_EQ(t.render(conv, nullptr, true), "user: q\nassistant: \n");
}

// Recognised from the model's own template by its channels (it has <|start|>/<|end|> turns and
// no <|user|>: not Phi-3); a template that names no format and cannot run (or none at all) on a
// vocabulary with gpt-oss's <|channel|> and <|start|> tokens gets the built-in gpt-oss format.
TEST(ChatTemplate, HarmonyDetection) {
  EXPECT_EQ(detect_chat_format(R"({{- "<|start|>system<|message|>" }}{%- for m in messages %}{{ "<|start|>" + m.role + "<|channel|>final<|message|>" + m.content + "<|end|>" }}{% endfor %})"),
            ChatFormat::Harmony);
  EXPECT_EQ(detect_chat_format("gpt-oss"), ChatFormat::Harmony);
  EXPECT_EQ(detect_chat_format("", ChatFormat::Harmony), ChatFormat::Harmony);
  EXPECT_EQ(detect_chat_format(kChatMLJinja, ChatFormat::Harmony), ChatFormat::ChatML);  // (a recognised template wins)

  // A small SentencePiece vocabulary with (or without) harmony's control tokens.
  auto vocab = [](bool harmony) {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a", "b"};
    std::vector<int32_t> types = {2, 3, 3, 1, 1};
    if (harmony)
      for (const char* t : {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}) {
        tokens.push_back(t);
        types.push_back(3);
      }
    GGUFWriter w;
    w.set("general.architecture", GGUFValue::of_str("llama"));
    w.set("tokenizer.ggml.model", GGUFValue::of_str("llama"));
    w.set("tokenizer.ggml.tokens", GGUFValue::of_str_array(tokens));
    w.set("tokenizer.ggml.scores", GGUFValue::of_f32_array(std::vector<float>(tokens.size(), 0.0f)));
    w.set("tokenizer.ggml.token_type", GGUFValue::of_i32_array(types));
    w.set("tokenizer.ggml.bos_token_id", GGUFValue::of_u32(1));
    w.set("tokenizer.ggml.eos_token_id", GGUFValue::of_u32(2));
    const auto bytes = w.to_bytes();
    return Tokenizer::from_gguf(*GGUFFile::parse(bytes.data(), bytes.size(), "memory.gguf"));
  };
  const Tokenizer gpt_oss = vocab(true), plain = vocab(false);
  std::string warning;
  EXPECT_EQ(ChatTemplate::for_model(gpt_oss, "", std::nullopt, warning).format(), ChatFormat::Harmony);
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(ChatTemplate::for_model(plain, "", std::nullopt, warning).format(), ChatFormat::ChatML);
  const char* unrunnable = "{% frobnicate %}";
  const ChatTemplate t = ChatTemplate::for_model(gpt_oss, unrunnable, std::nullopt, warning);
  EXPECT_FALSE(t.is_jinja());
  EXPECT_EQ(t.format(), ChatFormat::Harmony);
  EXPECT_NE(warning.find("'gpt-oss'"), std::string::npos) << warning;
  EXPECT_EQ(ChatTemplate::for_model(plain, unrunnable, std::nullopt, warning).format(), ChatFormat::ChatML);
  EXPECT_EQ(ChatTemplate::for_model(gpt_oss, kChatMLJinja, ChatFormat::Gemma, warning).format(), ChatFormat::Gemma);  // --chat-format
  // The model's own template, where it runs, is used (and read as harmony by its markers).
  const ChatTemplate own = ChatTemplate::for_model(
      gpt_oss, R"({% for m in messages %}{{ "<|start|>" + m.role + "<|channel|>final<|message|>" + m.content + "<|end|>" }}{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %})",
      std::nullopt, warning);
  EXPECT_TRUE(own.is_jinja()) << warning;
  EXPECT_TRUE(own.harmony());
}

}  // namespace
}  // namespace ft
