// The server's pure parts: request parsing/validation, response/SSE formatting, stop strings,
// HTTP framing, metrics text and the config file. (The running server is tested end to end by
// tests/e2e/node with the official openai client.)
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <functional>
#include <future>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <tuple>
#include <map>
#include <optional>
#include <thread>
#include <random>
#include <set>
#include <variant>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "gguf/gguf.h"
#include "server/api.h"
#include "server/config.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/routes.h"
#include "server/server.h"
#include "model/model.h"
#include "model/synthetic.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ft::server {
namespace {

using json = nlohmann::json;

const ModelInfo kModel{"stories260K", 512, 512, {}};

ParsedRequest parse_c(const json& j) { return parse_request(Endpoint::Completions, j.dump(), kModel); }
ParsedRequest parse_chat(const json& j) { return parse_request(Endpoint::Chat, j.dump(), kModel); }

// Expects a 400 naming `param` (empty: any) whose message contains `needle`.
void expect_400(Endpoint kind, const std::string& body, const std::string& param, const std::string& needle) {
  try {
    parse_request(kind, body, kModel);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.type, "invalid_request_error") << body;
    if (!param.empty()) {
      EXPECT_EQ(e.param, param) << body;
    }
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ServerParse, CompletionDefaultsAndFields) {
  const auto r = parse_c({{"model", "stories260K"}, {"prompt", "Once"}});
  EXPECT_EQ(r.prompt_text, "Once");
  EXPECT_EQ(r.prompt_kind, PromptKind::Text);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);  // OpenAI default, not the CLI's 0.8
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(*r.max_tokens, 16);  // OpenAI's completions default, cut to the context
  EXPECT_TRUE(r.fit_max_tokens);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.seed_set);

  const auto s = parse_c({{"model", "stories260K"}, {"prompt", {1, 2, 3}}, {"max_tokens", 7}, {"temperature", 0},
                          {"top_p", 0.5}, {"top_k", 5}, {"min_p", 0.1}, {"seed", 42}, {"stop", "\n"},
                          {"presence_penalty", 0.5}, {"frequency_penalty", -0.5}, {"ignore_eos", true},
                          {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"n", 1}});
  EXPECT_EQ(s.prompt_kind, PromptKind::Tokens);
  EXPECT_EQ(s.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*s.max_tokens, 7);
  EXPECT_FALSE(s.fit_max_tokens);  // given: a value past the context is an error
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(s.sampling.top_p, 0.5f);
  EXPECT_EQ(s.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(s.sampling.min_p, 0.1f);
  EXPECT_EQ(s.sampling.seed, 42u);
  EXPECT_TRUE(s.seed_set);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"\n"}));
  EXPECT_FLOAT_EQ(s.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.sampling.frequency_penalty, -0.5f);
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_TRUE(s.stream);
  EXPECT_TRUE(s.include_usage);

  // Scheduling extensions.
  const auto x = parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"ttft_slo_ms", 250}, {"priority", -3}});
  EXPECT_DOUBLE_EQ(x.ttft_slo_ms, 250);
  EXPECT_EQ(x.priority, -3);
  EXPECT_DOUBLE_EQ(r.ttft_slo_ms, 0);  // the server's default
  EXPECT_EQ(r.priority, 0);

  // A one-element batch is the same as a single prompt.
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", {"x"}}}).prompt_text, "x");
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", {{5, 6}}}}).prompt_tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"stop", {"a", "b"}}}).stop.size(), 2u);
}

TEST(ServerParse, ChatMessages) {
  const auto r = parse_chat({{"model", "stories260K"},
                             {"messages", {{{"role", "system"}, {"content", "Be brief"}},
                                           {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}}},
                             {"max_completion_tokens", 9}});
  EXPECT_EQ(r.prompt_kind, PromptKind::Chat);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi");
  EXPECT_EQ(*r.max_tokens, 9);
}

TEST(ServerParse, BadInputIs400NamingTheParam) {
  using E = Endpoint;
  expect_400(E::Completions, "{not json", "", "not valid JSON");
  expect_400(E::Completions, "[1,2]", "", "JSON object");
  expect_400(E::Completions, R"({"prompt":"x"})", "model", "required");
  expect_400(E::Completions, R"({"model":"stories260K"})", "prompt", "required");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","ttft_slo_ms":0})", "ttft_slo_ms", "> 0");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","priority":1.5})", "priority", "integer");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":5})", "prompt", "string or an array");
  EXPECT_EQ(parse_request(E::Completions, R"({"model":"stories260K","prompt":""})", kModel).prompt_text, "");  // a document's start
  expect_400(E::Completions, R"({"model":"stories260K","prompt":[1,512]})", "prompt", "out of range");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":[1,-1]})", "prompt", "out of range");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","max_tokens":"9"})", "max_tokens", "integer");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","max_tokens":0})", "max_tokens", "[1, 512]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","max_tokens":1.5})", "max_tokens", "integer");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","temperature":-1})", "temperature", "[0, 2]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","temperature":"hot"})", "temperature", "number");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","top_p":0})", "top_p", "(0, 1]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","top_p":1.5})", "top_p", "[0, 1]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","top_k":-2})", "top_k", "[-1,");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","min_p":2})", "min_p", "[0, 1]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","presence_penalty":3})", "presence_penalty", "[-2, 2]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","frequency_penalty":-3})", "frequency_penalty", "[-2, 2]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","seed":"7"})", "seed", "integer");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","stop":5})", "stop", "string or an array");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","stop":["a",1]})", "stop", "string or an array");
  {
    json many = {{"model", "stories260K"}, {"prompt", "x"}, {"stop", json::array()}};
    for (size_t k = 0; k < kMaxStops; ++k) many["stop"].push_back("s" + std::to_string(k));
    EXPECT_EQ(parse_request(E::Completions, many.dump(), kModel).stop.size(), kMaxStops);
    many["stop"].push_back("one more");
    expect_400(E::Completions, many.dump(), "stop", "at most " + std::to_string(kMaxStops));
    many["stop"] = {std::string(kMaxStopBytes / 2, 'a'), std::string(kMaxStopBytes / 2 + 1, 'b')};
    expect_400(E::Completions, many.dump(), "stop", "bytes in all");
    many["stop"] = {std::string(kMaxStopBytes / 2, 'a')};
    EXPECT_EQ(parse_request(E::Completions, many.dump(), kModel).stop.size(), 1u);
  }
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","stop":""})", "stop", "empty");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","stream":"yes"})", "stream", "boolean");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","stream_options":{"include_usage":true}})",
             "stream_options", "only allowed");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","ignore_eos":1})", "ignore_eos", "boolean");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","logprobs":21})", "logprobs", "[0, 20]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","logprobs":-1})", "logprobs", "[0, 20]");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","logprobs":true})", "logprobs", "integer");
  expect_400(E::Chat, R"({"model":"stories260K"})", "messages", "required");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[]})", "messages", "non-empty");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"content":"x"}]})", "messages[0]", "role");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"role":"robot","content":"x"}]})", "messages[0].role", "robot");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"role":"user","content":5}]})", "messages[0].content", "string");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"top_logprobs":3})",
             "top_logprobs", "requires 'logprobs'");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":3})",
             "top_logprobs", "requires 'logprobs'");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})",
             "top_logprobs", "[0, 20]");
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"logprobs":3})",
             "logprobs", "boolean");
}

TEST(ServerParse, UnknownModelIs404) {
  for (Endpoint kind : {Endpoint::Completions, Endpoint::Chat}) {
    try {
      parse_request(kind, R"({"model":"gpt-4","prompt":"x","messages":[{"role":"user","content":"x"}]})", kModel);
      ADD_FAILURE() << "accepted another model";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 404);
      EXPECT_EQ(e.code, "model_not_found");
      EXPECT_EQ(e.param, "model");
    }
  }
}

// Every field of OpenAI's current schemas, as the SDKs send them (nulls included), is accepted;
// those meaningless here are listed as ignored, foreign ones as unknown (a warning, not a 400).
TEST(ServerParse, EveryOpenAIFieldIsAccepted) {
  const json chat = json::parse(R"({
    "model": "stories260K", "messages": [{"role": "developer", "content": "Be brief"},
                                         {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    "store": false, "metadata": {"a": "b"}, "service_tier": "auto", "parallel_tool_calls": true,
    "prompt_cache_key": "k", "reasoning_effort": "low", "verbosity": "low", "safety_identifier": "s",
    "modalities": ["text"], "prediction": {"type": "content", "content": "x"}, "web_search_options": {},
    "audio": null, "stream": true, "stream_options": {"include_usage": true, "include_obfuscation": false},
    "response_format": {"type": "text"}, "tool_choice": null, "tools": null, "functions": null,
    "function_call": null, "user": "u", "n": 1, "logit_bias": {"5": 2.5, "7": -100}, "seed": null,
    "temperature": null, "top_p": null, "max_tokens": null, "max_completion_tokens": 5, "logprobs": null,
    "top_logprobs": null, "presence_penalty": null, "frequency_penalty": null, "stop": null,
    "top_k": 4, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 2, "stop_token_ids": [3, 9],
    "ignore_eos": false, "skip_special_tokens": true, "chat_template_kwargs": {"x": 1}, "cache_prompt": true,
    "add_generation_prompt": false, "frobnicate": 1})");
  const auto r = parse_request(Endpoint::Chat, chat.dump(), kModel);
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");  // developer = system
  EXPECT_EQ(r.messages[1].content, "Hi");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.sampling.top_k, 4);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.min_tokens, 2);
  EXPECT_EQ(r.stop_token_ids, (std::vector<int32_t>{3, 9}));
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{5, 2.5f}, {7, -100.0f}}));
  // Token-id sets are sets: sorted, each id once (2M repeats of one id were scanned per token).
  json sets = chat;
  sets["stop_token_ids"] = json::array();
  sets["allowed_token_ids"] = json::array();
  for (int i = 0; i < 3000; ++i) sets["stop_token_ids"].push_back(9 - i % 3), sets["allowed_token_ids"].push_back(i % 5 * 7);
  const auto rs = parse_request(Endpoint::Chat, sets.dump(), kModel);
  EXPECT_EQ(rs.stop_token_ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(rs.allowed_token_ids, (std::vector<int32_t>{0, 7, 14, 21, 28}));
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.response_format.is_null());
  EXPECT_EQ(r.tool_choice, ToolChoice::None);
  EXPECT_FALSE(r.seed_set);
  EXPECT_TRUE(r.skip_special_tokens);
  EXPECT_EQ(r.template_vars, json({{"x", 1}, {"reasoning_effort", "low"}}));  // chat_template_kwargs, reasoning_effort
  EXPECT_EQ(r.unknown_fields, (std::vector<std::string>{"frobnicate"}));
  const std::set<std::string> ignored(r.ignored_fields.begin(), r.ignored_fields.end());
  for (const char* f : {"store", "metadata", "service_tier", "prompt_cache_key",
                        "verbosity", "safety_identifier", "prediction", "web_search_options",
                        "user", "cache_prompt"})
    EXPECT_TRUE(ignored.count(f)) << f;

  const json cmpl = json::parse(R"({"model": "stories260K", "prompt": "x", "suffix": null, "echo": false,
    "best_of": 1, "user": null, "logit_bias": null, "n": null, "n_predict": 3, "repeat_penalty": 1.2,
    "stream": false, "stream_options": null, "logprobs": null})");
  const auto c = parse_request(Endpoint::Completions, cmpl.dump(), kModel);
  EXPECT_EQ(*c.max_tokens, 3);  // llama.cpp's n_predict
  EXPECT_FLOAT_EQ(c.sampling.repetition_penalty, 1.2f);
  EXPECT_TRUE(c.unknown_fields.empty());
}

TEST(ServerParse, ToolMessagesAndTools) {
  const json body = json::parse(R"({"model": "stories260K", "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]},
      {"role": "function", "name": "get_weather", "content": "rain"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "tool_choice": "none"})");
  const auto r = parse_request(Endpoint::Chat, body.dump(), kModel);
  ASSERT_EQ(r.messages.size(), 4u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(r.messages[2].content, "sunny");
  EXPECT_EQ(r.messages[3].role, "tool");  // function = tool
  EXPECT_EQ(r.messages[3].name, "get_weather");
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tool_choice, ToolChoice::None);
}

TEST(ServerParse, UnbuildableValuesAre400NamingTheParam) {
  using E = Endpoint;
  const std::string chat = R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],)";
  expect_400(E::Chat, R"({"model":"stories260K","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]})",
             "messages[0].content[0].type", "not supported");
  expect_400(E::Chat, chat + R"("audio":{"voice":"alloy","format":"mp3"}})", "audio", "not supported");
  expect_400(E::Chat, chat + R"("modalities":["text","audio"]})", "modalities", "text");
  // suffix parses (whether the model can fill in the middle is prompt_tokens()'s call); not with echo.
  EXPECT_EQ(parse_request(E::Completions, R"({"model":"stories260K","prompt":"x","suffix":"end"})", kModel).suffix, "end");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","suffix":"end","echo":true})", "suffix", "echo");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","suffix":3})", "suffix", "string");
  expect_400(E::Completions, R"({"model":"stories260K","prompt":"x","use_beam_search":true})", "use_beam_search", "not supported");
  expect_400(E::Chat, chat + R"("logit_bias":{"x":1}})", "logit_bias", "token ids");
  expect_400(E::Chat, chat + R"("logit_bias":{"512":1}})", "logit_bias", "out of range");
  expect_400(E::Chat, chat + R"("logit_bias":{"5":101}})", "logit_bias", "[-100, 100]");
  expect_400(E::Chat, chat + R"("stop_token_ids":[1,600]})", "stop_token_ids", "out of range");
  expect_400(E::Chat, chat + R"("min_tokens":9,"max_tokens":3})", "min_tokens", "must not exceed");
  expect_400(E::Chat, chat + R"("response_format":{"type":"xml"}})", "response_format.type", "json_schema");
  expect_400(E::Chat, chat + R"("tool_choice":"auto"})", "tool_choice", "requires 'tools'");
  expect_400(E::Chat, chat + R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
             "tool_choice", "not one of the functions");
  expect_400(E::Chat, chat + R"("tools":[{"type":"code_interpreter"}]})", "tools[0]", "function");
}

TEST(ServerParse, ChoicesAndEcho) {
  const json base = {{"model", "stories260K"}, {"prompt", "Once"}};
  EXPECT_EQ(parse_c(base).n, 1);
  json j = base;
  j["n"] = 3;
  EXPECT_EQ(parse_c(j).n, 3);
  j["best_of"] = 3;  // best_of = n: the same n samples
  EXPECT_EQ(parse_c(j).n, 3);
  j["n"] = kMaxChoices;
  j.erase("best_of");
  EXPECT_EQ(parse_c(j).n, kMaxChoices);
  const std::string p = R"({"model":"stories260K","prompt":"x",)";
  expect_400(Endpoint::Completions, p + R"("n":0})", "n", "must be in [1, 128]");
  expect_400(Endpoint::Completions, p + R"("n":129})", "n", "must be in [1, 128]");
  // best_of: candidates (>= n, at most kMaxChoices) ranked server-side, so never streamed.
  j = base;
  j["n"] = 2;
  j["best_of"] = 5;
  EXPECT_EQ(parse_c(j).best_of, 5);
  EXPECT_EQ(parse_c(base).best_of, 0);
  j["stream"] = true;
  j["best_of"] = 2;  // = n: nothing to rank, streams
  EXPECT_EQ(parse_c(j).best_of, 2);
  expect_400(Endpoint::Completions, p + R"("n":2,"best_of":3,"stream":true})", "best_of", "cannot be streamed");
  expect_400(Endpoint::Completions, p + R"("n":3,"best_of":2})", "best_of", "greater than or equal to 'n' (3)");
  expect_400(Endpoint::Completions, p + R"("best_of":129})", "best_of", "[1, 128]");
  expect_400(Endpoint::Completions, p + R"("best_of":0})", "best_of", "[1, 128]");
  EXPECT_EQ(parse_chat({{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}, {"n", 2}}).n, 2);

  // echo: the prompt's logprobs come with the completion's (as many alternatives), not without.
  j = base;
  j["echo"] = true;
  auto e = parse_c(j);
  EXPECT_TRUE(e.echo);
  EXPECT_EQ(e.prompt_logprobs, -1);
  j["logprobs"] = 2;
  e = parse_c(j);
  EXPECT_EQ(e.logprobs, 2);
  EXPECT_EQ(e.prompt_logprobs, 2);
  j["echo"] = false;
  EXPECT_EQ(parse_c(j).prompt_logprobs, -1);
  expect_400(Endpoint::Completions, p + R"("echo":"yes"})", "echo", "boolean");
  // max_tokens 0: only with echo (score the prompt); the engine's one token is dropped by the reply.
  j["echo"] = true;
  j["max_tokens"] = 0;
  e = parse_c(j);
  EXPECT_TRUE(e.echo_only);
  EXPECT_EQ(*e.max_tokens, 1);
  EXPECT_FALSE(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"echo", true}}).echo_only);
  expect_400(Endpoint::Completions, p + R"("max_tokens":0})", "max_tokens", "[1, 512]");
  expect_400(Endpoint::Completions, p + R"("echo":false,"max_tokens":0})", "max_tokens", "[1, 512]");
}

// Completions' prompt as an array of prompts (OpenAI's string[] and int[][]): the first is the
// request's own prompt, the others more_texts / more_tokens, each generated with the same
// parameters (http_session: one generation per prompt, prompt i's choices at i*n ..).
TEST(ServerParse, BatchedPrompts) {
  const auto texts = parse_c({{"model", "stories260K"}, {"prompt", {"Once", "upon", "a time"}}, {"n", 2}});
  EXPECT_EQ(texts.prompt_kind, PromptKind::Text);
  EXPECT_EQ(texts.prompt_text, "Once");
  EXPECT_EQ(texts.more_texts, (std::vector<std::string>{"upon", "a time"}));
  EXPECT_TRUE(texts.more_tokens.empty());
  EXPECT_EQ(texts.n, 2);
  const auto ids = parse_c({{"model", "stories260K"}, {"prompt", {{1, 2}, {3}, {4, 5, 6}}}});
  EXPECT_EQ(ids.prompt_kind, PromptKind::Tokens);
  EXPECT_EQ(ids.prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(ids.more_tokens, (std::vector<std::vector<int32_t>>{{3}, {4, 5, 6}}));
  const auto one = parse_c({{"model", "stories260K"}, {"prompt", {"Once"}}});  // one prompt: no batch
  EXPECT_EQ(one.prompt_text, "Once");
  EXPECT_TRUE(one.more_texts.empty());
  const std::string p = R"({"model":"stories260K",)";
  expect_400(Endpoint::Completions, p + R"("prompt":["a",[1]]})", "prompt", "not both");
  expect_400(Endpoint::Completions, p + R"("prompt":[[1],"a"]})", "prompt", "not both");
  EXPECT_EQ(parse_c(json::parse(p + R"("prompt":["a",""]})")).more_texts, std::vector<std::string>{""});
  expect_400(Endpoint::Completions, p + R"("prompt":[[1],[]]})", "prompt", "'prompt[1]' is empty");
  expect_400(Endpoint::Completions, p + R"("prompt":[[1],[100000]]})", "prompt", "out of range");
  // At most kMaxBatchChoices choices in all, best_of's candidates counted.
  json many = {{"model", "stories260K"}, {"prompt", json::array()}, {"n", 4}};
  for (int64_t i = 0; i < kMaxBatchChoices / 4; ++i) many["prompt"].push_back("x");
  EXPECT_EQ(parse_c(many).more_texts.size(), size_t(kMaxBatchChoices / 4 - 1));
  many["prompt"].push_back("x");
  expect_400(Endpoint::Completions, many.dump(), "prompt", "choices in one request");
  expect_400(Endpoint::Completions, p + R"("prompt":["a","b","c"],"best_of":)" + std::to_string(kMaxBatchChoices / 3 + 1) + "}",
             "prompt", "choices in one request");
}

TEST(ServerParse, VllmPromptAndStopExtensions) {
  const json base = {{"model", "stories260K"}, {"prompt", "Once"}};
  EXPECT_FALSE(parse_c(base).include_stop_str);
  EXPECT_EQ(parse_c(base).truncate_prompt_tokens, 0);
  json j = base;
  j["include_stop_str_in_output"] = true;
  j["truncate_prompt_tokens"] = 5;
  const auto r = parse_c(j);
  EXPECT_TRUE(r.include_stop_str);
  EXPECT_EQ(r.truncate_prompt_tokens, 5);
  EXPECT_TRUE(r.ignored_fields.empty());  // both do something now
  j["truncate_prompt_tokens"] = -1;  // the context's worth
  EXPECT_EQ(parse_c(j).truncate_prompt_tokens, kModel.n_ctx);
  const std::string p = R"({"model":"stories260K","prompt":"x",)";
  expect_400(Endpoint::Completions, p + R"("truncate_prompt_tokens":0})", "truncate_prompt_tokens", ">= 1");
  expect_400(Endpoint::Completions, p + R"("truncate_prompt_tokens":-2})", "truncate_prompt_tokens", "");
  expect_400(Endpoint::Completions, p + R"("include_stop_str_in_output":"yes"})", "include_stop_str_in_output", "");
  EXPECT_TRUE(parse_c(base).add_bos);
  j = base;
  j["add_special_tokens"] = false;  // completions: no BOS before the text
  EXPECT_FALSE(parse_c(j).add_bos);
  // Chat: continue_final_message continues the final assistant message (no generation prompt).
  const json msgs = {{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", "Once"}}};
  const auto c = parse_chat({{"model", "stories260K"}, {"messages", msgs}, {"continue_final_message", true}});
  EXPECT_TRUE(c.continue_final_message);
  EXPECT_FALSE(c.add_generation_prompt);
  EXPECT_TRUE(c.ignored_fields.empty());
  const std::string chat = R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],)";
  expect_400(Endpoint::Chat, chat + R"("continue_final_message":true})", "continue_final_message", "assistant");
}

TEST(ServerParse, VllmPromptLogprobsAndTokenFields) {
  const json base = {{"model", "stories260K"}, {"prompt", "Once"}};
  EXPECT_EQ(parse_c(base).report_prompt_logprobs, -1);
  EXPECT_EQ(parse_c(base).prompt_logprobs, -1);
  EXPECT_FALSE(parse_c(base).tokens_as_ids);
  EXPECT_TRUE(parse_c(base).skip_special_tokens);
  json j = base;
  j["prompt_logprobs"] = 3;
  j["return_tokens_as_token_ids"] = true;
  j["skip_special_tokens"] = false;
  auto r = parse_c(j);
  EXPECT_EQ(r.report_prompt_logprobs, 3);
  EXPECT_EQ(r.prompt_logprobs, 3);  // the engine scores the prompt
  EXPECT_TRUE(r.tokens_as_ids);
  EXPECT_FALSE(r.skip_special_tokens);
  EXPECT_TRUE(r.ignored_fields.empty());
  // With echo the engine scores the larger of the two; each is reported with its own count.
  j["echo"] = true;
  j["logprobs"] = 5;
  r = parse_c(j);
  EXPECT_EQ(r.prompt_logprobs, 5);
  EXPECT_EQ(r.report_prompt_logprobs, 3);
  j["logprobs"] = 1;
  EXPECT_EQ(parse_c(j).prompt_logprobs, 3);
  // Streamed: 0 is accepted and reports nothing (vLLM's rule), more is refused.
  j = base;
  j["stream"] = true;
  j["prompt_logprobs"] = 0;
  EXPECT_EQ(parse_c(j).report_prompt_logprobs, -1);
  EXPECT_EQ(parse_c(j).prompt_logprobs, -1);
  const json msgs = {{{"role", "user"}, {"content", "x"}}};
  EXPECT_EQ(parse_chat({{"model", "stories260K"}, {"messages", msgs}, {"prompt_logprobs", 0}}).report_prompt_logprobs, 0);
  const std::string p = R"({"model":"stories260K","prompt":"x",)";
  expect_400(Endpoint::Completions, p + R"("stream":true,"prompt_logprobs":1})", "prompt_logprobs", "stream");
  expect_400(Endpoint::Completions, p + R"("prompt_logprobs":-1})", "prompt_logprobs", "whole vocabulary");
  expect_400(Endpoint::Completions, p + R"("prompt_logprobs":21})", "prompt_logprobs", "");
  expect_400(Endpoint::Completions, p + R"("prompt_logprobs":"2"})", "prompt_logprobs", "");
  expect_400(Endpoint::Completions, p + R"("skip_special_tokens":1})", "skip_special_tokens", "");
}

TEST(ServerParse, LlamaCppSamplers) {
  const json j = {{"model", "stories260K"}, {"prompt", "Once"}, {"typical_p", 0.7}, {"repeat_last_n", -1},
                  {"mirostat", 2}, {"mirostat_tau", 4.5}, {"mirostat_eta", 0.2}, {"dynatemp_range", 0.5},
                  {"dynatemp_exponent", 2}, {"min_keep", 3}};
  const auto r = parse_c(j);
  EXPECT_FLOAT_EQ(r.sampling.typical_p, 0.7f);
  EXPECT_EQ(r.sampling.penalty_last_n, -1);
  EXPECT_EQ(r.sampling.mirostat, 2);
  EXPECT_FLOAT_EQ(r.sampling.mirostat_tau, 4.5f);
  EXPECT_FLOAT_EQ(r.sampling.mirostat_eta, 0.2f);
  EXPECT_FLOAT_EQ(r.sampling.dynatemp_range, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.dynatemp_exponent, 2.0f);
  EXPECT_EQ(r.sampling.min_keep, 3);
  EXPECT_TRUE(r.ignored_fields.empty());
  const std::string p = R"({"model":"stories260K","prompt":"x",)";
  expect_400(Endpoint::Completions, p + R"("typical_p":0})", "typical_p", "(0, 1]");
  expect_400(Endpoint::Completions, p + R"("mirostat":3})", "mirostat", "");
  expect_400(Endpoint::Completions, p + R"("mirostat_tau":-1})", "mirostat_tau", "");
  expect_400(Endpoint::Completions, p + R"("repeat_last_n":-2})", "repeat_last_n", "");
  expect_400(Endpoint::Completions, p + R"("min_keep":1.5})", "min_keep", "");
}

TEST(ServerParse, ChatTemplateVariables) {
  const json msgs = {{{"role", "user"}, {"content", "x"}}};
  const auto r = parse_chat({{"model", "stories260K"}, {"messages", msgs}, {"chat_template_kwargs", {{"enable_thinking", false}}},
                             {"documents", {{{"text", "d"}}}}});
  EXPECT_EQ(r.template_vars, json({{"enable_thinking", false}, {"documents", {{{"text", "d"}}}}}));
  EXPECT_TRUE(r.ignored_fields.empty());
  const std::string chat = R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],)";
  expect_400(Endpoint::Chat, chat + R"("chat_template_kwargs":[1]})", "chat_template_kwargs", "object");
  expect_400(Endpoint::Chat, chat + R"("chat_template_kwargs":{"messages":[]}})", "chat_template_kwargs", "messages");
  expect_400(Endpoint::Chat, chat + R"("documents":{"a":1}})", "documents", "array");
}

TEST(ServerParse, StructuredOutputBecomesAGrammar) {
  const std::string chat = R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],)";
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"}},"required":["city"]}}},{"type":"function","function":{"name":"noop"}}])";
  EXPECT_TRUE(parse_request(Endpoint::Chat, chat + tools + "}", kModel).grammar.empty());  // auto: free text
  const auto named = parse_request(Endpoint::Chat, chat + tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}}})", kModel);
  EXPECT_EQ(named.tool_choice, ToolChoice::Named);
  EXPECT_EQ(named.tool_name, "get_weather");
  EXPECT_NE(named.grammar.find("\"\\\"city\\\"\""), std::string::npos) << named.grammar;
  const auto required = parse_request(Endpoint::Chat, chat + tools + R"(,"tool_choice":"required"})", kModel);
  EXPECT_EQ(required.tool_choice, ToolChoice::Required);
  EXPECT_NE(required.grammar.find("noop"), std::string::npos);
  EXPECT_EQ(required.grammar.find("{1,1}"), std::string::npos);  // parallel calls: any number
  const auto one = parse_request(Endpoint::Chat, chat + tools + R"(,"tool_choice":"required","parallel_tool_calls":false})", kModel);
  EXPECT_NE(one.grammar.find("{0,0}"), std::string::npos) << one.grammar;  // one call: no ", call" after it
  EXPECT_EQ(parse_request(Endpoint::Chat, chat + R"("response_format":{"type":"json_object"}})", kModel).grammar,
            json_object_gbnf());
  const auto js = parse_request(Endpoint::Chat, chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"n",
      "strict":true,"schema":{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}}}})", kModel);
  EXPECT_NE(js.grammar.find("json-boolean"), std::string::npos);
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"grammar", "root ::= \"a\""}}).grammar, "root ::= \"a\"");
  EXPECT_NE(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"guided_choice", {"yes", "n\"o"}}}).grammar.find("\"n\\\"o\""),
            std::string::npos);
  EXPECT_FALSE(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"json_schema", {{"type", "integer"}}}}).grammar.empty());
  expect_400(Endpoint::Chat, chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"date"}}}})",
             "response_format.json_schema.schema", "unknown type");
  expect_400(Endpoint::Completions, R"({"model":"stories260K","prompt":"x","grammar":"root ::= a","json_schema":{}})",
             "grammar", "at most one");
  expect_400(Endpoint::Chat, chat + R"("response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object",
      "properties":{"code":{"type":"string","pattern":"(?=a)b"}}}}}})", "response_format.json_schema.schema",
             "#/properties/code: 'pattern': lookaround is not supported");
  // Completions take response_format too (vLLM does): the same grammar as chat's, never ignored.
  const std::string cmpl = R"({"model":"stories260K","prompt":"x",)";
  EXPECT_EQ(parse_request(Endpoint::Completions, cmpl + R"("response_format":{"type":"json_object"}})", kModel).grammar,
            json_object_gbnf());
  const auto cjs = parse_request(Endpoint::Completions, cmpl + R"("response_format":{"type":"json_schema","json_schema":{"name":"n",
      "schema":{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}}}})", kModel);
  EXPECT_EQ(cjs.grammar, js.grammar);
  EXPECT_TRUE(parse_request(Endpoint::Completions, cmpl + R"("response_format":{"type":"text"}})", kModel).grammar.empty());
  expect_400(Endpoint::Completions, cmpl + R"("response_format":{"type":"json_schema","json_schema":{"schema":{"$ref":"#/nope"}}}})",
             "response_format.json_schema.schema", "not supported");
  // A format and a grammar field together: which one holds is not guessed.
  for (const auto& kind : {Endpoint::Completions, Endpoint::Chat})
    expect_400(kind, (kind == Endpoint::Chat ? chat : cmpl) + R"("guided_json":{"type":"integer"},"response_format":{"type":"json_object"}})",
               "response_format", "not both");
}

// tool_choice "required" (and Anthropic's any): the calls' grammar puts "name" before "arguments"
// (a model names the function first; a wrapper schema's keys came out sorted, "arguments" first),
// each tool's arguments by its own schema ($refs its own); the call extraction reads that order.
TEST(ServerParse, RequiredCallsNameTheFunctionFirst) {
  std::vector<std::string> pieces{""};
  std::vector<bool> eog{true};
  for (int c = 1; c < 128; ++c) pieces.push_back(std::string(1, char(c))), eog.push_back(false);
  const auto vocab = std::make_shared<GrammarVocab>(pieces, eog);
  const auto matches = [&](const std::string& gbnf, const std::string& text) {
    GrammarMatcher m(Grammar::parse(gbnf), vocab);
    return m.accept_bytes(text) && m.complete();
  };
  const json body = json::parse(R"({"model": "stories260K", "messages": [{"role": "user", "content": "x"}],
    "tool_choice": "required", "tools": [
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"], "$defs": {"city": {"type": "string"}}}}},
      {"type": "function", "function": {"name": "noop"}}]})");
  const std::string g = parse_chat(body).grammar;
  EXPECT_TRUE(matches(g, R"([{"name": "get_weather", "arguments": {"city": "Paris"}}])")) << g;
  EXPECT_TRUE(matches(g, R"([{"name":"noop","arguments":{}}, {"name": "get_weather", "arguments": {"city": "x"}}])"));
  EXPECT_FALSE(matches(g, R"([{"arguments": {"city": "Paris"}, "name": "get_weather"}])")) << g;
  EXPECT_FALSE(matches(g, R"([{"name": "get_weather", "arguments": {"city": 3}}])"));
  EXPECT_FALSE(matches(g, R"([{"name": "other", "arguments": {}}])"));
  EXPECT_FALSE(matches(g, "[]"));
  json one = body;
  one["parallel_tool_calls"] = false;
  const std::string g1 = parse_chat(one).grammar;
  EXPECT_TRUE(matches(g1, R"([{"name": "noop", "arguments": {}}])"));
  EXPECT_FALSE(matches(g1, R"([{"name": "noop", "arguments": {}}, {"name": "noop", "arguments": {}}])"));
  // Anthropic's tool_choice any: the same grammar.
  const json msgs = json::parse(R"({"model": "stories260K", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}],
    "tool_choice": {"type": "any"}, "tools": [{"name": "noop", "input_schema": {"type": "object"}}]})");
  EXPECT_TRUE(matches(parse_messages_request(msgs.dump(), kModel).grammar, R"([{"name": "noop", "arguments": {"a": 1}}])"));
  // A tool's bad schema: a 400 naming the tool.
  json broken = body;
  broken["tools"][1]["function"]["parameters"] = {{"type", "date"}};
  expect_400(Endpoint::Chat, broken.dump(), "tools", "tools[1].parameters#: unknown type 'date'");
  // The extraction reads the grammar's order.
  const FoundToolCalls f = extract_tool_calls(ToolChoice::Required, "", body["tools"],
                                              R"([{"name": "get_weather", "arguments": {"city": "Paris"}}])", false);
  ASSERT_EQ(f.calls.size(), 1u);
  EXPECT_EQ(f.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(f.calls[0].arguments), json::parse(R"({"city": "Paris"})"));
}

// A schema's properties are generated in the order its text lists them (OpenAI's, llama.cpp's): the
// body is parsed with its keys sorted, so each schema is read again from its own text, wherever a
// schema enters: response_format (chat, completions, /completion), guided_json / json_schema
// (object or text), the Responses API's text.format, tools' parameters (named, required; the
// deprecated functions), the Messages API's output_format / output_config.format and tools'
// input_schema, /infill. Its $refs resolve in the same order.
TEST(ServerParse, SchemaPropertiesInTheSchemasOrder) {
  std::vector<std::string> pieces{""};
  std::vector<bool> eog{true};
  for (int c = 1; c < 128; ++c) pieces.push_back(std::string(1, char(c))), eog.push_back(false);
  const auto vocab = std::make_shared<GrammarVocab>(pieces, eog);
  const std::string schema = R"({"type": "object", "properties": {"zeta": {"$ref": "#/$defs/n"}, "alpha": {"type": "integer"},
    "mid": {"type": "integer"}}, "required": ["zeta", "alpha", "mid"], "$defs": {"n": {"type": "object",
    "properties": {"y": {"type": "integer"}, "x": {"type": "integer"}}, "required": ["y", "x"]}}})";
  const std::string ordered = R"({"zeta": {"y": 1, "x": 2}, "alpha": 3, "mid": 4})";
  // (wrap: the text around an arguments object the grammar follows, e.g. a call's)
  const auto check = [&](const ParsedRequest& r, const std::string& what, const std::string& pre = "", const std::string& post = "") {
    const auto matches = [&](const std::string& text) {
      GrammarMatcher m(Grammar::parse(r.grammar), vocab);
      return m.accept_bytes(pre + text + post) && m.complete();
    };
    EXPECT_TRUE(matches(ordered)) << what << "\n" << r.grammar;
    EXPECT_FALSE(matches(R"({"alpha": 3, "mid": 4, "zeta": {"x": 2, "y": 1}})")) << what;  // (sorted)
    EXPECT_FALSE(matches(R"({"zeta": {"x": 2, "y": 1}, "alpha": 3, "mid": 4})")) << what;
  };
  const std::string chat = R"({"model": "stories260K", "messages": [{"role": "user", "content": "x"}], )";
  const std::string cmpl = R"({"model": "stories260K", "prompt": "x", )";
  const std::string rf = R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": )" + schema + "}}}";
  check(parse_request(Endpoint::Chat, chat + rf, kModel), "chat response_format");
  check(parse_request(Endpoint::Completions, cmpl + rf, kModel), "completions response_format");
  check(parse_native_request(R"({"prompt": "x", )" + rf, kModel), "/completion response_format");
  for (const char* k : {"guided_json", "json_schema"}) {
    check(parse_request(Endpoint::Chat, chat + "\"" + k + "\": " + schema + "}", kModel), k);
    check(parse_request(Endpoint::Completions, cmpl + "\"" + k + "\": " + json(schema).dump() + "}", kModel),
          std::string(k) + " as text");
    check(parse_native_request(std::string(R"({"prompt": "x", ")") + k + "\": " + schema + "}", kModel), std::string("/completion ") + k);
  }
  check(parse_infill_request(R"({"input_prefix": "a", "json_schema": )" + schema + "}", kModel), "/infill json_schema");
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "noop"}},
    {"type": "function", "function": {"name": "f", "parameters": )" + schema + "}}]";
  check(parse_request(Endpoint::Chat, chat + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})", kModel),
        "tool_choice named");
  check(parse_request(Endpoint::Chat, chat + tools + R"(, "tool_choice": "required"})", kModel), "tool_choice required",
        R"([{"name": "f", "arguments": )", "}]");
  check(parse_request(Endpoint::Chat, chat + R"("functions": [{"name": "f", "parameters": )" + schema + R"(}], "function_call": {"name": "f"}})", kModel),
        "functions");
  // (a tool in tools, another in functions: their parameters each in their own order)
  check(parse_request(Endpoint::Chat, chat + tools + R"(, "functions": [{"name": "g", "parameters": )" + schema +
                                          R"(}], "tool_choice": {"type": "function", "function": {"name": "g"}}})", kModel),
        "functions after tools");
  const std::string resp = R"({"model": "stories260K", "input": "x", )";
  check(parse_responses_request(resp + R"("text": {"format": {"type": "json_schema", "name": "n", "schema": )" + schema + "}}}", kModel),
        "Responses text.format");
  check(parse_responses_request(resp + R"("tools": [{"type": "function", "name": "f", "parameters": )" + schema +
                                    R"(}], "tool_choice": {"type": "function", "name": "f"}})", kModel),
        "Responses tools");
  check(parse_responses_request(resp + R"("guided_json": )" + schema + "}", kModel), "Responses guided_json");
  const std::string msgs = R"({"model": "stories260K", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], )";
  check(parse_messages_request(msgs + R"("output_format": {"type": "json_schema", "schema": )" + schema + "}}", kModel),
        "Messages output_format");
  check(parse_messages_request(msgs + R"("output_config": {"effort": "low", "format": {"type": "json_schema", "schema": )" + schema + "}}}", kModel),
        "Messages output_config.format");
  check(parse_messages_request(msgs + R"("tools": [{"name": "f", "input_schema": )" + schema +
                                   R"(}], "tool_choice": {"type": "tool", "name": "f"}})", kModel),
        "Messages tools");
  check(parse_messages_request(msgs + R"("tools": [{"name": "f", "input_schema": )" + schema +
                                   R"(}], "tool_choice": {"type": "any"}})", kModel),
        "Messages tool_choice any", R"([{"name": "f", "arguments": )", "}]");
  // A null schema still stands for {} (its text is not a schema), and a repeated key is its last
  // value, as the body's parse reads it.
  EXPECT_EQ(parse_request(Endpoint::Chat, chat + R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": null}}})", kModel).grammar,
            json_schema_to_gbnf(json::object()));
  check(parse_request(Endpoint::Chat, chat + R"("guided_json": {"type": "string"}, "guided_json": )" + schema + "}", kModel), "repeated key");
}

TEST(ServerEmbeddings, ParseInputsAndOptions) {
  const ModelInfo m{"stories260K", 512, 512, {}, 64};
  auto parse = [&](const json& j) { return parse_embeddings_request(j.dump(), m); };
  ParsedRequest r = parse({{"input", "hello"}, {"model", "stories260K"}});
  EXPECT_TRUE(r.embed);
  EXPECT_EQ(r.kind, Endpoint::Embeddings);
  EXPECT_EQ(r.prompt_kind, PromptKind::Text);
  EXPECT_EQ(r.prompt_text, "hello");
  EXPECT_FALSE(r.base64);
  EXPECT_EQ(r.embd_normalize, 2);
  EXPECT_EQ(r.model, "stories260K");
  EXPECT_EQ(parse({{"input", "x"}}).model, "stories260K");  // model optional
  r = parse({{"input", {"a", "b", "c"}}, {"encoding_format", "base64"}, {"dimensions", 64}, {"user", "u"}});
  EXPECT_EQ(r.prompt_text, "a");
  EXPECT_EQ(r.more_texts, (std::vector<std::string>{"b", "c"}));
  EXPECT_TRUE(r.base64);
  r = parse({{"input", {1, 2, 3}}, {"normalize", false}, {"add_special_tokens", false}, {"truncate_prompt_tokens", 2}});
  EXPECT_EQ(r.prompt_kind, PromptKind::Tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.embd_normalize, -1);
  EXPECT_FALSE(r.add_bos);
  EXPECT_EQ(r.truncate_prompt_tokens, 2);
  r = parse({{"input", {{1, 2}, {3}}}, {"embd_normalize", 1}, {"frobnicate", 1}});
  EXPECT_EQ(r.more_tokens, (std::vector<std::vector<int32_t>>{{3}}));
  EXPECT_EQ(r.embd_normalize, 1);
  EXPECT_EQ(r.unknown_fields, (std::vector<std::string>{"frobnicate"}));
  json many = json::array();
  for (int i = 0; i < kMaxEmbeddingInputs; ++i) many.push_back("x");
  EXPECT_EQ(parse({{"input", many}}).more_texts.size(), size_t(kMaxEmbeddingInputs - 1));
  many.push_back("x");
  const std::vector<std::pair<json, std::string>> bad_ones = {
      {{{"model", "stories260K"}}, "input"},
      {{{"input", 5}}, "input"},
      {{{"input", json::array()}}, "input"},
      {{{"input", {"a", 1}}}, "input"},
      {{{"input", {1, 99999}}}, "input"},
      {{{"input", many}}, "input"},
      {{{"input", "x"}, {"encoding_format", "int8"}}, "encoding_format"},
      {{{"input", "x"}, {"dimensions", 32}}, "dimensions"},
      {{{"input", "x"}, {"embd_normalize", -2}}, "embd_normalize"},
      {{{"input", "x"}, {"truncate_prompt_tokens", 0}}, "truncate_prompt_tokens"},
  };
  for (const auto& [j, param] : bad_ones) {
    try {
      parse(j);
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << j.dump();
      EXPECT_EQ(e.param, param) << j.dump() << ": " << e.what();
    }
  }
  try {
    parse({{"input", "x"}, {"model", "other"}});
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
  }
}

// llama.cpp's format_infill, on a fake vocabulary (a byte is its own id; FIM ids from 1000).
TEST(ServerInfill, PromptAsLlamaCppFormatsIt) {
  auto encode = [](std::string_view s) { return std::vector<int32_t>(s.begin(), s.end()); };
  auto ids = [&](std::initializer_list<std::variant<int32_t, std::string>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) {
      if (std::holds_alternative<int32_t>(p)) out.push_back(std::get<int32_t>(p));
      else for (unsigned char c : std::get<std::string>(p)) out.push_back(c);
    }
    return out;
  };
  const InfillParts parts{"abc", "xyz", {{"f.py", "EX"}, {"g.py", "YZ"}}};
  const std::vector<int32_t> prompt = {7, 8};
  // Repository-level (rep and sep tokens), with BOS.
  FimIds fim{1000, 1001, 1002, 1003, 1004, 1005};
  EXPECT_EQ(infill_prompt(fim, encode, parts, prompt, 4096, 10),
            ids({1003, "myproject\n", 1004, "f.py\n", "EX", 1004, "g.py\n", "YZ", 1004, "filename\n", 1005, 1000, "abc", 7, 8,
                 1001, "xyz", 1002}));
  // Without them: the snippet separator; no BOS.
  fim = {1000, 1001, 1002, -1, -1, -1};
  EXPECT_EQ(infill_prompt(fim, encode, parts, prompt, 4096, 10),
            ids({"\n\n--- snippet ---\n\n", "EX", "\n\n--- snippet ---\n\n", "YZ", 1000, "abc", 7, 8, 1001, "xyz", 1002}));
  // Budgets (n_ctx 40: n_batch = 40 - 3 FIM tokens - 1 generated = 36): the prefix's last 27, the
  // suffix's first 9 - (2 + 2), the extra part's last 2 (what the whole leaves of the context but
  // a token); with a larger context, the extra part's last n_ctx - n_batch - 2 n_predict.
  const std::string longp(50, 'p'), longs = "0123456789abcdefghij";
  const InfillParts big{longp, longs, {{"f", "EXTRA"}}};
  const std::vector<int32_t> small = infill_prompt(fim, encode, big, prompt, 40, 0);
  EXPECT_EQ(small, ids({"RA", 1000, std::string(27, 'p'), 7, 8, 1001, "01234", 1002}));
  EXPECT_LE(small.size(), 39u);
  for (int64_t n_ctx : {8, 16, 40, 100, 2047, 2100})  // the whole fits, whatever the context
    for (int64_t n_predict : {0, 1, 5}) {
      const InfillParts huge{std::string(3000, 'p'), std::string(3000, 's'), {{"f", std::string(3000, 'e')}}};
      const std::vector<int32_t> got = infill_prompt(fim, encode, huge, prompt, n_ctx, n_predict);
      EXPECT_LE(int64_t(got.size()), std::max<int64_t>(n_ctx - 1, 2 + 3))  // (a tiny context: the prompt and FIM tokens)
          << n_ctx << " " << n_predict;
      if (n_ctx >= 40) {  // code kept, whatever n_predict
        EXPECT_GT(std::count(got.begin(), got.end(), int32_t('p')), 0) << n_ctx;
      }
    }
  for (int64_t n_predict : {int64_t(0), int64_t(4000)}) {  // n_predict does not take the code's room
    const InfillParts code{"prefix", "suffix", {}};
    EXPECT_EQ(infill_prompt(fim, encode, code, {}, 4096, n_predict), ids({1000, "prefix", 1001, "suffix", 1002})) << n_predict;
    }
  const std::vector<int32_t> wide = infill_prompt(fim, encode, big, {}, 2048 + 4 + 2 * 3, 3);
  EXPECT_EQ(std::vector<int32_t>(wide.begin(), wide.begin() + 5), ids({"XTRA", 1000}));  // the extra part's last 4
}

// Each body is a 400 from parse.
void expect_refused(ParsedRequest (*parse)(std::string_view, const ModelInfo&), const ModelInfo& m,
                    std::initializer_list<const char*> bodies) {
  for (const char* body : bodies) {
    try {
      parse(body, m);
      ADD_FAILURE() << "accepted: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
    }
  }
}

TEST(ServerNative, LogitBiasByIdAndText) {
  const ModelInfo m{"stories260K", 512, 512, {}, 64};
  using Entries = std::vector<GenerationRequest::BiasEntry>;
  ParsedRequest r = parse_native_request(R"({"prompt": "x", "logit_bias": [[5, 1.5], ["Hello", false], ["7", -2]]})", m);
  EXPECT_TRUE(r.logit_bias.empty());  // (with a text: all in order, resolved once tokenized)
  EXPECT_EQ(r.logit_bias_text, (Entries{{5, "", 1.5f}, {-1, "Hello", -100.0f}, {7, "", -2.0f}}));
  r = parse_native_request(R"({"prompt": "x", "logit_bias": {"9": 3, "world": -1}})", m);
  EXPECT_EQ(r.logit_bias_text, (Entries{{9, "", 3.0f}, {-1, "world", -1.0f}}));
  r = parse_native_request(R"({"prompt": "x", "logit_bias": [[9, 3], ["7", 1]]})", m);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, 1.0f}, {9, 3.0f}}));
  EXPECT_TRUE(r.logit_bias_text.empty());
  EXPECT_EQ(parse_native_request(R"({"prompt": "x", "n_probs": 3})", m).logprobs, 3);
  EXPECT_EQ(parse_native_request(R"({"prompt": "x"})", m).logprobs, -1);
  expect_refused(parse_native_request, m,
                 {R"({"prompt": "x", "logit_bias": [["a", "b"]]})", R"({"prompt": "x", "logit_bias": [[[1], 1]]})",
                  R"({"prompt": "x", "logit_bias": {"a": 500}})", R"({"prompt": "x", "logit_bias": [[999, 1]]})",
                  R"({"prompt": "x", "n_probs": 99})", R"({"prompt": "x", "post_sampling_probs": true})"});
}

// logit_bias keeps one value a token, the last given: "1", "01" and "001" are one token (their
// biases were kept apart and added up; 280,000 such keys were copied per choice, n 128: +657 MB,
// and added per step). On /v1/completions the last in the object's (sorted) order; on llama.cpp's
// /completion the last in the array, a text's tokens included.
TEST(ServerLogits, LogitBiasIsOneValueAToken) {
  const ModelInfo m{"stories260K", 512, 512, {}, 64};
  json j = {{"model", "stories260K"}, {"prompt", "x"}, {"logit_bias", {{"001", 5}, {"01", -3}, {"1", 2}, {"7", 1}}}};
  GenerationRequest r = parse_c(j);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{1, 2.0f}, {7, 1.0f}}));
  std::vector<float> logits(10, 0.0f);
  make_logits_processor(r, {})->apply(logits.data(), 10, 0);
  EXPECT_EQ(logits, (std::vector<float>{0, 2, 0, 0, 0, 0, 0, 1, 0, 0}));
  // As many keys as a 1 MB body holds: at most one entry per token of the vocabulary.
  for (int z = 0; z < 20; ++z)
    for (int id = 0; id < 512; ++id) j["logit_bias"][std::string(size_t(z), '0') + std::to_string(id)] = z;
  r = parse_c(j);
  ASSERT_EQ(r.logit_bias.size(), 512u);
  EXPECT_EQ(r.logit_bias[1], (std::pair<int32_t, float>{1, 0.0f}));  // ("1" sorts after "0...01")
  EXPECT_EQ(r.logit_bias[100], (std::pair<int32_t, float>{100, 0.0f}));

  r = parse_native_request(R"({"prompt": "x", "logit_bias": [[5, 1], ["05", 2], [3, 1], ["3", false]]})", m);
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, -100.0f}, {5, 2.0f}}));
}

// llama.cpp's logit_bias with texts: entries resolved in the order given, each text's tokens
// taking its bias, a later entry's bias replacing an earlier one's for a token.
TEST(ServerLogits, LogitBiasTextsResolveInOrder) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(*GGUFFile::open(path));
  const std::vector<int32_t> hello = tok.encode("Hello", false, false), there = tok.encode(" there", false, false);
  ASSERT_FALSE(hello.empty());
  ASSERT_FALSE(there.empty());
  const ModelInfo m{"stories260K", 512, 512, {}, 512};
  GenerationRequest r = parse_native_request(
      json{{"prompt", "x"}, {"logit_bias", {{"Hello there", 1}, {hello[0], 2}, {" there", -3}, {hello[0], 4}, {"Hello", 5}}}}.dump(), m);
  resolve_logit_bias(r, tok);
  EXPECT_TRUE(r.logit_bias_text.empty());
  std::map<int32_t, float> want;
  for (const int32_t t : tok.encode("Hello there", false, false)) want[t] = 1;
  for (const int32_t t : there) want[t] = -3;
  for (const int32_t t : hello) want[t] = 5;
  EXPECT_EQ(r.logit_bias, (std::vector<std::pair<int32_t, float>>(want.begin(), want.end())));
}

TEST(ServerInfill, ParsesLlamaCppsFields) {
  const ModelInfo m{"stories260K", 512, 512, {}, 64};
  ParsedRequest r = parse_infill_request(
      json({{"input_prefix", "def f():"}, {"input_suffix", "\n"}, {"input_extra", {{{"filename", "a.py"}, {"text", "x = 1"}}, {{"text", "y"}}}},
            {"n_predict", 8}}).dump(), m);
  ASSERT_TRUE(r.infill);
  EXPECT_EQ(r.kind, Endpoint::Native);
  EXPECT_EQ(r.infill->prefix, "def f():");
  EXPECT_EQ(r.infill->suffix, "\n");
  ASSERT_EQ(r.infill->extra.size(), 2u);
  EXPECT_EQ(r.infill->extra[0], (std::pair<std::string, std::string>{"a.py", "x = 1"}));
  EXPECT_EQ(r.infill->extra[1].first, "tmp");  // llama.cpp's default name
  EXPECT_EQ(r.prompt_text, "");
  EXPECT_EQ(r.max_tokens, 8);
  EXPECT_FALSE(r.echo_only);
  r = parse_infill_request(R"({"prompt": [5, 6], "n_predict": 0})", m);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(r.infill->prefix, "");
  EXPECT_TRUE(r.echo_only);  // n_predict 0: evaluated, nothing generated (one token, dropped)
  EXPECT_EQ(r.max_tokens, 1);
  expect_refused(parse_infill_request, m,
                 {R"({"input_extra": {"text": "x"}})", R"({"input_extra": [{"filename": "a"}]})",
                  R"({"input_extra": [{"text": 1}]})", R"({"input_prefix": 3})"});
}

TEST(ServerEmbeddings, LlamaCppsEmbeddingRoute) {
  const auto r = parse_native_embeddings_request(R"({"content": ["a", "b"], "embd_normalize": -1})", kModel);
  EXPECT_EQ(r.kind, Endpoint::Embeddings);
  EXPECT_TRUE(r.llama_embeddings);
  EXPECT_EQ(r.prompt_text, "a");
  EXPECT_EQ(r.more_texts, std::vector<std::string>{"b"});
  EXPECT_EQ(r.embd_normalize, -1);
  EXPECT_TRUE(r.unknown_fields.empty());
  EXPECT_EQ(parse_native_embeddings_request(R"({"input": "x"})", kModel).prompt_text, "x");
  EXPECT_FALSE(parse_embeddings_request(R"({"input": "x"})", kModel).llama_embeddings);
  try {
    parse_native_embeddings_request(R"({"content": 5})", kModel);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "content");  // named as the request named it
  }
  EXPECT_EQ(llama_embeddings_response({{0.5f, -1.0f}, {0.25f, 0.0f}}),
            json::parse(R"([{"index": 0, "embedding": [[0.5, -1.0]]}, {"index": 1, "embedding": [[0.25, 0.0]]}])"));
}

TEST(ServerEmbeddings, NormsAndEncoding) {
  std::vector<float> v = {3, -4, 0};
  normalize_embedding(v, 2);
  EXPECT_EQ(v, (std::vector<float>{0.6f, -0.8f, 0.0f}));
  v = {3, -4, 0};
  normalize_embedding(v, 1);  // taxicab
  EXPECT_FLOAT_EQ(v[0], 3.0f / 7);
  EXPECT_FLOAT_EQ(v[1], -4.0f / 7);
  v = {3, -4, 0};
  normalize_embedding(v, 0);  // the largest magnitude to 32760
  EXPECT_FLOAT_EQ(v[1], -32760.0f);
  EXPECT_FLOAT_EQ(v[0], 3.0f * 32760 / 4);
  v = {3, -4, 0};
  normalize_embedding(v, 3);
  const double p3 = std::cbrt(27.0 + 64.0);
  EXPECT_FLOAT_EQ(v[0], float(3 / p3));
  v = {3, -4, 0};
  normalize_embedding(v, -1);
  EXPECT_EQ(v, (std::vector<float>{3, -4, 0}));
  v = {0, 0};
  normalize_embedding(v, 2);  // a zero vector stays zero (no NaN)
  EXPECT_EQ(v, (std::vector<float>{0, 0}));
  // base64 of little-endian float32s, checked against the bytes decoded by hand: 1.0f = 00 00 80 3F.
  EXPECT_EQ(base64_floats({1.0f}), "AACAPw==");
  EXPECT_EQ(base64_floats({1.0f, -2.0f}), "AACAPwAAAMA=");  // -2.0f = 00 00 00 C0
  EXPECT_EQ(base64_floats({1.0f, -2.0f, 0.5f}), "AACAPwAAAMAAAAA/");  // 0.5f = 00 00 00 3F
  EXPECT_EQ(base64_floats({}), "");
  const json body = embeddings_response("m", {{1.0f, 2.0f}, {3.0f, 4.0f}}, false, 7);
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "m");
  ASSERT_EQ(body["data"].size(), 2u);
  EXPECT_EQ(body["data"][1]["object"], "embedding");
  EXPECT_EQ(body["data"][1]["index"], 1);
  EXPECT_EQ(body["data"][1]["embedding"], json({3.0, 4.0}));
  EXPECT_EQ(body["usage"], json({{"prompt_tokens", 7}, {"total_tokens", 7}}));
  EXPECT_EQ(embeddings_response("m", {{1.0f}}, true, 1)["data"][0]["embedding"], "AACAPw==");
  // Floats print in their shortest form (not the widened double's 17 digits) and read back exactly.
  const std::vector<float> odd = {0.1f, -1.0f / 3, 1e-30f, 3.4e38f};
  const json printed = json::parse(embeddings_response("m", {odd}, false, 1).dump());
  EXPECT_NE(embeddings_response("m", {odd}, false, 1).dump().find("[0.1,"), std::string::npos);
  for (size_t i = 0; i < odd.size(); ++i) EXPECT_EQ(printed["data"][0]["embedding"][i].get<float>(), odd[i]) << i;
}

TEST(ServerToolCalls, ExtractedFromTheFormatsModelsEmit) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather"}},{"type":"function","function":{"name":"f"}}])");
  const auto one = [&](ToolChoice c, const std::string& text) { return extract_tool_calls(c, "get_weather", tools, text); };
  auto r = one(ToolChoice::Named, R"( {"city": "Paris"} )");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[0].id.size(), 29u);
  EXPECT_EQ(r.calls[0].id.substr(0, 5), "call_");
  r = one(ToolChoice::Required, R"([{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "f", "arguments": {}}])");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.calls[1].name, "f");
  r = one(ToolChoice::Auto, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "Let me check.");
  r = one(ToolChoice::Auto, R"({"name": "get_weather", "parameters": {"city": "Rome"}})");  // Llama 3.x
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Rome"})");
  EXPECT_EQ(one(ToolChoice::Auto, R"(<|python_tag|>{"name": "f", "parameters": {}})").calls.size(), 1u);
  EXPECT_EQ(one(ToolChoice::Auto, R"([TOOL_CALLS][{"name": "f", "arguments": {}}])").calls.size(), 1u);
  r = one(ToolChoice::Auto, R"(<function=get_weather>{"city": "Lima"}</function>)");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Lima"})");
  // Not calls: plain text, JSON that names no tool, a broken block.
  EXPECT_TRUE(one(ToolChoice::Auto, "The weather is fine.").calls.empty());
  r = one(ToolChoice::Auto, R"({"name": "unknown", "arguments": {}})");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.content, R"({"name": "unknown", "arguments": {}})");
  EXPECT_TRUE(one(ToolChoice::Auto, "<tool_call>{not json</tool_call>").calls.empty());
  // Arguments that are no JSON object make no call (OpenAI's and Anthropic's arguments/input are
  // one): they were returned as calls ("not json", "5", and Anthropic's input {} in their place).
  for (const char* text : {R"(<tool_call>{"name": "f", "arguments": "not json"}</tool_call>)",
                           R"({"name": "f", "arguments": 5})", R"({"name": "f", "arguments": "[1, 2]"})",
                           R"(<function=f>[1, 2]</function>)", R"(<function=f>"x"</function>)"}) {
    r = one(ToolChoice::Auto, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  EXPECT_EQ(one(ToolChoice::Auto, R"({"name": "f", "arguments": "{\"a\": 1}"})").calls.size(), 1u);  // (a JSON string of an object)

  // A named choice whose "function" is not {"name": string} names the call by its top-level "name"
  // (a malformed one read through a const object was undefined behaviour).
  for (const char* choice : {R"({"type": "function", "function": {}, "name": "get_weather"})",
                             R"({"function": "x", "name": "get_weather"})", R"({"function": {"name": 5}, "name": "get_weather"})"}) {
    const auto p = parse_chat({{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "x"}}}},
                               {"tools", tools}, {"tool_choice", json::parse(choice)}});
    EXPECT_EQ(p.tool_choice, ToolChoice::Named) << choice;
    EXPECT_EQ(p.tool_name, "get_weather") << choice;
  }
  // A stream's start: held while it is or may become a call.
  const auto released = [](const std::string& start) { return ToolCallHold().push(start); };
  EXPECT_EQ(released("  "), "");
  EXPECT_EQ(released(" <tool_"), "");
  EXPECT_EQ(released("{\"na"), "");
  EXPECT_EQ(released("[TOOL"), "");
  EXPECT_EQ(released("<|python_tag|>{"), "");
  EXPECT_EQ(released("Hello"), "Hello");
  EXPECT_EQ(released(" <b>"), " <b>");

  const ResponseMeta m{Endpoint::Chat, "chatcmpl-1", 7, "stories260K"};
  const json calls = tool_calls_json({{"call_1", "f", "{}"}});
  const json body = completion_response(m, "", "tool_calls", Usage{3, 4}, nullptr, calls);
  EXPECT_EQ(body["choices"][0]["message"]["content"], nullptr);
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  const json chunk = tool_calls_chunk(m, tool_calls_json({{"call_1", "f", "{}"}}, true), true);
  EXPECT_EQ(chunk["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_TRUE(chunk.contains("usage"));
}

// Streamed text under tool_choice auto, cut into random pieces: what is released is the text before
// the first call marker (its trailing whitespace held), what is held is the rest, so that the
// released text and the calls found in the held text are what the whole text gives; a plain text
// is released whole but for its trailing whitespace and a tail that may become a marker.
// A call's arguments are the model's text as written (trimmed), not a re-dump: key order kept,
// big numbers and their spelling intact; in every JSON call format.
TEST(ServerToolCalls, ArgumentsAreTheModelsText) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f"}},
                                     {"type": "function", "function": {"name": "g"}}])");
  const std::string args = R"({"z": 1, "a": {"id": 123456789012345678901234567890, "s": "x\"}y", "f": 1.50}})";
  for (const std::string& text :
       {"<tool_call>\n{\"name\": \"f\", \"arguments\": " + args + "}\n</tool_call>",
        "{\"name\": \"f\", \"parameters\": " + args + "}",
        "[ {\"arguments\" :  " + args + "  , \"name\": \"f\"} ]",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": " + args + "}]"}) {
    const FoundToolCalls f = extract_tool_calls(ToolChoice::Auto, "", tools, text);
    ASSERT_EQ(f.calls.size(), 1u) << text;
    EXPECT_EQ(f.calls[0].arguments, args) << text;
  }
  const FoundToolCalls two = extract_tool_calls(
      ToolChoice::Required, "", tools,
      R"([{"name": "f", "arguments": {"b": [1, {"c": "]"}], "a": 2}}, {"name": "g", "arguments": "{\"q\": 1.0e5}"}])");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].arguments, R"({"b": [1, {"c": "]"}], "a": 2})");
  EXPECT_EQ(two.calls[1].arguments, R"({"q": 1.0e5})");  // (arguments as a JSON string: its content)
}

TEST(ServerToolCalls, HeldFromTheFirstMarkerInAnyPieces) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather"}}])");
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  struct Case {
    std::string text, released;
    size_t calls;
  };
  const Case cases[] = {
      {"Let me check.\n" + call, "Let me check.", 1},
      {"Hi <tool_ca there", "Hi <tool_ca there", 0},              // a marker's prefix that did not become one
      {"A [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {}}]", "A", 1},
      {"B <function=get_weather>{\"city\": \"Lima\"}</function>", "B", 1},
      {"Plain text, no call at all.  ", "Plain text, no call at all.", 0},
      {"Ends in a partial <tool_c", "Ends in a partial", 0},
      {"  " + call, "", 1},                                      // a call at the start: nothing released
      {"{\"name\": \"get_weather\", \"arguments\": {}}", "", 1},  // JSON as the whole output (Llama 3.x)
      {"x <tool_call>{broken</tool_call>", "x", 0},
      {"Hello\n\n" + call + "\n\nBye", "Hello", 1},                // text after the call
      {"A " + call + " B " + call + " C", "A", 2},
      {"Hello <function=x> is syntax. <|python_tag|>{\"name\": \"get_weather\", \"parameters\": {}}", "Hello", 1},
      // A whole output of JSON whose string holds a marker: the call, as unstreamed.
      {"{\"name\": \"get_weather\", \"arguments\": {\"city\": \"<function=x>\"}}", "", 1},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases)
    for (int round = 0; round < 50; ++round) {
      ToolCallHold hold;
      std::string released;
      for (size_t at = 0; at < c.text.size();) {
        const size_t n = std::min<size_t>(c.text.size() - at, 1 + rng() % 7);
        released += hold.push(std::string_view(c.text).substr(at, n));
        at += n;
      }
      const std::string held = hold.take();
      ASSERT_EQ(released + held, c.text);
      EXPECT_EQ(released, c.released) << c.text;
      const FoundToolCalls found = extract_tool_calls(ToolChoice::Auto, "", tools, held, hold.released());
      EXPECT_EQ(found.calls.size(), c.calls) << c.text;
      // The same calls and content as the whole text's, and no call marker ever released.
      const FoundToolCalls whole = extract_tool_calls(ToolChoice::Auto, "", tools, c.text);
      EXPECT_EQ(whole.calls.size(), c.calls) << c.text;
      EXPECT_EQ(released + found.content, whole.content) << c.text;
      EXPECT_EQ(released.find("<tool_call>"), std::string::npos);
    }
  // A long run of whitespace costs its length once (each push looks at its own bytes).
  ToolCallHold ws;
  std::string out;
  out += ws.push("Text");
  for (int i = 0; i < 200000; ++i) out += ws.push(" ");
  out += ws.push("more");
  EXPECT_EQ(out + ws.take(), "Text" + std::string(200000, ' ') + "more");
  EXPECT_EQ(out.size(), 200008u);  // (all released once text follows the run)
  ToolCallHold all(true);  // required / named: everything
  EXPECT_EQ(all.push("Plain text."), "");
  EXPECT_EQ(all.take(), "Plain text.");
}

TEST(ServerResponsesApi, MapsOntoAChatRequest) {
  const auto r = parse_responses_request(R"({"model": "stories260K", "instructions": "Be brief", "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 20, "store": false,
    "text": {"format": {"type": "text"}}, "reasoning": null, "stream": true})", kModel);
  EXPECT_EQ(r.kind, Endpoint::Responses);
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Weather?");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].tool_call_id, "call_1");
  EXPECT_TRUE(r.messages[2].reasoning.empty());
  EXPECT_EQ(*r.max_tokens, 20);
  // A reasoning item goes with the assistant turn it precedes (its reasoning_text parts, else
  // its summary); chat's reasoning_content (or "reasoning") likewise.
  const auto rr = parse_responses_request(R"({"model": "stories260K", "input": [
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
       "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
      {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "Sunny: say so."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}]})", kModel);
  ASSERT_EQ(rr.messages.size(), 4u);
  EXPECT_EQ(rr.messages[1].reasoning, "Need the tool.");
  EXPECT_EQ(rr.messages[3].reasoning, "Sunny: say so.");
  // Our own output sent back (reasoning, a preamble message, a call): one assistant turn; two
  // reasoning items before it both reach it; reasoning followed by a user turn is dropped.
  const auto own = parse_responses_request(R"({"model": "stories260K", "input": [
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "cut short"}]},
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "one"}]},
      {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "two"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]})", kModel);
  ASSERT_EQ(own.messages.size(), 3u);
  EXPECT_EQ(own.messages[1].content, "Checking.");
  ASSERT_EQ(own.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(own.messages[1].reasoning, "one\n\ntwo");
  for (const char* key : {"reasoning_content", "reasoning"}) {
    const auto c = parse_request(Endpoint::Chat, json{{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "a"}},
        {{"role", "assistant"}, {"content", "b"}, {key, "why"}}, {{"role", "user"}, {"content", "c"}}}}}.dump(), kModel);
    EXPECT_EQ(c.messages[1].reasoning, "why") << key;
  }
  EXPECT_EQ(r.tool_choice, ToolChoice::Named);
  EXPECT_FALSE(r.grammar.empty());
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(parse_responses_request(R"({"model": "stories260K", "input": "Hi"})", kModel).messages[0].content, "Hi");
  const std::string call_body = R"({"model": "stories260K", "input": "Hi", "tool_choice": "required",
      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}])";
  EXPECT_EQ(parse_responses_request(call_body + "}", kModel).grammar.find("{0,0}"), std::string::npos);  // parallel calls
  EXPECT_NE(parse_responses_request(call_body + R"(, "parallel_tool_calls": false})", kModel).grammar.find("{0,0}"),
            std::string::npos);  // one call, as on chat completions (LlamaIndex sends it)
  EXPECT_FALSE(parse_responses_request(R"({"model": "stories260K", "input": "Hi", "text": {"format": {"type": "json_schema",
      "name": "x", "schema": {"type": "object"}}}})", kModel).grammar.empty());
  const auto bad = [](const std::string& body, const std::string& param) {
    try {
      parse_responses_request(body, kModel);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, param) << e.what();
    }
  };
  bad(R"({"model": "stories260K"})", "input");
  bad(R"({"model": "stories260K", "input": "x", "previous_response_id": "resp_1"})", "previous_response_id");  // (none stored)
  bad(R"({"model": "stories260K", "input": "x", "tools": [{"type": "web_search"}]})", "tools[0]");
  bad(R"({"model": "stories260K", "input": [{"role": "robot", "content": "x"}]})", "input[0].role");
  bad(R"({"model": "stories260K", "input": "x", "max_output_tokens": 0})", "max_output_tokens");
  bad(R"({"model": "stories260K", "input": [{"type": "item_reference", "id": "fc_1"}]})", "input[0].id");
  // Wrong types are a 400 naming them (not a JSON type error, which would be a 500).
  bad(R"({"model": "stories260K", "input": "x", "tools": [{"type": 1, "name": "f"}]})", "tools[0]");
  bad(R"({"model": "stories260K", "input": "x", "tools": [{"type": "function", "name": 7}]})", "tools[0]");
  bad(R"({"model": "stories260K", "input": [{"type": "function_call", "call_id": 5, "name": "f"}]})", "input[0].tool_calls[0].id");
  bad(R"({"model": "stories260K", "input": [{"type": "function_call_output", "call_id": [], "output": "x"}]})",
      "input[0].tool_call_id");

  const ResponseMeta m{Endpoint::Responses, "resp_1", 7, "stories260K"};
  const Usage u{3, 4};
  const json obj = responses_object(m, "completed", json::array({responses_message_item("msg_1", "Hi", "completed")}), &u);
  EXPECT_EQ(obj["object"], "response");
  EXPECT_EQ(obj["tools"], json::array());  // none asked for: OpenAI's defaults
  EXPECT_EQ(obj["tool_choice"], "auto");
  EXPECT_EQ(obj["store"], false);
  EXPECT_EQ(obj["output"][0]["content"][0]["text"], "Hi");
  EXPECT_EQ(obj["usage"]["total_tokens"], 7);
  // The response object echoes the request's tools, tool_choice and settings as given (OpenAI does).
  const json obj_r = responses_object(m, "completed", json::array(), &u, "", r.responses_echo);
  EXPECT_EQ(obj_r["tools"], json::parse(R"([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])"));
  EXPECT_EQ(obj_r["tool_choice"], json::parse(R"({"type": "function", "name": "get_weather"})"));
  EXPECT_EQ(obj_r["instructions"], "Be brief");
  EXPECT_EQ(obj_r["max_output_tokens"], 20);
  EXPECT_EQ(obj_r["text"], json::parse(R"({"format": {"type": "text"}})"));
  EXPECT_EQ(obj_r["store"], false);  // what the request asked (the finished response's: whether it was stored)
  const auto tools_auto = parse_responses_request(call_body + R"(, "tool_choice": null, "temperature": 0.5,
      "metadata": {"k": "v"}, "parallel_tool_calls": false})", kModel);
  const json obj_a = responses_object(m, "completed", json::array(), &u, "", tools_auto.responses_echo);
  EXPECT_EQ(obj_a["tool_choice"], "auto");  // tools without a choice: auto
  EXPECT_EQ(obj_a["tools"][0]["name"], "f");
  EXPECT_EQ(obj_a["parallel_tool_calls"], false);
  EXPECT_EQ(obj_a["temperature"], 0.5);
  EXPECT_EQ(obj_a["metadata"], json::parse(R"({"k": "v"})"));
  // A call comes back as a function_call item naming its call_id (what function_call_output answers).
  const json call = responses_call_item({"call_abc", "get_weather", R"({"city":"Paris"})"}, "completed");
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["call_id"], "call_abc");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["arguments"], R"({"city":"Paris"})");
  const std::string e = responses_event("response.output_text.delta", {{"delta", "x"}}, 3);
  EXPECT_EQ(e.substr(0, 34), "event: response.output_text.delta\n");
  EXPECT_NE(e.find("\"sequence_number\":3"), std::string::npos);
}

// --- the Responses API's store ------------------------------------------------------------------

// A stored response of id whose input and output are messages of these texts (ids "<id>_in<i>",
// "<id>_out<i>"), continuing `previous`; padded with pad bytes of response text.
ResponseStore::Entry stored_entry(const std::string& id, const std::vector<std::string>& in,
                                  const std::vector<std::string>& out, const std::string& previous = "", size_t pad = 0) {
  ResponseStore::Entry e;
  e.id = id;
  e.previous_id = previous;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string item_id = cat(id, "_in", i);
    e.input.push_back({item_id, ResponseStore::text({{"type", "message"}, {"id", item_id}, {"role", "user"},
                                                     {"content", {{{"type", "input_text"}, {"text", in[i]}}}}})});
  }
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string item_id = cat(id, "_out", i);
    e.output.push_back({item_id, ResponseStore::text(responses_message_item(item_id, out[i], "completed"))});
  }
  e.response = ResponseStore::text({{"id", id}, {"object", "response"}, {"pad", std::string(pad, 'x')}});
  return e;
}

TEST(ResponseStore, EvictsTheOldestByCount) {
  ResponseStore store(3, 1 << 20);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store.put(stored_entry(cat("r", i), {"q"}, {"a"})));
  EXPECT_EQ(store.size(), 3);
  EXPECT_EQ(store.get("r0"), nullptr);
  EXPECT_EQ(store.get("r1"), nullptr);
  for (const char* id : {"r2", "r3", "r4"}) EXPECT_NE(store.get(id), nullptr) << id;
  EXPECT_FALSE(store.item("r1_out0"));  // an evicted response's items go with it
  EXPECT_TRUE(store.item("r2_out0"));
  uint64_t sum = 0;
  for (const char* id : {"r2", "r3", "r4"}) sum += store.get(id)->bytes();
  EXPECT_EQ(store.bytes(), sum);
  EXPECT_FALSE(ResponseStore(0, 1 << 20).put(stored_entry("r", {"q"}, {"a"})));  // 0: none stored
}

TEST(ResponseStore, EvictsTheOldestByBytes) {
  const uint64_t one = stored_entry("r0", {"q"}, {"a"}, "", 1000).bytes();
  ResponseStore store(100, 2 * one + one / 2);  // room for two
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.put(stored_entry(cat("r", i), {"q"}, {"a"}, "", 1000)));
  EXPECT_EQ(store.size(), 2);
  EXPECT_LE(store.bytes(), store.max_bytes());
  EXPECT_EQ(store.get("r1"), nullptr);
  EXPECT_NE(store.get("r2"), nullptr);
  EXPECT_NE(store.get("r3"), nullptr);
  // One alone over the cap is not stored, and evicts nothing.
  EXPECT_FALSE(store.put(stored_entry("big", {"q"}, {"a"}, "", 3 * one)));
  EXPECT_EQ(store.size(), 2);
  // A large one evicts as many of the oldest as it needs.
  EXPECT_TRUE(store.put(stored_entry("r4", {"q"}, {"a"}, "", 1000 + one)));
  EXPECT_EQ(store.size(), 1);
  EXPECT_NE(store.get("r4"), nullptr);
  EXPECT_FALSE(store.put(stored_entry("r4", {"q"}, {"a"})));  // an id once
}

// replace(): a background response's finished self in its pending one's place (its items indexed
// anew, its bytes counted anew, stored as the latest); an id no longer stored stays so.
TEST(ResponseStore, ReplaceTakesThePlaceOfAStoredOneOnly) {
  ResponseStore store(2, 1 << 20);
  ResponseStore::Entry pending = stored_entry("bg", {"q"}, {});
  pending.pending = true;
  ASSERT_TRUE(store.put(pending));
  ASSERT_TRUE(store.put(stored_entry("r1", {"q"}, {"a"})));
  EXPECT_TRUE(store.get("bg")->pending);
  ResponseStore::Entry status = pending;  // (a new status of a pending one: only while it is pending)
  status.response = "in_progress";
  ASSERT_TRUE(store.replace(status, /*only_pending=*/true));
  EXPECT_EQ(store.get("bg")->response, "in_progress");
  ASSERT_TRUE(store.replace(stored_entry("bg", {"q"}, {"a", "b"})));
  EXPECT_FALSE(store.replace(status, /*only_pending=*/true));  // (its end stays)
  EXPECT_EQ(store.size(), 2);
  EXPECT_FALSE(store.get("bg")->pending);
  EXPECT_TRUE(store.item("bg_out1"));
  EXPECT_TRUE(store.item("bg_in0"));
  EXPECT_EQ(store.bytes(), store.get("bg")->bytes() + store.get("r1")->bytes());
  ASSERT_TRUE(store.put(stored_entry("r2", {"q"}, {"a"})));  // (bg is now the later stored: r1 goes)
  EXPECT_EQ(store.get("r1"), nullptr);
  EXPECT_NE(store.get("bg"), nullptr);
  EXPECT_FALSE(store.replace(stored_entry("r1", {"q"}, {"a"})));  // evicted: stays so
  EXPECT_EQ(store.get("r1"), nullptr);
  ASSERT_TRUE(store.erase("bg"));
  EXPECT_FALSE(store.replace(stored_entry("bg", {"q"}, {"a"})));  // deleted: stays so
  EXPECT_EQ(store.size(), 1);
  EXPECT_FALSE(store.item("bg_in0"));
}

// EventLog: a follower gets the published events after its starting point, each once and in
// order, from the publish after it joined, to the end; a starting point past what was published
// is honoured by later publishes; one whose owner is gone is let go; a store's entry counts the
// log's bytes again on recount().
TEST(ResponseStore, EventLogFollowersGetEachEventOnceToTheEnd) {
  EventLog log;
  const auto event = [](int i) { return cat("e", i, ";"); };
  for (int i = 0; i < 3; ++i) log.append(event(i));
  log.publish(false);
  log.append(event(3));  // (appended, not published: a follower does not see it yet)
  std::string a, b, c;
  bool a_done = false;
  auto owner = std::make_shared<int>(0), gone = std::make_shared<int>(0);
  auto [past_a, done_a] = log.follow(0, owner, [&](const std::string& t, bool d) { a += t; a_done = d; });
  EXPECT_EQ(past_a, "e1;e2;");
  EXPECT_FALSE(done_a);
  auto [past_b, done_b] = log.follow(4, owner, [&](const std::string& t, bool) { b += t; });  // (past the end)
  EXPECT_EQ(past_b, "");
  log.follow(-1, gone, [&](const std::string& t, bool) { c += t; });
  EXPECT_EQ(log.followers(), 3u);
  gone.reset();
  log.append(event(4));
  log.append(event(5));
  log.publish(false);
  EXPECT_EQ(log.followers(), 2u);  // (its owner gone: let go)
  EXPECT_EQ(a, "e3;e4;e5;");
  EXPECT_EQ(b, "e5;");
  EXPECT_EQ(c, "");
  log.append(event(6));
  log.publish(true);
  EXPECT_EQ(a, "e3;e4;e5;e6;");
  EXPECT_TRUE(a_done);
  EXPECT_EQ(log.followers(), 0u);
  auto [all, done] = log.follow(-1, owner, [](const std::string&, bool) { ADD_FAILURE() << "followed an ended log"; });
  EXPECT_EQ(all, "e0;e1;e2;e3;e4;e5;e6;");
  EXPECT_TRUE(done);
  // recount(): the log's growth counted, the oldest others evicted to fit.
  ResponseStore::Entry e = stored_entry("s", {"q"}, {});
  e.events = std::make_shared<EventLog>();
  const ResponseStore::Entry old = stored_entry("old", {"q"}, {"a"});
  ResponseStore store(10, old.bytes() + e.bytes() + 100);  // (room for both, and 100 bytes)
  ASSERT_TRUE(store.put(old));
  ASSERT_TRUE(store.put(e));
  ASSERT_NE(store.get("old"), nullptr);
  e.events->append(std::string(200, 'x'));
  store.recount("s");
  EXPECT_EQ(store.get("old"), nullptr);
  EXPECT_EQ(store.bytes(), store.get("s")->bytes());
}

TEST(ResponseStore, ChainsResolveOldestFirstAndStopAtAMissingLink) {
  ResponseStore store(10, 1 << 20);
  store.put(stored_entry("a", {"q1"}, {"a1"}));
  store.put(stored_entry("b", {"q2"}, {"a2"}, "a"));
  store.put(stored_entry("c", {"q3"}, {"a3", "a3b"}, "b"));
  const ResponseStore::Chain chain = store.chain("c");
  EXPECT_TRUE(chain.missing.empty());
  ASSERT_EQ(chain.links.size(), 3u);
  std::vector<std::string> ids;
  for (const json& it : ResponseStore::conversation(chain, true)) ids.push_back(it["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"a_in0", "a_out0", "b_in0", "b_out0", "c_in0", "c_out0", "c_out1"}));
  EXPECT_EQ(ResponseStore::conversation(chain, false).size(), 5u);  // (without c's own output)
  EXPECT_EQ(ResponseStore::object(*chain.links.back())["output"][1]["content"][0]["text"], "a3b");
  EXPECT_EQ(store.chain("x").missing, "x");
  EXPECT_TRUE(store.chain("x").links.empty());
  // A deleted link: the chain reaches back to it and names it.
  EXPECT_TRUE(store.erase("b"));
  EXPECT_FALSE(store.erase("b"));
  const ResponseStore::Chain cut = store.chain("c");
  EXPECT_EQ(cut.missing, "b");
  ASSERT_EQ(cut.links.size(), 1u);
  EXPECT_EQ(cut.links[0]->id, "c");
}

TEST(ResponseStore, AnItemHeldTwiceIsFoundWhileEitherHolderIsStored) {
  ResponseStore store(10, 1 << 20);
  store.put(stored_entry("a", {"q"}, {"shared"}));
  ResponseStore::Entry b = stored_entry("b", {}, {"x"});
  b.input.push_back(store.get("a")->output[0]);  // a's output sent back as b's input
  store.put(std::move(b));
  EXPECT_TRUE(store.erase("a"));
  ASSERT_TRUE(store.item("a_out0"));
  EXPECT_EQ(json::parse(*store.item("a_out0"))["content"][0]["text"], "shared");
  EXPECT_TRUE(store.erase("b"));
  EXPECT_FALSE(store.item("a_out0"));
  EXPECT_EQ(store.bytes(), 0u);
}

// An item sent back whole under its id but edited (a client that resends its history): a reference
// to that id reads the latest stored, whichever the index happens to find first.
TEST(ResponseStore, AnIdHeldTwiceReadsTheLatestStored) {
  for (const bool edited_first : {false, true}) {
    ResponseStore store(10, 1 << 20);
    const auto put = [&](const std::string& id, const std::string& text) {
      ResponseStore::Entry e = stored_entry(id, {}, {});
      e.input.push_back({"msg_x", ResponseStore::text({{"type", "message"}, {"id", "msg_x"}, {"role", "user"},
                                                       {"content", text}})});
      store.put(std::move(e));
    };
    put("a", edited_first ? "edited" : "first");
    put("b", edited_first ? "first" : "edited");
    EXPECT_EQ(json::parse(*store.item("msg_x"))["content"], edited_first ? "first" : "edited");
    EXPECT_TRUE(store.erase("b"));
    EXPECT_EQ(json::parse(*store.item("msg_x"))["content"], edited_first ? "edited" : "first");
  }
}

// Writers, readers and deleters at once: within the caps throughout, every entry read whole.
TEST(ResponseStore, ConcurrentAccessStaysWithinTheCaps) {
  const uint64_t one = stored_entry("r_0_0", {"q"}, {"a"}, "r_0_0", 100).bytes();
  ResponseStore store(50, 40 * one);
  std::atomic<bool> broken{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::string prev;
      for (int i = 0; i < (test::kSanitized ? 500 : 2000); ++i) {  // (the sanitizers: 10 s for 2,000)
        const std::string id = cat("r_", t, "_", i);
        store.put(stored_entry(id, {"q"}, {"a"}, prev, 100));
        prev = id;
        if (i % 7 == 0) store.erase(cat("r_", (t + 1) % 4, "_", i - 3));
        const ResponseStore::Chain c = store.chain(id);
        for (const json& it : ResponseStore::conversation(c, true))
          if (!it.contains("id")) broken = true;
        if (const auto e = store.get(cat("r_", (t + 2) % 4, "_", i - 1)); e && ResponseStore::object(*e)["id"] != e->id) broken = true;
        if (const auto item = store.item(cat("r_", (t + 3) % 4, "_", i - 1, "_out0")); item && json::parse(*item)["type"] != "message")
          broken = true;
        if (store.size() > 50 || store.bytes() > store.max_bytes()) broken = true;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_FALSE(broken);
  EXPECT_LE(store.size(), 50);
  EXPECT_LE(store.bytes(), store.max_bytes());
}

// previous_response_id and item references resolve from the store: the chain's items, then the
// input's; instructions are the request's own; what is kept is the request's own items with ids.
TEST(ServerResponsesApi, PreviousResponseAndReferencesResolveFromTheStore) {
  ResponseStore store(10, 1 << 20);
  store.put(stored_entry("resp_a", {"First question"}, {"First answer"}));
  store.put(stored_entry("resp_b", {"Second question"}, {"Second answer"}, "resp_a"));
  const auto r = parse_responses_request(R"({"model": "stories260K", "previous_response_id": "resp_b",
      "instructions": "Be brief", "input": "Third question"})", kModel, &store);
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief");
  EXPECT_EQ(r.messages[1].content, "First question");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "First answer");
  EXPECT_EQ(r.messages[4].content, "Second answer");
  EXPECT_EQ(r.messages[5].content, "Third question");
  EXPECT_TRUE(r.store_response);
  EXPECT_EQ(r.responses_echo["previous_response_id"], "resp_b");
  ASSERT_EQ(r.responses_input.size(), 1u);  // its own item only: the chain is a link
  EXPECT_EQ(r.responses_input[0]["content"], json::parse(R"([{"type": "input_text", "text": "Third question"}])"));
  EXPECT_EQ(r.responses_input[0]["id"].get<std::string>().substr(0, 4), "msg_");
  // References: item_reference, and an item with only its id; kept as the items they name.
  const auto refs = parse_responses_request(R"({"model": "stories260K", "input": [
      {"type": "item_reference", "id": "resp_a_in0"}, {"type": "message", "id": "resp_a_out0"},
      {"role": "user", "content": "Next"}]})", kModel, &store);
  ASSERT_EQ(refs.messages.size(), 3u);
  EXPECT_EQ(refs.messages[0].content, "First question");
  EXPECT_EQ(refs.messages[1].content, "First answer");
  EXPECT_EQ(refs.messages[1].role, "assistant");
  ASSERT_EQ(refs.responses_input.size(), 3u);
  EXPECT_EQ(refs.responses_input[1]["id"], "resp_a_out0");
  // store: false keeps nothing; a reference still resolves.
  const auto unkept = parse_responses_request(R"({"model": "stories260K", "store": false, "input": [
      {"type": "item_reference", "id": "resp_a_out0"}, {"role": "user", "content": "Next"}]})", kModel, &store);
  EXPECT_FALSE(unkept.store_response);
  EXPECT_TRUE(unkept.responses_input.empty());
  EXPECT_EQ(unkept.responses_echo["store"], false);
  const auto fails = [&](const std::string& body, const std::string& param, const std::string& needle,
                         const std::string& code = "") {
    try {
      parse_responses_request(body, kModel, &store);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << body;
      EXPECT_EQ(e.param, param) << e.what();
      EXPECT_EQ(e.code, code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails(R"({"model": "stories260K", "previous_response_id": "resp_x", "input": "x"})", "previous_response_id",
        "Previous response with id 'resp_x' not found.", "previous_response_not_found");
  fails(R"({"model": "stories260K", "input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "nope"}]})",
        "input[1].id", "Item with id 'nope' not found (input[1])");
  fails(R"({"model": "stories260K", "input": [{"type": "item_reference"}]})", "input[0].id", "is required");
  fails(R"({"model": "stories260K", "input": [{"type": "reasoning", "id": "resp_a_out0"}]})", "input[0].type", "not \"reasoning\"");
  fails(R"({"model": "stories260K", "previous_response_id": "resp_b", "input": [{"type": "item_reference", "id": "resp_a_out0"}]})",
        "input[0]", "Duplicate item found with id 'resp_a_out0'");
  fails(R"({"model": "stories260K", "previous_response_id": 7, "input": "x"})", "previous_response_id", "must be a string");
  fails(R"({"model": "stories260K", "store": "yes", "input": "x"})", "store", "must be a boolean");
  // A chain whose older link is gone: the missing link is named.
  store.erase("resp_a");
  fails(R"({"model": "stories260K", "previous_response_id": "resp_b", "input": "x"})", "previous_response_id",
        "Previous response with id 'resp_a' not found.", "previous_response_not_found");
  // An item once in a conversation (so references resolve to at most what the store holds).
  fails(R"({"model": "stories260K", "input": [{"type": "item_reference", "id": "resp_b_out0"},
      {"type": "item_reference", "id": "resp_b_out0"}]})", "input[1]", "Duplicate item found with id 'resp_b_out0'");
}

// ConversationStore: bounded by count and bytes as the response store, the longest unwritten
// evicted first (adding items renews one, reading does not); items added with ids new to it, a
// change that would take one alone over the byte cap refused with nothing changed; its bytes
// counted as they change.
TEST(ResponseStore, ConversationsEvictTheLongestUnwritten) {
  using Change = ConversationStore::Change;
  const auto item = [](const std::string& id, size_t pad = 0) {
    return ResponseStore::Item{id, ResponseStore::text({{"type", "message"}, {"id", id}, {"role", "user"},
                                                        {"content", std::string(pad + 1, 'x')}})};
  };
  const auto conversation = [&](const std::string& id, size_t pad = 0) {
    ConversationStore::Conversation c;
    c.id = id;
    c.metadata = "{}";
    c.items.push_back(std::make_shared<const ResponseStore::Item>(item(id + "_0", pad)));
    return c;
  };
  const auto sum = [](const ConversationStore& store, std::initializer_list<const char*> ids) {
    uint64_t n = 0;
    for (const char* id : ids) n += store.get(id)->bytes();
    return n;
  };
  ConversationStore by_count(2, 1 << 20);
  ASSERT_TRUE(by_count.put(conversation("a")));
  ASSERT_TRUE(by_count.put(conversation("b")));
  ASSERT_TRUE(by_count.get("a"));  // (read: not renewed)
  EXPECT_EQ(by_count.add("a", {item("a_1")}), Change::kDone);  // (written: renewed)
  ASSERT_TRUE(by_count.put(conversation("c")));
  EXPECT_FALSE(by_count.get("b"));
  ASSERT_TRUE(by_count.get("a"));
  EXPECT_EQ(by_count.get("a")->items.size(), 2u);
  EXPECT_EQ(by_count.bytes(), sum(by_count, {"a", "c"}));
  EXPECT_FALSE(by_count.put(conversation("c")));  // an id once
  EXPECT_FALSE(ConversationStore(0, 1 << 20).put(conversation("a")));  // 0: none stored
  // Items: ids new to it; one erased; an unknown one or conversation named.
  std::string duplicate;
  EXPECT_EQ(by_count.add("a", {item("a_2"), item("a_1")}, &duplicate), Change::kDuplicate);
  EXPECT_EQ(duplicate, "a_1");
  EXPECT_EQ(by_count.add("a", {item("a_2"), item("a_2")}), Change::kDuplicate);
  EXPECT_EQ(by_count.get("a")->items.size(), 2u);
  EXPECT_EQ(by_count.erase_item("a", "a_0"), Change::kDone);
  EXPECT_EQ(by_count.erase_item("a", "a_0"), Change::kNoItem);
  EXPECT_EQ(by_count.get("a")->items.front()->id, "a_1");
  EXPECT_EQ(by_count.add("x", {item("x_0")}), Change::kNoConversation);
  EXPECT_EQ(by_count.set_metadata("a", R"({"k":"v"})"), Change::kDone);
  EXPECT_EQ(ConversationStore::object(*by_count.get("a"))["metadata"], json({{"k", "v"}}));
  EXPECT_EQ(by_count.bytes(), sum(by_count, {"a", "c"}));
  EXPECT_TRUE(by_count.erase("a"));
  EXPECT_FALSE(by_count.erase("a"));
  EXPECT_EQ(by_count.bytes(), sum(by_count, {"c"}));
  // Bytes: one growing evicts the longest unwritten others; alone over the cap, it is refused.
  const uint64_t one = conversation("p", 1000).bytes();
  ConversationStore by_bytes(100, 3 * one);
  for (const char* id : {"p", "q", "r"}) ASSERT_TRUE(by_bytes.put(conversation(id, 1000)));
  EXPECT_EQ(by_bytes.add("q", {item("q_1", 500)}), Change::kDone);  // (q the latest: p goes)
  EXPECT_FALSE(by_bytes.get("p"));
  EXPECT_TRUE(by_bytes.get("r"));
  EXPECT_EQ(by_bytes.add("q", {item("q_2", 3 * one)}), Change::kOverTheCap);
  EXPECT_EQ(by_bytes.get("q")->items.size(), 2u);
  EXPECT_TRUE(by_bytes.get("r"));
  EXPECT_EQ(by_bytes.bytes(), sum(by_bytes, {"q", "r"}));
  EXPECT_EQ(by_bytes.add("r", {item("r_1", one)}), Change::kDone);  // (r the oldest, growing: q goes)
  EXPECT_FALSE(by_bytes.get("q"));
  EXPECT_EQ(by_bytes.bytes(), sum(by_bytes, {"r"}));
  EXPECT_LE(by_bytes.bytes(), by_bytes.max_bytes());
  EXPECT_FALSE(by_bytes.put(conversation("big", 3 * one)));
  EXPECT_EQ(by_bytes.size(), 1);
}

// One response at a time on a conversation (claim: OpenAI's lock), let go with its last copy; one
// conversation at most max_conversation_bytes; its item ids kept from put on; a change answers the
// conversation as it left it.
TEST(ResponseStore, AConversationClaimedCappedAndAnsweredFromItsLock) {
  using Change = ConversationStore::Change;
  const auto item = [](const std::string& id, size_t pad = 0) {
    return ResponseStore::Item{id, ResponseStore::text({{"type", "message"}, {"id", id}, {"role", "user"},
                                                        {"content", std::string(pad + 1, 'x')}})};
  };
  ConversationStore::Conversation c;
  c.id = "a";
  c.metadata = "{}";
  c.items.push_back(std::make_shared<const ResponseStore::Item>(item("a_0")));
  const uint64_t cap = c.bytes() + ResponseStore::item_bytes(item("a_1", 100));
  ConversationStore store(10, 1 << 20, cap);
  EXPECT_EQ(store.max_conversation_bytes(), cap);
  EXPECT_EQ(ConversationStore(10, 1000, cap).max_conversation_bytes(), std::min<uint64_t>(1000, cap));
  ASSERT_TRUE(store.put(c));
  ConversationStore::Conversation got;
  std::shared_ptr<void> claim, second;
  EXPECT_EQ(store.claim("none", got, claim), Change::kNoConversation);
  EXPECT_FALSE(claim);
  ASSERT_EQ(store.claim("a", got, claim), Change::kDone);
  ASSERT_TRUE(claim);
  EXPECT_EQ(got.items.size(), 1u);
  EXPECT_EQ(store.claim("a", got, second), Change::kBusy);
  EXPECT_FALSE(second);
  std::shared_ptr<void> copy = claim;
  claim.reset();
  EXPECT_EQ(store.claim("a", got, second), Change::kBusy);  // (a copy holds it still)
  copy.reset();
  ASSERT_EQ(store.claim("a", got, second), Change::kDone);
  EXPECT_EQ(store.add("a", {item("a_1")}), Change::kDone);  // (a claim does not stop changes)
  EXPECT_TRUE(store.erase("a"));
  second.reset();  // (let go after its conversation went: nothing to free)
  // The cap: put and add refused past it, nothing changed.
  ASSERT_TRUE(store.put(c));
  EXPECT_EQ(store.add("a", {item("a_1", 101)}), Change::kOverTheCap);
  EXPECT_EQ(store.get("a")->items.size(), 1u);
  EXPECT_EQ(store.add("a", {item("a_1", 100)}), Change::kDone);
  EXPECT_EQ(store.get("a")->bytes(), cap);
  ConversationStore::Conversation big = c;
  big.id = "big";
  big.items.push_back(std::make_shared<const ResponseStore::Item>(item("big_1", 101)));
  EXPECT_FALSE(store.put(big));
  // Ids: put's count (a_0 was put, never added); one erased may come again.
  std::string duplicate;
  EXPECT_EQ(store.add("a", {item("a_0")}, &duplicate), Change::kDuplicate);
  EXPECT_EQ(duplicate, "a_0");
  json object;
  EXPECT_EQ(store.erase_item("a", "a_0", &object), Change::kDone);
  EXPECT_EQ(object, json({{"id", "a"}, {"object", "conversation"}, {"created_at", 0}, {"metadata", json::object()}}));
  EXPECT_EQ(store.erase_item("a", "a_0"), Change::kNoItem);
  EXPECT_EQ(store.set_metadata("a", R"({"k":"v"})", &object), Change::kDone);
  EXPECT_EQ(object["metadata"], json({{"k", "v"}}));
  EXPECT_EQ(store.add("a", {item("a_0")}), Change::kOverTheCap);  // (the metadata took its room)
  EXPECT_EQ(store.set_metadata("a", "{}"), Change::kDone);
  EXPECT_EQ(store.add("a", {item("a_0")}), Change::kDone);
  EXPECT_EQ(store.get("a")->bytes(), store.bytes());
}

// The Conversations API's items are a Responses request's input items (checked, each given an id,
// a string content as parts); metadata is OpenAI's; a response's conversation comes first in its
// prompt, counts in what it resolves from the stores, and is not previous_response_id's too.
TEST(ServerResponsesApi, ConversationItemsAndMetadataAsTheResponsesAPIs) {
  ResponseStore store(10, 1 << 20);
  store.put(stored_entry("resp_a", {"First question"}, {"First answer"}));
  const json items = conversation_items(json::parse(R"([{"role": "user", "content": "Hi"},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "42"}, {"type": "item_reference", "id": "resp_a_out0"},
      {"type": "message", "id": "msg_mine", "role": "assistant", "content": "Hello"}])"), &store);
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(items[0]["content"], json::parse(R"([{"type": "input_text", "text": "Hi"}])"));
  EXPECT_EQ(items[0]["type"], "message");
  EXPECT_EQ(items[0]["id"].get<std::string>().substr(0, 4), "msg_");
  EXPECT_EQ(items[1]["id"].get<std::string>().substr(0, 3), "fc_");
  EXPECT_EQ(items[2]["id"].get<std::string>().substr(0, 4), "fco_");
  EXPECT_EQ(items[3]["id"], "resp_a_out0");
  EXPECT_EQ(items[3]["content"][0]["text"], "First answer");
  EXPECT_EQ(items[4]["id"], "msg_mine");
  EXPECT_EQ(items[4]["content"][0]["type"], "output_text");
  EXPECT_EQ(conversation_items(json::array(), &store), json::array());
  const auto fails = [&](const std::function<void()>& f, const std::string& param, const std::string& needle, int status = 400) {
    try {
      f();
      ADD_FAILURE() << "accepted; wanted " << param;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, status) << e.what();
      EXPECT_EQ(e.param, param) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const auto bad_items = [&](const std::string& text, const std::string& param, const std::string& needle) {
    fails([&] { conversation_items(json::parse(text), &store); }, param, needle);
  };
  bad_items(json(std::vector<json>(21, {{"role", "user"}, {"content", "x"}})).dump(), "items", "at most 20");
  bad_items(R"({"role": "user"})", "items", "must be an array");
  bad_items(R"([{"type": "web_search_call", "id": "ws_1"}, {"role": "user", "content": "x"}])", "items[0].id", "not found");
  bad_items(R"([{"type": "image_generation_call", "result": "x"}])", "items[0].type", "not supported");
  bad_items(R"([{"type": "message", "content": "x"}])", "items[0].role", "is required");
  bad_items(R"([{"role": "robot", "content": "x"}])", "items[0].role", "not supported");
  bad_items(R"([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])", "items[0].content[0].type", "");
  // (named by its item, though a reasoning item makes no message, and calls join the turn before)
  bad_items(R"([{"type": "reasoning", "summary": []}, {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])",
            "items[1].content[0].type", "not supported");
  bad_items(R"([{"role": "assistant", "content": "a"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
      {"type": "reasoning", "summary": []}, {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])",
            "items[3].content[0].type", "not supported");
  bad_items(R"([{"id": "m1", "role": "user", "content": "x"}, {"id": "m1", "role": "user", "content": "y"}])", "items[1]",
            "Duplicate item found with id 'm1'");
  // Metadata: at most 16 pairs, keys of 64 characters, values strings of 512 (characters, not bytes).
  json m = json::object();
  for (int i = 0; i < 16; ++i) m[cat("k", i)] = std::string(512, 'v');
  m["k0"] = "";
  for (int i = 0; i < 256; ++i) m["k0"] = m["k0"].get<std::string>() + "\xc3\xa9";  // (256 two-byte characters)
  check_metadata(m, "metadata");
  check_metadata({{std::string(64, 'k'), "v"}}, "metadata");
  json seventeen = m;
  seventeen["k16"] = "v";
  fails([&] { check_metadata(seventeen, "metadata"); }, "metadata", "at most 16");
  fails([&] { check_metadata({{std::string(65, 'k'), "v"}}, "metadata"); }, "metadata", "at most 64 characters");
  fails([&] { check_metadata({{"k", std::string(513, 'v')}}, "metadata"); }, "metadata", "at most 512");
  fails([&] { check_metadata({{"k", 1}}, "metadata"); }, "metadata", "'metadata.k' must be a string");
  fails([&] { check_metadata(json::array(), "metadata"); }, "metadata", "must be an object");
  fails([&] { parse_responses_request(R"({"model": "stories260K", "input": "x", "metadata": {"k": 1}})", kModel, &store); }, "metadata", "string");
  // A response's conversation: its items first (after the instructions), then the input; the
  // request keeps its own items; the response echoes {"id"}.
  ConversationStore conversations(10, 1 << 20);
  ConversationStore::Conversation c;
  c.id = "conv_1";
  c.metadata = "{}";
  for (const ResponseStore::Item& it : ResponseStore::to_items(conversation_items(json::parse(R"([
      {"role": "user", "content": "Earlier question"}, {"role": "assistant", "content": "Earlier answer"}])"), &store)))
    c.items.push_back(std::make_shared<const ResponseStore::Item>(it));
  ASSERT_TRUE(conversations.put(c));
  for (const char* conv : {R"("conv_1")", R"({"id": "conv_1"})"}) {
    const auto r = parse_responses_request(cat(R"({"model": "stories260K", "instructions": "Be brief", "input": "Now", "store": false, "conversation": )",
                                               conv, "}"), kModel, &store, &conversations);
    ASSERT_EQ(r.messages.size(), 4u) << conv;
    EXPECT_EQ(r.messages[0].content, "Be brief");
    EXPECT_EQ(r.messages[1].content, "Earlier question");
    EXPECT_EQ(r.messages[2].role, "assistant");
    EXPECT_EQ(r.messages[3].content, "Now");
    EXPECT_EQ(r.conversation, "conv_1");
    EXPECT_EQ(r.responses_echo["conversation"], json({{"id", "conv_1"}}));
    ASSERT_EQ(r.responses_input.size(), 1u);  // (store: false, the conversation takes them)
    EXPECT_EQ(r.responses_input[0]["content"][0]["text"], "Now");
    EXPECT_FALSE(r.store_response);
  }
  const auto bad_request = [&](const std::string& body, const std::string& param, const std::string& needle, int status = 400) {
    fails([&] { parse_responses_request(body, kModel, &store, &conversations); }, param, needle, status);
  };
  bad_request(R"({"model": "stories260K", "input": "x", "conversation": "conv_1", "previous_response_id": "resp_a"})", "conversation", "both");
  bad_request(R"({"model": "stories260K", "input": "x", "conversation": "conv_none"})", "conversation", "Conversation with id 'conv_none' not found.", 404);
  bad_request(R"({"model": "stories260K", "input": "x", "conversation": {"id": 7}})", "conversation", "must be");
  bad_request(R"({"model": "stories260K", "input": [{"type": "item_reference", "id": )" + json(c.items[0]->id).dump() + R"(}], "conversation": "conv_1"})",
              "input[0].id", "not found");  // (a conversation's items are not the response store's)
  // What it resolves counts its conversation's items: alone, at the limit; with a reference, over it.
  const uint64_t limit = ResponseStore::text_bytes(ConversationStore::items(*conversations.get("conv_1")));
  ResponseStore small(10, 1 << 20, limit);
  small.put(stored_entry("resp_a", {"First question"}, {"First answer"}));
  parse_responses_request(R"({"model": "stories260K", "input": "x", "conversation": "conv_1"})", kModel, &small, &conversations);
  fails([&] { parse_responses_request(R"({"model": "stories260K", "input": [{"type": "item_reference", "id": "resp_a_out0"}], "conversation": "conv_1"})",
                                      kModel, &small, &conversations); },
        "input[0].id", cat(limit, " bytes"));
}

TEST(ServerMessagesApi, MapsOntoAChatRequest) {
  const auto r = parse_messages_request(R"({"model": "stories260K", "max_tokens": 100000, "system": [{"type": "text",
      "text": "Be brief", "cache_control": {"type": "ephemeral"}}], "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "user", "content": [{"type": "text", "text": "In Paris."}]},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
          {"type": "text", "text": "Let me look."},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
          {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
          {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "noon"}]},
          {"type": "text", "text": "And?"}]}],
    "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}},
              {"name": "get_time", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "tool", "name": "get_weather"}, "stop_sequences": ["\n\n"], "temperature": 0.5,
    "top_k": 5, "stream": true, "metadata": {"user_id": "u"}, "thinking": {"type": "enabled", "budget_tokens": 2048}})",
                                        kModel);
  EXPECT_EQ(r.kind, Endpoint::Messages);
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "Weather?\n\nIn Paris.");  // consecutive user turns: one turn
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "Let me look.");
  EXPECT_EQ(r.messages[2].reasoning, "hm");  // (the template decides what to render of it)
  ASSERT_EQ(r.messages[2].tool_calls.size(), 2u);
  EXPECT_EQ(r.messages[2].tool_calls[0].id, "toolu_1");
  EXPECT_EQ(r.messages[2].tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.messages[2].tool_calls[0].arguments), json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].tool_call_id, "toolu_1");
  EXPECT_EQ(r.messages[3].name, "get_weather");
  EXPECT_EQ(r.messages[3].content, "sunny");
  EXPECT_EQ(r.messages[4].content, "noon");
  EXPECT_EQ(r.messages[4].name, "get_time");
  EXPECT_EQ(r.messages[5].role, "user");
  EXPECT_EQ(r.messages[5].content, "And?");
  EXPECT_EQ(*r.max_tokens, kModel.n_ctx);  // a cap, cut to the context
  EXPECT_TRUE(r.fit_max_tokens);
  EXPECT_EQ(r.tool_choice, ToolChoice::Named);
  EXPECT_EQ(r.tool_name, "get_weather");
  EXPECT_FALSE(r.grammar.empty());
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n\n"});
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.template_vars["enable_thinking"], true);
  EXPECT_TRUE(r.add_generation_prompt);
  EXPECT_TRUE(r.unknown_fields.empty());

  // tool_choice any: one or more calls (grammar); disable_parallel_tool_use: one.
  const std::string tools = R"("tools": [{"name": "f", "input_schema": {"type": "object"}}])";
  const auto any = [&](const std::string& extra) {
    return parse_messages_request(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], )" +
                                      tools + extra + "}", kModel);
  };
  EXPECT_EQ(any("").tool_choice, ToolChoice::Auto);  // tools without a choice: auto
  EXPECT_EQ(any(R"(, "tool_choice": {"type": "none"})").tool_choice, ToolChoice::None);
  EXPECT_EQ(any(R"(, "tool_choice": {"type": "any"})").tool_choice, ToolChoice::Required);
  EXPECT_EQ(any(R"(, "tool_choice": {"type": "any"})").grammar.find("{0,0}"), std::string::npos);
  EXPECT_NE(any(R"(, "tool_choice": {"type": "any", "disable_parallel_tool_use": true})").grammar.find("{0,0}"), std::string::npos);
  // A final assistant turn is a prefill; structured output; thinking disabled; count_tokens needs no max_tokens.
  const auto pre = parse_messages_request(R"({"model": "stories260K", "max_tokens": 5, "messages": [
      {"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}],
      "output_format": {"type": "json_schema", "schema": {"type": "object"}}, "thinking": {"type": "disabled"},
      "chat_template_kwargs": {"thinking": true}, "seed": 3, "anthropic_beta": 1})", kModel);
  // Thinking is off unless asked for (Anthropic's default); a failed tool's result says so.
  const auto plain = parse_messages_request(R"({"model": "stories260K", "max_tokens": 5, "messages": [
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "ENOENT", "is_error": true},
      {"type": "text", "text": "go on"}]}]})", kModel);
  EXPECT_EQ(plain.template_vars["enable_thinking"], false);
  EXPECT_EQ(plain.template_vars["thinking"], false);
  EXPECT_EQ(plain.messages[0].content, "Error: ENOENT");
  EXPECT_TRUE(pre.continue_final_message);
  EXPECT_FALSE(pre.add_generation_prompt);
  EXPECT_FALSE(pre.grammar.empty());
  EXPECT_EQ(pre.template_vars["enable_thinking"], false);
  EXPECT_EQ(pre.template_vars["thinking"], true);  // chat_template_kwargs wins
  EXPECT_EQ(pre.sampling.seed, 3u);
  EXPECT_EQ(pre.unknown_fields, std::vector<std::string>{"anthropic_beta"});
  EXPECT_FALSE(parse_messages_request(R"({"model": "stories260K", "messages": [{"role": "user", "content": "x"}],
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}})", kModel, true).grammar.empty());

  const auto bad = [](const std::string& body, const std::string& param, int status = 400) {
    try {
      parse_messages_request(body, kModel);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, status) << body;
      EXPECT_EQ(e.param, param) << e.what();
    }
  };
  const std::string m = R"("model": "stories260K", "messages": [{"role": "user", "content": "x"}])";
  bad("{" + m + "}", "max_tokens");
  bad("{" + m + R"(, "max_tokens": 0})", "max_tokens");
  bad("{" + m + R"(, "max_tokens": "5"})", "max_tokens");
  bad(R"({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})", "model", 404);
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": []})", "messages");
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "messages[0].role");
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image",
      "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]})", "messages[0].content[0].type");
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_use",
      "id": "a", "name": "f", "input": {}}]}]})", "messages[0].content[0].type");
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]})",
      "messages[0].content[0].tool_use_id");
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result",
      "tool_use_id": "a", "content": [{"type": "image"}]}]}]})", "messages[0].content[0].content[0].type");
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": ""}]})", "messages");
  bad("{" + m + R"(, "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}]})", "tools[0].type");
  bad("{" + m + R"(, "max_tokens": 5, "tools": [{"name": "f"}], "tool_choice": {"type": "tool"}})", "tool_choice");
  bad("{" + m + R"(, "max_tokens": 5, "tools": [{"name": "f"}], "tool_choice": {"type": "tool", "name": "g"}})", "tool_choice");
  bad("{" + m + R"(, "max_tokens": 5, "stop_sequences": "x"})", "stop_sequences");
  bad("{" + m + R"(, "max_tokens": 5, "stop_sequences": [1]})", "stop_sequences");
  bad("{" + m + R"(, "max_tokens": 5, "thinking": true})", "thinking");
  bad("{" + m + R"(, "max_tokens": 5, "output_format": {"type": "json_object"}})", "output_format");
  bad("{" + m + R"(, "max_tokens": 5, "output_format": {"type": 1, "schema": {}}})", "output_format");
  bad("{" + m + R"(, "max_tokens": 5, "output_config": {"format": {"type": []}}})", "output_config.format");
  bad(R"({"model": "stories260K", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result",
      "tool_use_id": "a", "is_error": "yes"}]}]})", "messages[0].content[0].is_error");
  bad("{" + m + R"(, "max_tokens": 5, "mcp_servers": [{"url": "x"}]})", "mcp_servers");
  bad("{" + m + R"(, "max_tokens": 5, "system": [{"type": "image"}]})", "system[0].type");
}

// Consecutive turns of one role are one turn, its parts joined once (each join copied the text so
// far: 54,794 one-line user turns took 4.3 s against 0.9 s alternating).
TEST(ServerMessagesApi, ConsecutiveTurnsJoinInLinearTime) {
  constexpr int N = 30000;
  const std::string line(40, 'x');
  const auto request = [&](bool alternate) {
    std::string body = R"({"model": "stories260K", "max_tokens": 1, "messages": [)";
    for (int i = 0; i < N; ++i)
      body += cat(i ? "," : "", R"({"role": ")", alternate && i % 2 && i + 1 < N ? "assistant" : "user", R"(", "content": ")",
                  line, "\"}");
    return body + "]}";
  };
  const auto timed = [](const std::string& body, double& seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    ParsedRequest r = parse_messages_request(body, kModel, true);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  };
  double base = 0, joined = 0;
  EXPECT_EQ(timed(request(true), base).messages.size(), size_t(N) - 1);  // (the last two: users)
  const ParsedRequest r = timed(request(false), joined);
  EXPECT_LT(joined, 0.1 + 2 * base) << base;  // (less: one turn to parse on; the copies took 5x as long)
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content.size(), size_t(N) * 42 - 2);
  EXPECT_EQ(r.messages[0].content.substr(0, 84), line + "\n\n" + line + "\n\n");

  // Calls, reasoning and empty texts: calls in order, reasoning and texts joined by blank lines
  // (the empty left out), null content where a turn of calls has no text.
  const ParsedRequest calls = parse_messages_request(R"({"model": "stories260K", "max_tokens": 1, "messages": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": ""}]},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "so"},
                                         {"type": "tool_use", "id": "t2", "name": "g", "input": {"a": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r1"}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "r2"}, {"type": "text", "text": "a"}]},
      {"role": "user", "content": "b"}]})", kModel, true);
  ASSERT_EQ(calls.messages.size(), 5u);
  EXPECT_EQ(calls.messages[1].content, "");
  EXPECT_EQ(calls.messages[1].reasoning, "hm\n\nso");
  ASSERT_EQ(calls.messages[1].tool_calls.size(), 2u);
  EXPECT_EQ(calls.messages[1].tool_calls[1].name, "g");
  EXPECT_EQ(calls.messages[2].name, "f");
  EXPECT_EQ(calls.messages[3].name, "g");
  EXPECT_EQ(calls.messages[4].role, "user");
  EXPECT_EQ(calls.messages[4].content, "a\n\nb");
}

TEST(ServerParse, ModelAliases) {
  ModelInfo m = kModel;
  m.aliases = {"claude-sonnet-4-5", "gpt-4o"};
  EXPECT_EQ(parse_request(Endpoint::Chat, R"({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})", m).model,
            "stories260K");  // an alias is the model: answers and routing name its id
  EXPECT_EQ(parse_messages_request(R"({"model": "claude-sonnet-4-5", "max_tokens": 1, "messages": [{"role": "user",
      "content": "x"}]})", m).model, "stories260K");
  EXPECT_EQ(check_model(json::object(), m, false), "stories260K");
  EXPECT_THROW(check_model({{"model", "claude-haiku"}}, m, true), ApiError);
  EXPECT_THROW(check_model({{"model", "claude-haiku"}}, kModel, true), ApiError);
  EXPECT_EQ(parse_served_names("a"), std::vector<std::string>{"a"});
  EXPECT_EQ(parse_served_names("a,b,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(parse_served_names(" a , b"), (std::vector<std::string>{"a", "b"}));
  for (const char* bad : {"", ",", "a,", ",a", "a,,b", "a,b,a", "a, ", "a, a"}) EXPECT_THROW(parse_served_names(bad), Error) << bad;
}

TEST(ServerMessagesApi, AnswerFormats) {
  Finish f;
  f.reason = "stop";
  EXPECT_EQ(messages_stop(f, false).reason, "end_turn");
  EXPECT_TRUE(messages_stop(f, false).sequence.is_null());
  EXPECT_EQ(messages_stop(f, true).reason, "tool_use");
  f.stop_word = "\n\n";
  EXPECT_EQ(messages_stop(f, false).reason, "stop_sequence");
  EXPECT_EQ(messages_stop(f, false).sequence, "\n\n");
  f.reason = "length";
  EXPECT_EQ(messages_stop(f, true).reason, "max_tokens");

  const ResponseMeta m{Endpoint::Messages, "msg_1", 7, "stories260K"};
  const MessagesStop stop{"end_turn"};
  const json msg = messages_response(m, json::array({{{"type", "text"}, {"text", "Hi"}}}), &stop, {3, 4});
  EXPECT_EQ(msg, json::parse(R"({"id": "msg_1", "type": "message", "role": "assistant", "model": "stories260K",
      "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn", "stop_sequence": null,
      "usage": {"input_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 4}})"));
  EXPECT_EQ(messages_usage(Usage{10, 2, 0, 8}),
            json::parse(R"({"input_tokens": 2, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 8,
                            "output_tokens": 2})"));
  EXPECT_TRUE(messages_response(m, json::array(), nullptr, {3, 0})["stop_reason"].is_null());
  EXPECT_EQ(json(messages_tool_use_block({"call_abc", "f", R"({"x": 1})"})),
            json::parse(R"({"type": "tool_use", "id": "toolu_abc", "name": "f", "input": {"x": 1}})"));
  EXPECT_EQ(json(messages_tool_use_block({"call_abc", "f", "not json"})["input"]), json::object());
  // The input's keys in the order written (the schema's: a grammar wrote them), not sorted.
  EXPECT_EQ(messages_tool_use_block({"call_abc", "f", R"({"zeta": 1, "alpha": [2]})"})["input"].dump(), R"({"zeta":1,"alpha":[2]})");

  EXPECT_EQ(json::parse(anthropic_error_body(ApiError(404, "no such model", "model"))),
            json::parse(R"({"type": "error", "error": {"type": "not_found_error", "message": "no such model"}})"));
  EXPECT_STREQ(anthropic_error_type(400), "invalid_request_error");
  EXPECT_STREQ(anthropic_error_type(401), "authentication_error");
  EXPECT_STREQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_STREQ(anthropic_error_type(500), "api_error");
  EXPECT_STREQ(anthropic_error_type(503), "overloaded_error");
  const std::string e = typed_event("content_block_stop", {{"index", 2}});
  EXPECT_EQ(e, "event: content_block_stop\ndata: {\"index\":2,\"type\":\"content_block_stop\"}\n\n");
}

TEST(ServerAccess, ApiKeyCorsAndRequestId) {
  EXPECT_TRUE(authorized("sk-1", "Bearer sk-1"));
  EXPECT_TRUE(authorized("sk-1", "bearer sk-1"));
  EXPECT_FALSE(authorized("sk-1", "Bearer sk-2"));
  EXPECT_FALSE(authorized("sk-1", "Bearer sk-11"));
  EXPECT_FALSE(authorized("sk-1", "sk-1"));
  EXPECT_FALSE(authorized("sk-1", ""));
  EXPECT_FALSE(authorized("", "Bearer "));
  EXPECT_TRUE(authorized("sk-1", "", "sk-1"));  // Anthropic's clients: x-api-key
  EXPECT_TRUE(authorized("sk-1", "Bearer sk-1", "other"));
  EXPECT_FALSE(authorized("sk-1", "", "sk-2"));
  EXPECT_FALSE(authorized("sk-1", "", "Bearer sk-1"));
  EXPECT_FALSE(authorized("", "", ""));
  EXPECT_EQ(cors_allow_origin("*", "https://a.example"), "*");
  EXPECT_EQ(cors_allow_origin("https://a.example, https://b.example", "https://b.example"), "https://b.example");
  EXPECT_EQ(cors_allow_origin("https://a.example", "https://evil.example"), "");
  EXPECT_EQ(cors_allow_origin("*", ""), "");
  EXPECT_EQ(request_id("req-42_a.b:c"), "req-42_a.b:c");
  EXPECT_EQ(request_id("bad id"), "");
  EXPECT_EQ(request_id("x\r\nSet-Cookie: a"), "");
  EXPECT_EQ(request_id(std::string(129, 'a')), "");
}

TEST(ServerParse, Logprobs) {
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", "x"}}).logprobs, -1);
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"logprobs", nullptr}}).logprobs, -1);
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"logprobs", false}}).logprobs, -1);
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"logprobs", 0}}).logprobs, 0);
  EXPECT_EQ(parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"logprobs", 20}}).logprobs, 20);
  const json msgs = json::array({{{"role", "user"}, {"content", "x"}}});
  EXPECT_EQ(parse_chat({{"model", "stories260K"}, {"messages", msgs}}).logprobs, -1);
  EXPECT_EQ(parse_chat({{"model", "stories260K"}, {"messages", msgs}, {"logprobs", false}}).logprobs, -1);
  EXPECT_EQ(parse_chat({{"model", "stories260K"}, {"messages", msgs}, {"logprobs", true}}).logprobs, 0);
  EXPECT_EQ(parse_chat({{"model", "stories260K"}, {"messages", msgs}, {"logprobs", true}, {"top_logprobs", 5}}).logprobs, 5);
  EXPECT_EQ(parse_chat({{"model", "stories260K"}, {"messages", msgs}, {"logprobs", false}, {"top_logprobs", nullptr}}).logprobs, -1);
}

// A held response's generated logprobs count against kMaxLogprobEntries: a max_tokens not given
// is cut to fit (n 128 x 21 alternatives on a 128k context: 390 tokens a choice, "length").
TEST(ServerParse, DefaultMaxTokensFitTheLogprobEntries) {
  const int64_t per_token = 128 * 21;
  EXPECT_EQ(fit_logprob_entries(131072, per_token, 0, 1), kMaxLogprobEntries / per_token);
  EXPECT_EQ(fit_logprob_entries(131072, per_token, 0, 1), 390);
  EXPECT_EQ(fit_logprob_entries(100, per_token, 0, 1), 100);  // (fits already)
  EXPECT_EQ(fit_logprob_entries(131072, per_token, 0, 4), 97);  // a quarter each for 4 prompts
  EXPECT_EQ(fit_logprob_entries(131072, 11, 1 << 19, 1), (kMaxLogprobEntries - (1 << 19)) / 11);  // after the prompt's
  EXPECT_EQ(fit_logprob_entries(131072, per_token, kMaxLogprobEntries, 1), 131072);  // not one token fits: left to the check
  EXPECT_THROW(check_logprob_entries(kMaxLogprobEntries, 1), ApiError);
  EXPECT_NO_THROW(check_logprob_entries(kMaxLogprobEntries - 390 * per_token, 390 * per_token));
}

TEST(ServerParse, ResolveMaxTokens) {
  auto r = parse_c({{"model", "stories260K"}, {"prompt", "x"}});
  EXPECT_EQ(resolve_max_tokens(r, 5, 512), 16);  // OpenAI's completions default
  EXPECT_EQ(resolve_max_tokens(r, 500, 512), 12);  // ... cut to the context
  r = parse_c({{"model", "stories260K"}, {"prompt", "x"}, {"max_tokens", 507}});
  EXPECT_EQ(resolve_max_tokens(r, 5, 512), 507);
  r.max_tokens = 508;
  try {
    resolve_max_tokens(r, 5, 512);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_EQ(e.code, "context_length_exceeded");  // (OpenAI's, which LangChain looks for)
    EXPECT_NE(std::string(e.what()).find("maximum context length is 512"), std::string::npos) << e.what();
  }
  try {
    resolve_max_tokens(r, 512, 512);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code, "context_length_exceeded");
  }
  EXPECT_THROW(resolve_max_tokens(r, 512, 512), ApiError);  // no room for one token
  // No overflow in prompt + max_tokens (the binary protocol passes any int64).
  r.max_tokens = std::numeric_limits<int64_t>::max();
  try {
    resolve_max_tokens(r, 5, 512);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_NE(std::string(e.what()).find(std::to_string(std::numeric_limits<int64_t>::max()) + " for the completion"),
              std::string::npos) << e.what();
  }
  r.fit_max_tokens = true;  // `run -n`: cut to the context
  EXPECT_EQ(resolve_max_tokens(r, 5, 512), 507);
  r.max_tokens = 0;
  EXPECT_THROW(resolve_max_tokens(r, 5, 512), ApiError);
  auto c = parse_chat({{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(resolve_max_tokens(c, 12, 512), 500);  // chat: the rest of the context
}

TEST(ServerFormat, ErrorBody) {
  const json j = json::parse(error_body(ApiError(400, "bad top_p", "top_p")));
  EXPECT_EQ(j["error"]["message"], "bad top_p");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_TRUE(j["error"]["code"].is_null());
  const json k = json::parse(error_body(ApiError(429, "full", "", "rate_limit_error", "queue_full")));
  EXPECT_TRUE(k["error"]["param"].is_null());
  EXPECT_EQ(k["error"]["code"], "queue_full");
}

// A message that quotes the client's bytes (the target of "GET /\xff") need not be UTF-8: its
// body still serializes, with replacement characters (a throw here escaped the I/O thread).
TEST(ServerFormat, ErrorBodyOfInvalidUtf8) {
  std::string body;
  ASSERT_NO_THROW(body = error_body(ApiError(404, "no route for /\xff\xfe")));
  EXPECT_EQ(json::parse(body)["error"]["message"], "no route for /\xef\xbf\xbd\xef\xbf\xbd");
}

TEST(ServerFormat, CompletionAndChatBodies) {
  const ResponseMeta m{Endpoint::Completions, "cmpl-1", 1700000000, "stories260K"};
  const json c = completion_response(m, "hello", "length", {5, 3});
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "hello");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(c["usage"]["completion_tokens"], 3);
  EXPECT_EQ(c["usage"]["total_tokens"], 8);
  const ResponseMeta mc{Endpoint::Chat, "chatcmpl-1", 1700000000, "stories260K"};
  const json h = completion_response(mc, "hi", "stop", {1, 1});
  EXPECT_EQ(h["object"], "chat.completion");
  EXPECT_EQ(h["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(h["choices"][0]["message"]["content"], "hi");
}

TEST(ServerFormat, LogprobsCompletions) {
  const std::vector<TokenLogprob> toks = {{" a", -0.5f, {{" a", -0.5f}, {" b", -1.5f}}},
                                          {"bc", -2.0f, {{"x", -0.25f}, {"x", -3.0f}, {"bc", -2.0f}}}};
  const json j = logprobs_json(Endpoint::Completions, toks, 7);
  EXPECT_EQ(j["tokens"], json::array({" a", "bc"}));
  EXPECT_EQ(j["token_logprobs"], json::array({-0.5, -2.0}));
  // One dict per token; a piece shared by two ids keeps the better (first) logprob.
  EXPECT_EQ(j["top_logprobs"], json::parse(R"([{" a": -0.5, " b": -1.5}, {"x": -0.25, "bc": -2.0}])"));
  EXPECT_EQ(j["text_offset"], json::array({7, 9}));
  const json empty = logprobs_json(Endpoint::Completions, {});
  EXPECT_EQ(empty["tokens"], json::array());
  EXPECT_EQ(empty["text_offset"], json::array());

  ResponseMeta m{Endpoint::Completions, "cmpl-1", 5, "stories260K"};
  EXPECT_EQ(completion_response(m, "x", "length", {1, 1})["choices"][0]["logprobs"], nullptr);
  EXPECT_EQ(completion_response(m, " abc", "length", {1, 2}, j)["choices"][0]["logprobs"], j);
  EXPECT_EQ(stream_chunk(m, " a", false, "", false, j)["choices"][0]["logprobs"], j);
  EXPECT_EQ(stream_chunk(m, " a", false, "", false)["choices"][0]["logprobs"], nullptr);
}

// text_offset counts characters (code points), as OpenAI and vLLM do, not UTF-8 bytes: "é" is one,
// and a character whose bytes are split over tokens counts at the token holding its first byte
// (a piece of continuation bytes alone adds nothing; nothing goes negative).
TEST(ServerFormat, LogprobsTextOffsetCountsCharacters) {
  EXPECT_EQ(text_offset_length(""), 0);
  EXPECT_EQ(text_offset_length("abc"), 3);
  EXPECT_EQ(text_offset_length("\xC3\xA9t\xC3\xA9"), 3);     // "été"
  EXPECT_EQ(text_offset_length("\xF0\x9F\x98\x80!"), 2);     // an emoji and "!"
  EXPECT_EQ(text_offset_length("\xE2"), 1);                  // a sequence's first byte
  EXPECT_EQ(text_offset_length("\x82\xAC"), 0);              // its continuation bytes
  const std::vector<TokenLogprob> toks = {{"\xC3\xA9t", -1.0f, {}}, {"\xE2", -1.0f, {}}, {"\x82\xAC", -1.0f, {}},
                                          {" \xE2\x82\xAC", -1.0f, {}}, {"x", -1.0f, {}}};
  EXPECT_EQ(logprobs_json(Endpoint::Completions, toks)["text_offset"], json::array({0, 2, 3, 3, 5}));
  EXPECT_EQ(logprobs_json(Endpoint::Completions, toks, 4)["text_offset"], json::array({4, 6, 7, 7, 9}));
}

TEST(ServerFormat, ChoicesAndEchoedLogprobs) {
  const ResponseMeta m{Endpoint::Completions, "cmpl-1", 5, "stories260K"};
  const json c = completion_response(
      m, json::array({completion_choice(m.kind, 0, "a", "stop"), completion_choice(m.kind, 1, "b", "length")}), {4, 6});
  ASSERT_EQ(c["choices"].size(), 2u);
  EXPECT_EQ(c["choices"][1]["index"], 1);
  EXPECT_EQ(c["choices"][1]["text"], "b");
  EXPECT_EQ(c["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["total_tokens"], 10);
  EXPECT_EQ(stream_chunk(m, "x", false, "", false, nullptr, 3)["choices"][0]["index"], 3);
  const ResponseMeta mc{Endpoint::Chat, "chatcmpl-1", 5, "stories260K"};
  EXPECT_EQ(stream_chunk(mc, "", true, "", false, nullptr, 2)["choices"][0]["index"], 2);
  EXPECT_EQ(tool_calls_chunk(mc, json::array(), false, 2)["choices"][0]["index"], 2);
  EXPECT_EQ(completion_choice(mc.kind, 1, "hi", "stop")["message"]["content"], "hi");

  // An echoed prompt's first token: null logprob and null top_logprobs (nothing predicts it).
  const std::vector<TokenLogprob> toks = {{"<s>", std::numeric_limits<float>::quiet_NaN(), {}},
                                          {"Once", -3.0f, {{" The", -1.0f}}}};
  const json j = logprobs_json(Endpoint::Completions, toks);
  EXPECT_EQ(j["tokens"], json::array({"<s>", "Once"}));
  EXPECT_EQ(j["token_logprobs"], json::parse("[null, -3.0]"));
  EXPECT_EQ(j["top_logprobs"], json::parse(R"([null, {" The": -1.0}])"));
  EXPECT_EQ(j["text_offset"], json::array({0, 3}));
}

TEST(ServerFormat, LogprobsChat) {
  const std::vector<TokenLogprob> toks = {{"hi", -0.125f, {{"hi", -0.125f}, {"yo", -2.5f}}},
                                          {"\xE2", -1.0f, {}}};
  const json j = logprobs_json(Endpoint::Chat, toks);
  ASSERT_EQ(j["content"].size(), 2u);
  EXPECT_EQ(j["refusal"], nullptr);
  const json& c0 = j["content"][0];
  EXPECT_EQ(c0["token"], "hi");
  EXPECT_EQ(c0["logprob"], -0.125);
  EXPECT_EQ(c0["bytes"], json::array({104, 105}));
  EXPECT_EQ(c0["top_logprobs"], json::parse(R"([{"token": "hi", "logprob": -0.125, "bytes": [104, 105]},
                                                 {"token": "yo", "logprob": -2.5, "bytes": [121, 111]}])"));
  // A partial UTF-8 piece: exact bytes in "bytes"; the dumped token text never throws.
  EXPECT_EQ(j["content"][1]["bytes"], json::array({0xE2}));
  EXPECT_EQ(j["content"][1]["top_logprobs"], json::array());
  ResponseMeta m{Endpoint::Chat, "chatcmpl-1", 5, "stories260K"};
  const std::string sse = sse_event(stream_chunk(m, "hi", false, "", false, j));
  EXPECT_NE(sse.find(R"("bytes":[226])"), std::string::npos) << sse;
  EXPECT_EQ(completion_response(m, "hi", "stop", {1, 2}, j)["choices"][0]["logprobs"], j);
}

TEST(ServerFormat, SseChunks) {
  const ResponseMeta mc{Endpoint::Chat, "chatcmpl-1", 1, "m"};
  const json first = stream_chunk(mc, "", true, "", false);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  const json mid = stream_chunk(mc, "tok", false, "", true);
  EXPECT_FALSE(mid["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "tok");
  EXPECT_TRUE(mid.contains("usage") && mid["usage"].is_null());
  const json last = stream_chunk(mc, "", false, "stop", false);
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  const json u = usage_chunk(mc, {4, 6});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 10);

  const ResponseMeta m{Endpoint::Completions, "cmpl-1", 1, "m"};
  EXPECT_EQ(stream_chunk(m, "x", false, "", false)["choices"][0]["text"], "x");
  const std::string ev = sse_event(json{{"a", 1}});
  EXPECT_EQ(ev, "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  // A partial UTF-8 byte at the end of a stream is replaced, never thrown on.
  EXPECT_NO_THROW(sse_event(json{{"t", std::string("\xE2\x82")}}));
}

TEST(ServerFormat, HttpFraming) {
  const std::string r = http_response(404, "application/json", "{}", true, "X-A: b\r\n");
  EXPECT_EQ(r, "HTTP/1.1 404 Not Found\r\nServer: firsttoken\r\nContent-Type: application/json\r\n"
               "Content-Length: 2\r\nConnection: keep-alive\r\nX-A: b\r\n\r\n{}");
  EXPECT_NE(http_response(200, "t", "", false).find("Connection: close\r\n"), std::string::npos);
  EXPECT_EQ(http_chunk("hello world, 26 bytes long"), "1a\r\nhello world, 26 bytes long\r\n");
  EXPECT_EQ(http_chunk(""), "0\r\n\r\n");
  const std::string h = sse_response_head(true);
  EXPECT_NE(h.find("Content-Type: text/event-stream\r\n"), std::string::npos);
  EXPECT_NE(h.find("Transfer-Encoding: chunked\r\n"), std::string::npos);
  EXPECT_EQ(h.substr(h.size() - 4), "\r\n\r\n");
}

TEST(ServerStop, MatchesAcrossPiecesAndHoldsBackPrefixes) {
  StopMatcher s({"END", "\n\n"});
  EXPECT_EQ(s.push("Hello E"), "Hello ");  // "E" could start "END"
  EXPECT_EQ(s.push("N"), "");
  EXPECT_EQ(s.push("x"), "ENx");           // it did not
  EXPECT_EQ(s.push(" a\n"), " a");
  EXPECT_EQ(s.push("\nrest"), "");         // "\n\n" matched: text after it is dropped
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("more"), "");
  EXPECT_EQ(s.flush(), "");

  StopMatcher t({"stop"});
  EXPECT_EQ(t.push("a sto"), "a ");
  EXPECT_EQ(t.flush(), "sto");  // end of stream: the held tail is text after all
  EXPECT_FALSE(t.stopped());

  StopMatcher none;
  EXPECT_EQ(none.push("abc"), "abc");
  StopMatcher first({"b", "abc"});  // the match that starts first wins, whatever the list order
  EXPECT_EQ(first.push("xabc"), "x");

  // include_stop_str_in_output: the matched stop string ends the text (the earliest match; at
  // one position, the first in the list); what follows it is still dropped.
  StopMatcher inc({"b", "abc", "ab"}, true);
  EXPECT_EQ(inc.push("xa"), "x");
  EXPECT_EQ(inc.push("bcdef"), "abc");
  EXPECT_TRUE(inc.stopped());
  EXPECT_EQ(inc.flush(), "");
  StopMatcher inc2({"\n\n"}, true);
  EXPECT_EQ(inc2.push("one\n"), "one");
  EXPECT_EQ(inc2.push("\ntwo"), "\n\n");
}

// The KMP matcher against the plain rule (find each stop in all held text, the earliest start
// wins, then list order; hold back the longest tail that begins a stop string), on random texts
// in random pieces over a 3-letter alphabet, so that stop strings overlap, nest and repeat.
TEST(ServerStop, EqualsThePlainRuleOnRandomPieces) {
  struct Plain {
    std::vector<std::string> stops;
    bool include;
    std::string held;
    bool stopped = false;
    std::string push(const std::string& text) {
      if (stopped) return {};
      held += text;
      size_t best = std::string::npos;
      const std::string* matched = nullptr;
      for (const auto& s : stops)
        if (const size_t at = held.find(s); at < best) best = at, matched = &s;
      if (matched) {
        stopped = true;
        return held.substr(0, best) + (include ? *matched : "");
      }
      size_t keep = 0;
      for (const auto& s : stops)
        for (size_t n = std::min(s.size() - 1, held.size()); n > keep; --n)
          if (held.compare(held.size() - n, n, s, 0, n) == 0) keep = std::max(keep, n);
      std::string out = held.substr(0, held.size() - keep);
      held.erase(0, held.size() - keep);
      return out;
    }
  };
  std::mt19937 rng(11);
  auto word = [&](size_t max_len) {
    std::string w(1 + rng() % max_len, 'a');
    for (char& c : w) c = char('a' + rng() % 3);
    return w;
  };
  int stopped = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::string> stops;
    for (size_t k = 0, n = 1 + rng() % 4; k < n; ++k) stops.push_back(word(round % 2 ? 3 : 8));
    const bool include = rng() % 2;
    StopMatcher m(stops, include);
    Plain p{stops, include, {}};
    std::string got, want;
    for (int piece = 0; piece < 12; ++piece) {
      const std::string t = word(4);
      got += m.push(t);
      want += p.push(t);
      ASSERT_EQ(got, want) << "round " << round;
    }
    ASSERT_EQ(m.stopped(), p.stopped);
    stopped += p.stopped;
    got += m.flush();
    if (!p.stopped) want += p.held;
    ASSERT_EQ(got, want);
  }
  EXPECT_GT(stopped, 500);
  EXPECT_LT(stopped, 2900);
}

// allowed_token_ids masks every other token; a bad word's last token is masked exactly where
// the output ends with the tokens before it (a one-token word: always).
TEST(ServerLogits, AllowedTokensAndBadWords) {
  constexpr int32_t V = 10;
  const float kNever = -std::numeric_limits<float>::infinity();
  auto run = [&](LogitsProcessor& p, int64_t n) {
    std::vector<float> l(V, 0.0f);
    p.apply(l.data(), V, n);
    std::vector<int32_t> masked;
    for (int32_t t = 0; t < V; ++t)
      if (l[size_t(t)] == kNever) masked.push_back(t);
    return masked;
  };
  GenerationRequest r;
  r.allowed_token_ids = {2, 5};
  auto allowed = make_logits_processor(r, {});
  ASSERT_TRUE(allowed);
  EXPECT_EQ(run(*allowed, 0), (std::vector<int32_t>{0, 1, 3, 4, 6, 7, 8, 9}));  // (9: above every allowed id)
  r.allowed_token_ids.clear();
  EXPECT_FALSE(make_logits_processor(r, {}));
  auto bad = make_logits_processor(r, {}, nullptr, std::make_shared<const BadWordIds>(BadWordIds{{7}, {1, 2, 3}}));
  ASSERT_TRUE(bad);
  EXPECT_EQ(run(*bad, 0), (std::vector<int32_t>{7}));
  bad->accept(1);
  EXPECT_EQ(run(*bad, 1), (std::vector<int32_t>{7}));
  bad->accept(2);
  EXPECT_EQ(run(*bad, 2), (std::vector<int32_t>{3, 7}));  // 1 2 so far: 3 would complete the word
  bad->accept(4);
  EXPECT_EQ(run(*bad, 3), (std::vector<int32_t>{7}));
}

// ReasoningSplit against the plain rule on whole texts, for every way of cutting them into
// pieces: open (or "<think>" first, after whitespace) -> reasoning up to "</think>", content
// after it; otherwise all content.
TEST(ServerReasoning, SplitsAsTheWholeTextWouldInAnyPieces) {
  auto plain = [](std::string t, bool open) -> std::pair<std::string, std::string> {
    if (!open) {
      const size_t lead = std::min(t.find_first_not_of(" \t\r\n"), t.size());
      if (t.compare(lead, 7, "<think>") != 0) return {"", t};
      t.erase(0, lead + 7);
    }
    const size_t at = t.find("</think>");
    if (at == std::string::npos) return {t, ""};
    return {t.substr(0, at), t.substr(at + 8)};
  };
  const std::vector<std::string> texts = {"Let me see.\n</think>\n\nYes.", "<think>hm</think>ok", "  \n<think>a</think>b</think>c",
                                          "no tags at all", "<thin", "</thi", "a</think", "<think>", "", "x<think>y</think>z",
                                          "</think>only content", "<<think>>", "\n\n"};
  std::mt19937 rng(5);
  for (const std::string& t : texts)
    for (const bool open : {false, true})
      for (int round = 0; round < 50; ++round) {
        ReasoningSplit split(open);
        std::string reasoning, content;
        for (size_t i = 0; i <= t.size();) {
          const size_t n = round == 0 ? t.size() : rng() % 4;
          const bool last = i + n >= t.size();
          const auto parts = split.push(std::string_view(t).substr(i, n), last);
          reasoning += parts.reasoning;
          content += parts.content;
          if (last) break;
          i += n;
        }
        const auto [want_r, want_c] = plain(t, open);
        ASSERT_EQ(reasoning, want_r) << "'" << t << "' open " << open << " round " << round;
        ASSERT_EQ(content, want_c) << "'" << t << "' open " << open << " round " << round;
      }
}

// A model that writes whitespace for long before "<think>" or anything else: each piece looks at
// its own bytes (each rescanned the whole lead before: 8e9 byte reads for these 1.3 MB).
TEST(ServerReasoning, LongLeadingWhitespaceIsScannedOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string end : {"<think>r</think>c", "c"}) {
    ReasoningSplit split(false);
    std::string reasoning, content;
    for (int i = 0; i < 80000; ++i) {
      const auto p = split.push("\n               ", false);
      reasoning += p.reasoning, content += p.content;
    }
    const auto p = split.push(end, true);
    reasoning += p.reasoning, content += p.content;
    EXPECT_EQ(reasoning, end == "c" ? "" : "r");
    EXPECT_EQ(content.size(), end == "c" ? 80000u * 16 + 1 : 1u);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);  // (ms; minutes before)
}

// gpt-oss's harmony output, for every way of cutting it into pieces: analysis -> reasoning,
// final/commentary -> content, to=functions.NAME -> a call, the markup dropped (raw: kept but for
// the calls' messages); an output that does not start as harmony is content.
TEST(ServerReasoning, HarmonySplitsChannelsInAnyPieces) {
  struct Case {
    std::string text, reasoning, content;
    std::vector<std::pair<std::string, std::string>> calls;
    std::string raw;  // the content with raw (--reasoning-format none); "=": the whole text
  };
  const std::string get = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
  const std::vector<Case> cases = {
      {"<|channel|>analysis<|message|>Think about it.<|end|><|start|>assistant<|channel|>final<|message|>The answer.",
       "Think about it.", "The answer.", {}, "="},
      {"<|channel|>analysis<|message|>Need the weather.<|end|>" + get + "{\"city\": \"Paris\"}",
       "Need the weather.", "", {{"get_weather", "{\"city\": \"Paris\"}"}}, "<|channel|>analysis<|message|>Need the weather.<|end|>"},
      // The recipient before the channel (gpt-oss's own template renders calls so), a call ended by <|end|>.
      {"<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.now<|channel|>commentary json<|message|> {} <|end|>",
       "x", "", {{"now", "{}"}}, "<|channel|>analysis<|message|>x<|end|>"},
      // A preamble on the commentary channel is content.
      {"<|channel|>commentary<|message|>Let me check.<|end|>" + get + "{}", "", "Let me check.", {{"get_weather", "{}"}},
       "<|channel|>commentary<|message|>Let me check.<|end|>"},
      {"<|channel|>final<|message|>Hi", "", "Hi", {}, "="},
      // Not harmony (a grammar's JSON, a model off its format): content throughout.
      {"{\"name\": \"x\"}", "", "{\"name\": \"x\"}", {}, "="},
      // Text before any header (a continued final message, a stray lead) is an open content
      // message: its end and the headers after it are still read (a header cut short: markup).
      {"Hello <|channel|>", "", "Hello ", {}, "="},
      {"the rest.<|end|><|start|>assistant<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>ok",
       "hm", "the rest.ok", {}, "="},
      // Cut short inside a message, a marker's start in it; a message left without <|end|>.
      {"<|channel|>analysis<|message|>Hmm, a < b || c <|", "Hmm, a < b || c <|", "", {}, "="},
      {"<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b", "a", "b", {}, "="},
      {"<|channel|>analysis<|message|>a<|channel|>final<|message|>b<|end|>\n", "a", "b", {}, "="},
      // A built-in tool's call (browser, python) is part of the reasoning; a header cut short is markup.
      {"<|channel|>analysis to=browser.search <|constrain|>json<|message|>{\"q\": 1}<|end|><|start|>assistant<|chan",
       "{\"q\": 1}", "", {}, "="},
      {"", "", "", {}, "="},
      {"<|channel|>analy", "", "", {}, "="},  // (a header cut short: markup)
      {"<|chann", "", "<|chann", {}, "="},    // (markers come whole, as tokens: this is text)
  };
  std::mt19937 rng(11);
  for (const Case& k : cases)
    for (const bool raw : {false, true})
      for (int round = 0; round < 60; ++round) {
        ReasoningSplit split{HarmonySplit(raw)};
        std::string reasoning, content;
        std::vector<ToolCall> calls;
        for (size_t i = 0;;) {
          const size_t n = round == 0 ? k.text.size() : rng() % 5;
          const bool last = i + n >= k.text.size();
          const auto parts = split.push(std::string_view(k.text).substr(std::min(i, k.text.size()), n), last);
          reasoning += parts.reasoning;
          content += parts.content;
          for (ToolCall& c : split.harmony()->take_calls()) calls.push_back(std::move(c));
          if (last) break;
          i += n;
        }
        const std::string where = "'" + k.text + "' raw " + std::to_string(raw) + " round " + std::to_string(round);
        ASSERT_EQ(reasoning, raw ? "" : k.reasoning) << where;
        ASSERT_EQ(content, raw ? (k.raw == "=" ? k.text : k.raw) : k.content) << where;
        ASSERT_EQ(split.reasoned(), !raw && k.text.find("analysis") != std::string::npos) << where;
        ASSERT_EQ(calls.size(), k.calls.size()) << where;
        for (size_t c = 0; c < calls.size(); ++c) {
          EXPECT_EQ(calls[c].name, k.calls[c].first) << where;
          EXPECT_EQ(calls[c].arguments, k.calls[c].second) << where;
          EXPECT_TRUE(calls[c].id.starts_with("call_")) << where;
        }
      }
}

// A generation cut short (max_tokens) inside a call's arguments: no call (its <|call|> never came),
// the arguments so far are content; a call whose message ended stays a call.
TEST(ServerReasoning, HarmonyCallCutShortIsNoCall) {
  const std::string get = "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.get<|channel|>commentary json<|message|>";
  for (const bool cut : {true, false}) {
    ReasoningSplit split{HarmonySplit(false)};
    auto parts = split.push(get + "{\"city\": \"Pa", false);
    std::string content = parts.content;
    if (cut) split.cut_short();
    parts = split.push("", true);
    content += parts.content;
    const std::vector<ToolCall> calls = split.harmony()->take_calls();
    EXPECT_EQ(calls.size(), cut ? 0u : 1u);
    EXPECT_EQ(content, cut ? "{\"city\": \"Pa" : "");
  }
}

// Its calls under a tool choice: auto keeps those naming a function of the request's; the others
// (and all under none) are content.
TEST(ServerTools, HarmonyCallsUnderAToolChoice) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])");
  const std::vector<ToolCall> calls = {
      {"call_1", "get_weather", R"({"city": "Paris"})"}, {"call_2", "nope", "{}"}, {"call_3", "get_weather", "[1,2]"}};
  const FoundToolCalls a = harmony_tool_calls(calls, ToolChoice::Auto, tools);
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(a.content, "{}\n[1,2]");  // (not an object: no call)
  const FoundToolCalls none = harmony_tool_calls(calls, ToolChoice::None, tools);
  EXPECT_TRUE(none.calls.empty());
  EXPECT_EQ(none.content, "{\"city\": \"Paris\"}\n{}\n[1,2]");
  EXPECT_EQ(tool_calls_json(a.calls)[0]["function"]["name"], "get_weather");
}

// bad_word_ids on real vocabularies: byte-level BPE takes the word and its spaced form (another
// first token, as long); SentencePiece's own space prefix makes the plain form a word's start.
TEST(ServerLogits, BadWordsAsTokenSequences) {
  int vocabs = 0;
  for (const char* name : {"ggml-vocab-gpt-2", "ggml-vocab-llama-spm"}) {
    const std::string path = test::shared_file(std::string("tokenizer/") + name + ".gguf");
    if (path.empty()) continue;
    ++vocabs;
    const Tokenizer tok = Tokenizer::from_gguf(*GGUFFile::open(path));
    BadWordIds want;  // vLLM's rule, spelled out: the spaced form where it is as long and starts elsewhere
    for (const char* w : {"hello", "unbelievably"}) {
      const auto plain = tok.encode(w, false, true), spaced = tok.encode(std::string(" ") + w, false, true);
      want.push_back(plain);
      if (spaced.size() == plain.size() && spaced.front() != plain.front()) want.push_back(spaced);
    }
    EXPECT_EQ(bad_word_ids(tok, {"  hello", "\tunbelievably"}), want) << name;
    if (tok.model_name() == "gpt2") {
      EXPECT_EQ(want[1], tok.encode(" hello", false, true));  // (the word alone and after a space)
    } else {
      EXPECT_EQ(want.size(), 2u);  // SentencePiece's own space prefix: the plain form starts a word
    }
  }
  if (vocabs == 0) GTEST_SKIP() << "no shared vocabularies";
}

TEST(ServerMetrics, PrometheusText) {
  Histogram h({0.001, 0.01, 0.1});
  h.observe(0.0005);
  h.observe(0.05);
  h.observe(5);
  std::string out;
  h.render(out, "x_seconds", "help");
  EXPECT_NE(out.find("# TYPE x_seconds histogram\n"), std::string::npos);
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.001\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.01\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"0.1\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_seconds_count 3\n"), std::string::npos) << out;
  const auto b = latency_buckets();
  EXPECT_DOUBLE_EQ(b.front(), 0.001);
  EXPECT_DOUBLE_EQ(b.back(), 60.0);

  ServerMetrics m;
  RequestTimings t;
  t.arrival_ms = 0;
  t.first_scheduled_ms = 2;
  t.first_token_ms = 10;
  t.finish_ms = 30;
  t.token_ms = {10, 20, 30};
  m.observe_finished(t, "length", 5, 3);
  m.count_rejected();
  EngineMetrics em;
  em.running = 2;
  em.kv_total_blocks = 100;
  em.kv_used_blocks = 25;
  em.kv_capacity_tokens = 1600;
  em.kv_bytes = 3u << 20;
  em.counters.generated_tokens = 3;
  em.step_time_error.observe(0.03);
  em.step_time_error.observe(0.5);
  em.rejected_late = 1;
  m.http.open = 2;
  m.binary.refused = 3;
  m.frame_timeouts = 4;
  const std::string text = m.render(em);
  for (const char* line : {"firsttoken:num_requests_running 2\n", "firsttoken:kv_cache_usage_perc 0.25\n",
                           "firsttoken:generation_tokens_total 3\n", "firsttoken:request_rejected_total 1\n",
                           "firsttoken:request_success_total{finished_reason=\"length\"} 1\n",
                           "firsttoken:time_to_first_token_seconds_bucket{le=\"0.01\"} 1\n",
                           "firsttoken:time_to_first_token_seconds_bucket{le=\"0.005\"} 0\n",
                           "firsttoken:time_per_output_token_seconds_count 2\n",
                           "firsttoken:e2e_request_latency_seconds_count 1\n",
                           "firsttoken:connections_open{listener=\"http\"} 2\n",
                           "firsttoken:connections_open{listener=\"binary\"} 0\n",
                           "firsttoken:connections_refused_total{listener=\"binary\"} 3\n",
                           "firsttoken:binary_frame_timeouts_total 4\n",
                           "# TYPE firsttoken:step_time_prediction_error_ratio histogram\n",
                           "firsttoken:step_time_prediction_error_ratio_bucket{le=\"0.02\"} 0\n",
                           "firsttoken:step_time_prediction_error_ratio_bucket{le=\"0.05\"} 1\n",
                           "firsttoken:step_time_prediction_error_ratio_bucket{le=\"+Inf\"} 2\n",
                           "firsttoken:step_time_prediction_error_ratio_count 2\n",
                           "firsttoken:request_rejected_late_total 1\n",
                           "firsttoken:kv_cache_capacity_tokens 1600\n", "firsttoken:kv_cache_bytes 3145728\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
}

// The connection and frame limits: one setting each (key, flag, range).
TEST(ServerConfig, ConnectionLimits) {
  ServeConfig c;
  apply_config_json(json::parse(R"({"server": {"max_connections": 8, "frame_timeout_s": 2.5}})"), c);
  EXPECT_EQ(c.max_connections, 8);
  EXPECT_DOUBLE_EQ(c.frame_timeout_s, 2.5);
  EXPECT_THROW(apply_config_json(json::parse(R"({"server": {"max_connections": 0}})"), c), Error);
  EXPECT_THROW(apply_config_json(json::parse(R"({"server": {"frame_timeout_s": 0}})"), c), Error);
  std::set<std::string> flags;
  for (const ServeSetting& s : serve_settings()) flags.insert(s.flags);
  for (const char* f : {"--max-connections", "--frame-timeout", "--max-body-bytes"}) EXPECT_TRUE(flags.count(f)) << f;
}

// Settings that refused every request are start-up errors naming them: max_queue 0 (every
// request 429), ttft_slo_base_ms and ttft_slo_stretch both 0 with reject_late (every default
// deadline 0 ms: every request that gives none refused); a config file that never ends is an
// error, not bad_alloc.
TEST(ServerConfig, SettingsThatRefuseEveryRequestAreErrors) {
  ServeConfig c;
  try {
    apply_config_json(json::parse(R"({"server": {"max_queue": 0}})"), c);
    ADD_FAILURE() << "max_queue 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "config: 'server.max_queue' must be in [1, 1073741824], got 0");
  }
  apply_config_json(json::parse(R"({"server": {"max_queue": 1}, "scheduler": {"ttft_slo_base_ms": 0}})"), c);
  EXPECT_NO_THROW(check_deadlines(c));  // stretch 2: deadlines scale with the prompt
  apply_config_json(json::parse(R"({"scheduler": {"ttft_slo_stretch": 0}})"), c);
  EXPECT_NO_THROW(check_deadlines(c));  // without reject_late: equal deadlines, nothing refused
  c.reject_late_factor = 2;
  try {
    check_deadlines(c);
    ADD_FAILURE() << "deadlines of 0 ms accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler.ttft_slo_base_ms (--ttft-slo-base) and scheduler.ttft_slo_stretch "
                                         "(--ttft-slo-stretch) are both 0"),
              std::string::npos) << e.what();
  }
  c.ttft_slo_base_ms = 50;
  EXPECT_NO_THROW(check_deadlines(c));
  try {
    read_text_file("/dev/zero", "config file");
    ADD_FAILURE() << "read /dev/zero";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "/dev/zero: the config file is larger than 64 MiB");
  }
  // A key given twice is an error naming it (nlohmann kept the last: 1000 threads, not 1).
  const test::TempFile twice("twice.json");
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"server": {"threads": 1, "threads": 1000}})", "server.threads"},
           {R"({"adapters": [{"name": "a", "path": "x"}], "scheduler": {"max_num_seqs": 2}, "adapters": []})", "adapters"},
           {R"({"adapters": [{"name": "a", "name": "b", "path": "x"}]})", "adapters.name"}}) {
    std::ofstream(twice.path()) << text;
    ServeConfig d;
    try {
      apply_config_file(twice.path(), d);
      ADD_FAILURE() << text;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), twice.path() + ": the key '" + key + "' is given twice") << text;
    }
  }
  std::ofstream(twice.path()) << R"({"server": {"threads": 1}, "scheduler": {"threads_x": [{"threads": 2}, {"threads": 3}]}})";
  ServeConfig d;
  try {  // (the same key in sibling objects is no repeat: the file fails only on the unknown key)
    apply_config_file(twice.path(), d);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("given twice"), std::string::npos) << e.what();
  }
}

TEST(ServerConfig, FileShapeMapsOntoEngineConfig) {
  ServeConfig c;
  apply_config_json(json::parse(R"({
      "scheduler": {"prefill_chunk_size": 128, "step_latency_target_ms": 20, "max_active_adapters": 0,
                    "enable_speculative_decoding": false},
      "parallel_config": {"tp_size": 1, "pp_size": 1, "optimize_for_latency": true},
      "server": {"host": "0.0.0.0", "port": 0, "binary_port": 9001, "max_queue": 3, "threads": 2, "http_threads": 4},
      "kv_cache": {"memory_mib": 64, "block_size": 32, "prefix_caching": false, "dtype": "q8_0"}})"),
                    c);
  EXPECT_EQ(c.host, "0.0.0.0");
  EXPECT_EQ(c.port, 0);
  EXPECT_EQ(c.binary_port, 9001);
  EXPECT_EQ(c.max_queue, 3);
  EXPECT_EQ(c.http_threads, 4);
  const EngineConfig e = to_engine_config(c);
  EXPECT_EQ(e.scheduler.chunk_size, 128);
  EXPECT_DOUBLE_EQ(e.scheduler.step_latency_target_ms, 20);
  EXPECT_EQ(e.runtime.threads, 2);
  EXPECT_EQ(e.runtime.kv_block_size, 32);
  EXPECT_EQ(e.kv_memory_bytes, 64ull << 20);
  EXPECT_EQ(e.runtime.kv_type, GGMLType::Q8_0);
  EXPECT_FALSE(e.prefix_caching);
  for (const char* bad : {R"({"kv_cache": {"dtype": "q4_0"}})", R"({"kv_cache": {"block_size": 8}})"}) {
    ServeConfig x;
    EXPECT_THROW(apply_config_json(json::parse(bad), x), Error) << bad;
  }
  try {
    ServeConfig x;
    apply_config_json(json::parse(R"({"kv_cache": {"dtype": "int4"}})"), x);
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_EQ(std::string(err.what()), "config: 'kv_cache.dtype': KV cache type 'int4' is not one of f16, bf16, q8_0, f32");
  }
  apply_config_json(json::parse(R"({"scheduler": {"prefill_chunk_size": "auto"}})"), c);
  EXPECT_EQ(to_engine_config(c).scheduler.chunk_size, -1);
}

// Each serve setting is declared once: a unique key and flag, a default inside its range, the
// engine's default where the engine has one, and one range for the file and the flag.
TEST(ServerConfig, OneDeclarationPerSetting) {
  std::set<std::string> keys, flags;
  const ServeConfig d;
  const ServeSetting* port = nullptr;
  for (const ServeSetting& s : serve_settings()) {
    EXPECT_TRUE(keys.insert(s.key).second) << s.key;
    if (*s.flags) {
      EXPECT_TRUE(flags.insert(s.flags).second) << s.flags;
      EXPECT_TRUE(*s.help) << s.flags;
    }
    EXPECT_NO_THROW(check_range(s, d, s.key)) << s.key;
    if (std::string(s.key) == "server.port") port = &s;
  }
  EXPECT_TRUE(keys.count("scheduler.prefill_chunk_size") && keys.count("kv_cache.prefix_caching"));
  ASSERT_NE(port, nullptr);
  ServeConfig c;
  c.port = 70000;
  try {
    check_range(*port, c, "--port");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--port must be in [0, 65535], got 70000");
  }
  const std::string file_error = [] {
    ServeConfig x;
    try {
      apply_config_json(json::parse(R"({"server": {"port": 70000}})"), x);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_EQ(file_error, "config: 'server.port' must be in [0, 65535], got 70000");  // the same range
  const EngineConfig e = to_engine_config(d), base;
  EXPECT_EQ(e.scheduler.chunk_size, base.scheduler.chunk_size);
  EXPECT_EQ(e.scheduler.max_num_seqs, base.scheduler.max_num_seqs);
  EXPECT_EQ(e.scheduler.max_batch_tokens, base.scheduler.max_batch_tokens);
  EXPECT_EQ(e.scheduler.max_auto_chunk, base.scheduler.max_auto_chunk);
  EXPECT_DOUBLE_EQ(e.scheduler.step_latency_target_ms, base.scheduler.step_latency_target_ms);
  ServeConfig chunked;  // the largest auto chunk, from the file (below min_chunk: refused)
  apply_config_json(json::parse(R"({"scheduler": {"max_auto_chunk": 256}})"), chunked);
  EXPECT_EQ(to_engine_config(chunked).scheduler.max_auto_chunk, 256);
  EXPECT_THROW(apply_config_json(json::parse(R"({"scheduler": {"max_auto_chunk": 8}})"), chunked), Error);
  EXPECT_EQ(e.runtime.kv_block_size, base.runtime.kv_block_size);
  EXPECT_EQ(e.runtime.kv_type, base.runtime.kv_type);
  EXPECT_EQ(e.kv_memory_bytes, base.kv_memory_bytes);
  EXPECT_EQ(e.prefix_caching, base.prefix_caching);
}

TEST(ServerConfig, SpeculativeDecodingSection) {
  // The issue's complete config: the key alone turns it on, the section says how.
  ServeConfig c;
  apply_config_json(json::parse(R"({"scheduler": {"enable_speculative_decoding": true}, "speculative": {"method": "ngram"}})"), c);
  SpecConfig s = to_engine_config(c).spec;
  EXPECT_EQ(s.method, SpecMethod::Ngram);
  EXPECT_EQ(s.k, SpecConfig{}.k);
  EXPECT_FALSE(s.k_auto);
  apply_config_json(json::parse(R"({"speculative": {"num_speculative_tokens": "auto", "prompt_lookup_min": 2,
                                                    "prompt_lookup_max": 5}})"), c);
  s = to_spec_config(c);
  EXPECT_TRUE(s.k_auto);
  EXPECT_EQ(s.ngram_min, 2);
  EXPECT_EQ(s.ngram_max, 5);
  apply_config_json(json::parse(R"({"speculative": {"method": "draft", "draft_model": "d.gguf", "num_speculative_tokens": 3}})"), c);
  s = to_spec_config(c);
  EXPECT_EQ(s.method, SpecMethod::Draft);
  EXPECT_EQ(s.draft_model, "d.gguf");
  EXPECT_EQ(s.k, 3);
  // Off unless enabled; the section alone configures.
  ServeConfig off;
  apply_config_json(json::parse(R"({"speculative": {"method": "ngram"}})"), off);
  EXPECT_FALSE(to_spec_config(off).enabled());
  auto err = [](const char* text) {
    ServeConfig x;
    try {
      apply_config_json(json::parse(text), x);
      to_spec_config(x);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(R"({"speculative": {"method": "medusa"}})").find("speculative.method"), std::string::npos);
  EXPECT_NE(err(R"({"speculative": {"num_speculative_tokens": 0}})").find("speculative.num_speculative_tokens"), std::string::npos);
  EXPECT_NE(err(R"({"speculative": {"num_speculative_tokens": "many"}})").find("speculative.num_speculative_tokens"), std::string::npos);
  EXPECT_NE(err(R"({"speculative": {"k": 2}})").find("unknown key 'speculative.k'"), std::string::npos);
  EXPECT_NE(err(R"({"scheduler": {"enable_speculative_decoding": true}, "speculative": {"method": "draft"}})")
                .find("draft model"), std::string::npos);
  EXPECT_NE(err(R"({"scheduler": {"enable_speculative_decoding": true}, "speculative": {"prompt_lookup_min": 4, "prompt_lookup_max": 2}})")
                .find("prompt_lookup"), std::string::npos);
}

TEST(ServerConfig, UnknownKeysAndUnbuiltFeaturesAreErrors) {
  auto err = [](const char* text) {
    ServeConfig c;
    try {
      apply_config_json(json::parse(text), c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(R"({"schedular": {}})").find("unknown key 'schedular'"), std::string::npos);
  EXPECT_NE(err(R"({"scheduler": {"chunk": 1}})").find("unknown key 'scheduler.chunk'"), std::string::npos);
  EXPECT_NE(err(R"({"kv_cache": {"memory": 1}})").find("unknown key 'kv_cache.memory'"), std::string::npos);
  EXPECT_EQ(err(R"({"parallel_config": {"tp_size": 2}})"), "no error");  // runs under mpirun (test_mpi)
  EXPECT_NE(err(R"({"parallel_config": {"tp_size": 0}})").find("parallel_config.tp_size"), std::string::npos);
  EXPECT_EQ(err(R"({"parallel_config": {"pp_size": 4}})"), "no error");  // runs under mpirun (test_mpi)
  EXPECT_NE(err(R"({"parallel_config": {"pp_size": 0}})").find("parallel_config.pp_size"), std::string::npos);
  EXPECT_EQ(err(R"({"scheduler": {"max_active_adapters": 4}})"), "no error");  // the issue's example
  EXPECT_NE(err(R"({"scheduler": {"max_active_adapters": -1}})"), "no error");
  EXPECT_NE(err(R"({"parallel_config": {"optimize_for_latency": false}})").find("not supported yet"), std::string::npos);
  EXPECT_NE(err(R"({"scheduler": {"prefill_chunk_size": "big"}})").find("scheduler.prefill_chunk_size"), std::string::npos);
  EXPECT_NE(err(R"({"server": {"port": 70000}})").find("server.port"), std::string::npos);
  EXPECT_NE(err(R"({"server": {"port": "80"}})").find("must be an integer"), std::string::npos);
  EXPECT_NE(err(R"([1])").find("object"), std::string::npos);
  // LoRA adapters: a top-level list of {"name", "path"}; --lora NAME=FILE.
  ServeConfig c;
  apply_config_json(json::parse(R"({"adapters": [{"name": "sql", "path": "a.gguf"}, {"name": "x", "path": "b.gguf"}],
                                    "scheduler": {"max_active_adapters": 2}})"), c);
  EXPECT_EQ(c.adapters, (std::vector<std::pair<std::string, std::string>>{{"sql", "a.gguf"}, {"x", "b.gguf"}}));
  EXPECT_EQ(to_engine_config(c).scheduler.max_active_adapters, 2);
  EXPECT_NE(err(R"({"adapters": {"name": "a"}})").find("must be an array"), std::string::npos);
  EXPECT_NE(err(R"({"adapters": [{"name": "a"}]})").find("'adapters[0]' needs \"name\" and \"path\""), std::string::npos);
  EXPECT_NE(err(R"({"adapters": [{"name": "a", "path": "p", "rank": 4}]})").find("unknown key 'adapters[0].rank'"),
            std::string::npos);
  EXPECT_EQ(parse_lora_flag("sql=/m/a.gguf"), (std::pair<std::string, std::string>{"sql", "/m/a.gguf"}));
  EXPECT_THROW(parse_lora_flag("a.gguf"), Error);
  EXPECT_THROW(parse_lora_flag("=a.gguf"), Error);
}

// "model" may name a loaded LoRA adapter (ModelInfo::has_adapter); anything else is a 404.
TEST(Api, ModelMayNameALoadedAdapter) {
  ModelInfo info = kModel;
  info.has_adapter = [](const std::string& n) { return n == "sql"; };
  const auto r = parse_request(Endpoint::Completions, R"({"model": "sql", "prompt": "x"})", info);
  EXPECT_EQ(r.model, "sql");
  try {
    parse_request(Endpoint::Completions, R"({"model": "other", "prompt": "x"})", info);
    ADD_FAILURE() << "accepted an unknown model";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 404);
    EXPECT_EQ(e.code, "model_not_found");
  }
  EXPECT_THROW(parse_request(Endpoint::Completions, R"({"model": "sql", "prompt": "x"})", kModel), ApiError);
}


// A model served in process on a free port: one I/O thread, one compute thread, no calibration;
// setup fills in the rest of what `serve` would (a chat template). Stopped when destroyed.
struct InProcessServer {
  InProcessServer(const InProcessServer&) = delete;  // (its threads hold this)
  InProcessServer& operator=(const InProcessServer&) = delete;
  InProcessServer(const std::string& path, const std::string& id, int64_t n_ctx,
                  const std::function<void(ServedModel&)>& setup = {},
                  const std::function<void(ServeConfig&)>& configure = {})
      : model(Model::load(path)), tok(Tokenizer::from_gguf(model->file())) {
    cfg.port = 0;
    cfg.threads = 1;
    cfg.http_threads = 1;
    cfg.context_length = n_ctx;
    cfg.log_level = "warn";
    if (configure) configure(cfg);
    served.model = model.get();
    served.tokenizer = &tok;
    served.id = id;
    if (setup) setup(served);
    EngineConfig ecfg = to_engine_config(cfg);
    ecfg.calibrate = false;
    engine = std::make_unique<Engine>(*model, ecfg, [this](int32_t t) { return tok.is_eog(t); });
    srv = std::make_unique<Server>(*engine, served, cfg);
    run = std::thread([this] { srv->run(); });
    for (int i = 0; i < 500 && srv->port() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_NE(srv->port(), 0);
  }
  ~InProcessServer() {
    srv->stop();
    run.join();
  }
  int port() const { return srv->port(); }

  std::unique_ptr<Model> model;
  Tokenizer tok;
  ServeConfig cfg;
  ServedModel served;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Server> srv;
  std::thread run;
};

// Holds the engine thread inside a step (a request whose first token's callback waits) until
// release(), or its destruction: declared after the server, the engine is let go on every way
// out before the server stops it.
class EngineHold {
 public:
  explicit EngineHold(Engine& e) : state_(std::make_shared<State>()), held_(state_->held.get_future()) {
    EngineRequest r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 2;
    r.ignore_eos = true;
    e.submit(std::move(r), [s = state_, go = state_->release.get_future().share()](const EngineEvent& ev) {
      if (ev.kind == EngineEvent::Kind::Token && s->first.exchange(false)) {
        s->held.set_value();
        go.wait();  // (the engine thread, inside its step)
      }
    });
  }
  EngineHold(const EngineHold&) = delete;
  EngineHold& operator=(const EngineHold&) = delete;
  ~EngineHold() { release(); }
  bool held() { return held_.wait_for(std::chrono::seconds(60)) == std::future_status::ready; }
  void release() {
    if (!std::exchange(released_, true)) state_->release.set_value();
  }

 private:
  struct State {
    std::promise<void> held, release;
    std::atomic<bool> first{true};
  };
  std::shared_ptr<State> state_;
  std::future<void> held_;
  bool released_ = false;
};

// POST /v1/load_lora_adapter waits for the engine thread (which takes the forward's LoRA scratch
// between steps), and that wait is off the I/O threads: with one I/O thread and the engine held
// inside a step (a request's event callback blocking), the load stays pending while the same
// thread answers /v1/models; released, the load answers 200 and the adapter is listed.
TEST(ServerLora, ALoadNeverHoldsAnIoThread) {
  using namespace std::chrono_literals;
  test::TempFile base{"lora_io_base.gguf"}, adapter{"lora_io_adapter.gguf"};
  write_synthetic_model(SyntheticOptions{}, base.path());
  SyntheticLoraOptions lo;
  lo.rank = 4;
  write_synthetic_lora(base.path(), lo, adapter.path());
  InProcessServer srv(base.path(), "base", 256);
  EngineHold hold(*srv.engine);
  ASSERT_TRUE(hold.held());

  std::atomic<bool> sent{false}, loaded{false};
  std::string load_reply;
  std::thread loader([&] {
    load_reply = test::http_request(srv.port(), "POST", "/v1/load_lora_adapter",
                                    json{{"lora_name", "sql"}, {"lora_path", adapter.path()}}.dump(), 60.0,
                                    [&sent] { sent = true; });
    loaded = true;
  });
  for (int i = 0; i < 1000 && !sent.load(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(sent.load());
  // A second of questions while the load waits: each answered by the one I/O thread.
  for (int i = 0; i < 10; ++i) {
    const std::string m = test::http_request(srv.port(), "GET", "/v1/models", "", 5.0);
    if (m.find("200 OK") == std::string::npos) {
      ADD_FAILURE() << "request " << i << " while a load waited: '" << m << "'";
      break;
    }
    EXPECT_EQ(m.find("\"sql\""), std::string::npos) << m;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_FALSE(loaded.load()) << "the load did not wait for the engine thread: the test shows nothing";
  hold.release();
  loader.join();
  EXPECT_NE(load_reply.find("200 OK"), std::string::npos) << load_reply;
  EXPECT_NE(test::http_request(srv.port(), "GET", "/v1/models", "", 5.0).find("\"sql\""), std::string::npos);
}

// A grammar whose parses each walk the vocabulary (GrammarMatcher's work limit, lowered here to
// 2^16 on the byte vocabulary; Grammar.MaskCostPerTokenOnLlama3Vocabulary has 1,000 such parses
// at the real limit on a 128K one): refused with a 400 before it is queued when its first step is
// too costly; when only a later step is, that request alone ends with a 400 (or an error event
// once streaming), and the engine serves the next request as before.
TEST(ServerGrammar, TooAmbiguousIsA400AndTheEngineGoesOn) {
  test::TempFile model{"grammar_work.gguf"};
  write_synthetic_model(SyntheticOptions{}, model.path());
  InProcessServer srv(model.path(), "m", 256, [](ServedModel& served) { served.grammar_mask_work = 1 << 16; });
  std::string alts = "a0", rules;
  for (int i = 0; i < 200; ++i) {
    if (i) alts += " | a" + std::to_string(i);
    rules += "\na" + std::to_string(i) + " ::= [^\"]* \"Q" + std::to_string(i) + "\"";
  }
  const auto request = [&](const std::string& grammar, bool stream) {
    return test::http_post(srv.port(), "/v1/completions",
                           json{{"model", "m"}, {"prompt", "Once upon a time"}, {"max_tokens", 4}, {"stream", stream},
                                {"grammar", grammar}}.dump());
  };
  const std::string at_start = request("root ::= " + alts + rules, false);
  EXPECT_NE(at_start.find("400 Bad Request"), std::string::npos) << at_start;
  EXPECT_NE(at_start.find("too ambiguous"), std::string::npos) << at_start;
  EXPECT_NE(at_start.find(R"("param":"grammar")"), std::string::npos) << at_start;
  // "{" first (a cheap start), then the 200 parses.
  const std::string later = request("root ::= \"{\" (" + alts + ")" + rules, false);
  EXPECT_NE(later.find("400 Bad Request"), std::string::npos) << later;
  EXPECT_NE(later.find("too ambiguous"), std::string::npos) << later;
  const std::string streamed = request("root ::= \"{\" (" + alts + ")" + rules, true);
  EXPECT_NE(streamed.find("200 OK"), std::string::npos) << streamed;
  EXPECT_NE(streamed.find(R"("error":{)"), std::string::npos) << streamed;
  EXPECT_NE(streamed.find("too ambiguous"), std::string::npos) << streamed;
  const std::string fine = request("root ::= \"{\" [a-z]* \"}\"", false);
  EXPECT_NE(fine.find("200 OK"), std::string::npos) << fine;
  EXPECT_NE(fine.find(R"("text":"{)"), std::string::npos) << fine;
}

// /tokenize with its tokens' texts (with_pieces, return_token_strs) answers at most 16 x
// max_body_bytes, written as it is built: beyond, a 400 naming the limit (a 4 MB prompt of
// one-byte tokens answered 103 MB, through a JSON tree of 2.2 GB). Here the body limit is 64 KiB
// (the answer's: 1 MiB) on a byte vocabulary; a prompt of 60,000 tokens is still answered without
// the texts.
TEST(ServerTokenize, PiecesAreBoundedByTheBodyLimit) {
  test::TempFile model{"tokenize_pieces.gguf"};
  write_synthetic_model(SyntheticOptions{}, model.path());
  InProcessServer srv(model.path(), "m", 256, {}, [](ServeConfig& c) { c.max_body_bytes = 64 << 10; });
  const auto body = [](const std::string& response) {
    const size_t at = response.find("\r\n\r\n");
    return at == std::string::npos ? json() : json::parse(response.substr(at + 4), nullptr, false);
  };
  const std::string text = "Hi \"there\"\n\xc3\xa9";  // (quotes, a newline, a two-byte character: escaped or split)
  const std::string small = test::http_post(srv.port(), "/tokenize",
                                            json{{"content", text}, {"with_pieces", true}, {"return_token_strs", true}}.dump());
  ASSERT_NE(small.find("200 OK"), std::string::npos) << small;
  const json j = body(small);
  const std::vector<int32_t> ids = srv.tok.encode(text, srv.tok.add_bos_default(), true);
  ASSERT_EQ(j["count"], ids.size()) << j;
  EXPECT_EQ(j["max_model_len"], 256);
  ASSERT_EQ(j["tokens"].size(), ids.size());
  ASSERT_EQ(j["token_strs"].size(), ids.size());
  const auto as_sent = [](const std::string& s) {  // (a piece of a character: U+FFFD)
    return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace));
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(j["tokens"][i]["id"], ids[i]);
    EXPECT_EQ(j["tokens"][i]["piece"], as_sent(srv.tok.token_to_piece(ids[i])));
    EXPECT_EQ(j["token_strs"][i], as_sent(srv.tok.token_text(ids[i])));
  }
  const std::string plain = test::http_post(srv.port(), "/tokenize", json{{"prompt", text}}.dump());
  EXPECT_EQ(body(plain), (json{{"count", ids.size()}, {"max_model_len", 256}, {"tokens", ids}})) << plain;

  const std::string big(60000, 'a');
  for (const bool strs : {false, true}) {
    const std::string refused =
        test::http_post(srv.port(), "/tokenize", json{{"prompt", big}, {"with_pieces", true}, {"return_token_strs", strs}}.dump());
    EXPECT_NE(refused.find("400 Bad Request"), std::string::npos) << refused.substr(0, 300);
    EXPECT_NE(refused.find("would exceed 1048576 bytes"), std::string::npos) << refused.substr(0, 300);
    EXPECT_NE(refused.find(R"("param":"with_pieces")"), std::string::npos) << refused.substr(0, 300);
  }
  // What fits is answered: the token strings alone (~12 bytes a token), the ids alone.
  const json strs = body(test::http_post(srv.port(), "/tokenize", json{{"prompt", big}, {"return_token_strs", true}}.dump()));
  EXPECT_GE(strs.value("count", 0), 60000) << strs.dump().substr(0, 200);
  EXPECT_EQ(strs["token_strs"].size(), strs["tokens"].size());
  const json counted = body(test::http_post(srv.port(), "/tokenize", json{{"prompt", big}}.dump()));
  EXPECT_GE(counted.value("count", 0), 60000) << counted.dump().substr(0, 200);
}

// Tool calls hold a stream's text until a call ends (a named call's until the generation does):
// the held logprobs count against kMaxLogprobEntries as a held response's (n 32 x 1,900 tokens x
// 21 streamed as one 2.4 MB event a choice before), and a named call's streamed argument chunks
// carry their tokens' logprobs (they never reached the client).
TEST(ServerTools, StreamedCallsCarryTheirLogprobsAndCountAsHeld) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
    "properties": {"a": {"type": "string"}}}}}])");
  json big = {{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_tokens", 1900},
              {"n", 32}, {"stream", true}, {"logprobs", true}, {"top_logprobs", 20}, {"tools", tools}};
  const std::string refused = test::http_post(srv.port(), "/v1/chat/completions", big.dump());
  EXPECT_NE(refused.find("400 Bad Request"), std::string::npos) << refused.substr(0, 400);
  big.erase("tools");  // a plain stream goes out as it is made: not counted
  big["max_tokens"] = 2;
  big["n"] = 1;
  EXPECT_NE(test::http_post(srv.port(), "/v1/chat/completions", big.dump()).find("200 OK"), std::string::npos);
  const json named = {{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_tokens", 6},
                      {"stream", true}, {"logprobs", true}, {"top_logprobs", 1}, {"tools", tools},
                      {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}};
  const std::string out = test::http_post(srv.port(), "/v1/chat/completions", named.dump());
  int calls = 0, with_logprobs = 0;
  for (size_t at = 0; (at = out.find("data: {", at)) != std::string::npos; ++at) {
    const json ev = json::parse(out.substr(at + 6, out.find('\n', at) - at - 6));
    const json& ch = ev["choices"][0];
    if (!ch["delta"].contains("tool_calls")) continue;
    ++calls;
    with_logprobs += ch["logprobs"].is_object() && !ch["logprobs"]["content"].empty();
  }
  EXPECT_GT(calls, 0) << out;
  EXPECT_EQ(with_logprobs, calls) << out;
  // A named call that a stop string cuts is no finished call: "stop", not "tool_calls".
  json cut = named;
  cut["stream"] = false;
  cut["stop"] = {"\""};
  const std::string cut_out = test::http_post(srv.port(), "/v1/chat/completions", cut.dump());
  EXPECT_NE(cut_out.find(R"("finish_reason":"stop")"), std::string::npos) << cut_out;
  EXPECT_EQ(cut_out.find(R"("tool_calls")"), std::string::npos) << "arguments cut short are no call: " << cut_out;
  // Whole (an object with no properties: the grammar's "{}" ends it), a call.
  cut.erase("stop");
  cut["tools"][0]["function"]["parameters"] = json::parse(R"({"type": "object", "properties": {}, "additionalProperties": false})");
  cut["max_tokens"] = 40;
  const std::string whole = test::http_post(srv.port(), "/v1/chat/completions", cut.dump());
  EXPECT_NE(whole.find(R"("finish_reason":"tool_calls")"), std::string::npos) << whole;
}

// Streamed SSE "data: {...}" events of a response, parsed.
std::vector<json> sse_events(const std::string& out) {
  std::vector<json> evs;
  for (size_t at = 0; (at = out.find("data: {", at)) != std::string::npos; ++at)
    evs.push_back(json::parse(out.substr(at + 6, out.find('\n', at) - at - 6)));
  return evs;
}

// The JSON body of a non-streamed response.
json response_body(const std::string& out) {
  const size_t head = out.find("\r\n\r\n");
  return json::parse(head == std::string::npos ? out : out.substr(head + 4), nullptr, false);
}

// The deprecated functions API (`functions`, `function_call`) is answered in its own shape:
// message.function_call and finish_reason "function_call", streamed as function_call deltas (the
// name on the first). It was answered as tool_calls, which its clients do not read.
TEST(ServerTools, LegacyFunctionsAreAnsweredAsFunctionCall) {
  json choice = json::parse(R"({"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "tool_calls"})");
  as_function_call(choice);
  EXPECT_EQ(choice, json::parse(R"({"index": 0, "message": {"role": "assistant", "content": null,
    "function_call": {"name": "f", "arguments": "{}"}}, "finish_reason": "function_call"})"));
  json delta = json::parse(R"({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a"}}]},
    "finish_reason": null})");
  as_function_call(delta);
  EXPECT_EQ(delta, json::parse(R"({"index": 0, "delta": {"function_call": {"arguments": "{\"a"}}, "finish_reason": null})"));

  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  const json functions = json::parse(R"([{"name": "f", "parameters": {"type": "object", "properties": {},
    "additionalProperties": false}}])");
  json req = {{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_tokens", 40},
              {"functions", functions}, {"function_call", {{"name", "f"}}}};
  const json r = response_body(test::http_post(srv.port(), "/v1/chat/completions", req.dump()));
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(r["choices"][0]["finish_reason"], "function_call") << r;
  EXPECT_FALSE(msg.contains("tool_calls")) << r;
  EXPECT_EQ(msg["function_call"]["name"], "f") << r;
  EXPECT_EQ(json::parse(msg["function_call"]["arguments"].get<std::string>()), json::object()) << r;
  req["stream"] = true;
  std::string name, arguments, reason;
  for (const json& ev : sse_events(test::http_post(srv.port(), "/v1/chat/completions", req.dump()))) {
    const json& ch = ev["choices"][0];
    EXPECT_FALSE(ch["delta"].contains("tool_calls")) << ev;
    if (ch["delta"].contains("function_call")) {
      const json& fc = ch["delta"]["function_call"];
      if (fc.contains("name")) name += fc["name"].get<std::string>();
      arguments += fc.value("arguments", "");
    }
    if (ch["finish_reason"].is_string()) reason = ch["finish_reason"];
  }
  EXPECT_EQ(name, "f");
  EXPECT_EQ(json::parse(arguments), json::object());
  EXPECT_EQ(reason, "function_call");
  // The same call through tools: tool_calls, as before.
  req.erase("functions");
  req.erase("function_call");
  req.erase("stream");
  req["tools"] = {{{"type", "function"}, {"function", functions[0]}}};
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "f"}}}};
  const json t = response_body(test::http_post(srv.port(), "/v1/chat/completions", req.dump()));
  EXPECT_EQ(t["choices"][0]["finish_reason"], "tool_calls") << t;
  EXPECT_EQ(t["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f") << t;
}

// parallel_tool_calls false under tool_choice auto: a model that writes two calls gets the first
// one back (OpenAI: at most one), streamed or not; with the flag left out, both.
TEST(ServerTools, ParallelToolCallsFalseKeepsTheFirstCall) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  const std::string two = R"([{"name": "f", "arguments": {"a": "x"}}, {"name": "g", "arguments": {"b": "y"}}])";
  json body = {{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "a"}}}}, {"max_tokens", 400},
               {"tools", json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}},
                                         {"type": "function", "function": {"name": "g", "parameters": {}}}])")},
               {"grammar", "root ::= " + json(two).dump()}};
  const json both = response_body(test::http_post(srv.port(), "/v1/chat/completions", body.dump()));
  ASSERT_EQ(both["choices"][0]["message"]["tool_calls"].size(), 2u) << both;
  body["parallel_tool_calls"] = false;
  const json one = response_body(test::http_post(srv.port(), "/v1/chat/completions", body.dump()));
  ASSERT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u) << one;
  EXPECT_EQ(one["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(one["choices"][0]["finish_reason"], "tool_calls");
  body["stream"] = true;
  size_t calls = 0;
  for (const json& ev : sse_events(test::http_post(srv.port(), "/v1/chat/completions", body.dump())))
    if (ev["choices"].size() && ev["choices"][0]["delta"].contains("tool_calls"))
      for (const json& c : ev["choices"][0]["delta"]["tool_calls"]) {
        ++calls;
        EXPECT_EQ(c["function"]["name"], "f");
      }
  EXPECT_EQ(calls, 1u);
  // The Messages API's disable_parallel_tool_use and the Responses API's flag: one call too.
  const json msgs = {{"model", "stories260K"}, {"max_tokens", 400}, {"messages", {{{"role", "user"}, {"content", "a"}}}},
                     {"tools", json::parse(R"([{"name": "f", "input_schema": {"type": "object"}},
                                               {"name": "g", "input_schema": {"type": "object"}}])")},
                     {"tool_choice", {{"type", "auto"}, {"disable_parallel_tool_use", true}}},
                     {"grammar", body["grammar"]}};
  const json m = response_body(test::http_post(srv.port(), "/v1/messages", msgs.dump()));
  int uses = 0;
  for (const json& b : m["content"]) uses += b["type"] == "tool_use";
  EXPECT_EQ(uses, 1) << m;
  const json resp = {{"model", "stories260K"}, {"input", "a"}, {"max_output_tokens", 400}, {"parallel_tool_calls", false},
                     {"tools", json::parse(R"([{"type": "function", "name": "f", "parameters": {}},
                                               {"type": "function", "name": "g", "parameters": {}}])")},
                     {"grammar", body["grammar"]}};
  const json r = response_body(test::http_post(srv.port(), "/v1/responses", resp.dump()));
  int fcalls = 0;
  for (const json& o : r["output"]) fcalls += o["type"] == "function_call";
  EXPECT_EQ(fcalls, 1) << r;
}

// GET /v1/models/{id}: the id percent-decoded (the Anthropic SDK sends "org%2Fstories"); a
// malformed escape is a 400 that says so.
TEST(ServerRoutes, ModelIdIsPercentDecoded) {
  EXPECT_EQ(percent_decode("org%2Fstories"), "org/stories");
  EXPECT_EQ(percent_decode("a%2fb%20c+d"), "a/b c+d");
  EXPECT_EQ(percent_decode("plain"), "plain");
  EXPECT_EQ(percent_decode(""), "");
  for (const char* bad : {"%", "a%2", "%zz", "a%g1", "%2"}) EXPECT_FALSE(percent_decode(bad)) << bad;
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "org/stories", 2048);
  for (const char* p : {"/v1/models/org%2Fstories", "/v1/models/org%2fstories", "/v1/models/org/stories"}) {
    const std::string out = test::http_request(srv.port(), "GET", p, "");
    EXPECT_NE(out.find("200 OK"), std::string::npos) << p << "\n" << out;
    EXPECT_EQ(response_body(out)["id"], "org/stories") << out;
  }
  const std::string missing = test::http_request(srv.port(), "GET", "/v1/models/other%2Fmodel", "");
  EXPECT_NE(missing.find("404"), std::string::npos) << missing;
  EXPECT_NE(missing.find("'other/model' does not exist"), std::string::npos) << missing;
  const std::string malformed = test::http_request(srv.port(), "GET", "/v1/models/org%2", "");
  EXPECT_NE(malformed.find("400 Bad Request"), std::string::npos) << malformed;
  EXPECT_NE(malformed.find("malformed percent escape"), std::string::npos) << malformed;
}

// A sink whose last on_finish throws (a huge body's bad_alloc, say) wrote no end of its response:
// the generation ends it with on_error, once. It ended with nothing: a client kept waiting on a
// connection that would never answer. An on_error that throws is not made again.
TEST(ServerGeneration, ALastFinishThatThrowsEndsTheResponseWithAnError) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  const auto model = Model::load(path);
  const Tokenizer tok = Tokenizer::from_gguf(model->file());
  Engine engine(*model, single_request_config(*model, 256, 64, 1), [&tok](int32_t t) { return tok.is_eog(t); });
  const GenerationContext ctx(engine, tok, ChatTemplate());
  struct Sink : GenerationSink {
    bool throw_finish = true, throw_error = false;
    int finishes = 0, errors = 0, error_status = 0;
    void on_output(Output&&) override {}
    void on_finish(Output&&, const Finish&) override {
      ++finishes;
      if (throw_finish) throw std::runtime_error("no memory for the body");
    }
    void on_error(const ApiError& e, const Usage&) override {
      ++errors;
      error_status = e.status;
      if (throw_error) throw std::runtime_error("no memory for the error either");
    }
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> inbox;
  const Post post = [&](std::function<void()> f) {
    std::lock_guard<std::mutex> lk(mu);
    inbox.push_back(std::move(f));
    cv.notify_one();
  };
  // Runs what the engine posts until the engine has nothing more for this request.
  const auto drain = [&](const std::shared_ptr<Sink>& sink) {
    const auto busy = [&] {
      const EngineMetrics m = engine.metrics();
      return m.running + m.waiting > 0;
    };
    while (sink->finishes + sink->errors == 0 || !inbox.empty() || busy()) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lk(mu);
        if (!cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return !inbox.empty(); })) continue;
        f = std::move(inbox.front());
        inbox.pop_front();
      }
      f();
    }
  };
  // A generation of 4 tokens into a sink that throws as told, run to its end.
  const auto run = [&](bool throw_finish, bool throw_error) {
    auto sink = std::make_shared<Sink>();
    sink->throw_finish = throw_finish;
    sink->throw_error = throw_error;
    GenerationRequest req;
    req.prompt_text = "Once upon a time";
    req.max_tokens = 4;
    auto gen = Generation::start(ctx, tok, std::move(req), sink, post);
    drain(sink);
    EXPECT_EQ(sink->finishes, 1);
    return sink;
  };
  for (const bool error_throws : {false, true}) {
    const auto sink = run(true, error_throws);
    EXPECT_EQ(sink->errors, 1) << "error_throws " << error_throws;
    EXPECT_EQ(sink->error_status, 500);
  }
  EXPECT_EQ(run(false, false)->errors, 0);  // a last on_finish that returns: the response is whole
}

// Usage reports the prompt tokens the prefix cache served: chat and completions as
// prompt_tokens_details.cached_tokens (streamed: the include_usage chunk too), the Responses API as
// input_tokens_details.cached_tokens. A prompt run again is served from the cache.
TEST(ServerUsage, CachedPromptTokens) {
  EXPECT_EQ(usage_json(Usage{10, 2, 0, 8}),
            json::parse(R"({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                            "prompt_tokens_details": {"cached_tokens": 8}})"));
  EXPECT_FALSE(usage_json(Usage{10, 2}, false).contains("prompt_tokens_details"));
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "Once upon a time there was a little girl. ";
  const json chat = {{"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 2}};
  const json first = response_body(test::http_post(srv.port(), "/v1/chat/completions", chat.dump()));
  ASSERT_TRUE(first["usage"].contains("prompt_tokens_details")) << first;
  const json again = response_body(test::http_post(srv.port(), "/v1/chat/completions", chat.dump()));
  const int64_t cached = again["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, 0) << again;
  EXPECT_LT(cached, again["usage"]["prompt_tokens"].get<int64_t>()) << again;  // (the last token is computed)
  json streamed = chat;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  json usage;
  for (const json& ev : sse_events(test::http_post(srv.port(), "/v1/chat/completions", streamed.dump())))
    if (ev.contains("usage") && ev["usage"].is_object()) usage = ev["usage"];
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], cached) << usage;
  const json cmpl = {{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", 2}};
  test::http_post(srv.port(), "/v1/completions", cmpl.dump());
  const json c = response_body(test::http_post(srv.port(), "/v1/completions", cmpl.dump()));
  EXPECT_GT(c["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0) << c;
  const json resp = {{"model", "stories260K"}, {"input", prompt}, {"max_output_tokens", 2}};
  test::http_post(srv.port(), "/v1/responses", resp.dump());
  const json r = response_body(test::http_post(srv.port(), "/v1/responses", resp.dump()));
  EXPECT_GT(r["usage"]["input_tokens_details"]["cached_tokens"].get<int64_t>(), 0) << r;
  // Cut by max_output_tokens: the response and its message are "incomplete" (OpenAI's).
  EXPECT_EQ(r["status"], "incomplete") << r;
  EXPECT_EQ(r["output"].back()["type"], "message") << r;
  EXPECT_EQ(r["output"].back()["status"], "incomplete") << r;
  // Anthropic's split: input_tokens computed + cache_read_input_tokens served = the prompt, streamed
  // (message_delta's usage, which the SDK's final message takes) or not.
  const json msgs = {{"model", "stories260K"}, {"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", prompt}}}}};
  const json m1 = response_body(test::http_post(srv.port(), "/v1/messages", msgs.dump()));
  const json m2 = response_body(test::http_post(srv.port(), "/v1/messages", msgs.dump()));
  const int64_t m_cached = m2["usage"]["cache_read_input_tokens"];
  EXPECT_GT(m_cached, 0) << m2;
  EXPECT_EQ(m2["usage"]["input_tokens"].get<int64_t>() + m_cached,
            m1["usage"]["input_tokens"].get<int64_t>() + m1["usage"]["cache_read_input_tokens"].get<int64_t>()) << m1 << m2;
  json ms = msgs;
  ms["stream"] = true;
  json delta;
  for (const json& ev : sse_events(test::http_post(srv.port(), "/v1/messages", ms.dump())))
    if (ev.value("type", "") == "message_delta") delta = ev["usage"];
  EXPECT_EQ(delta["cache_read_input_tokens"], m_cached) << delta;
  EXPECT_EQ(delta["input_tokens"], m2["usage"]["input_tokens"]) << delta;
}

// The Responses API's streamed items keep the places they were added at: harmony's final channel
// then an analysis (a grammar forces the markup as text on stories260K) streamed the message at
// output_index 0, the reasoning added at 0 too, its deltas after its done event, and ordered the
// completed output [reasoning, message]. Now: message 0, reasoning 1, in that order everywhere.
TEST(ServerResponses, StreamedItemsKeepTheirPlaces) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048, [](ServedModel& served) {
    served.harmony = true;
    served.reasoning = true;
  });
  const std::string text = "<|channel|>final<|message|>Hi<|end|><|start|>assistant<|channel|>analysis<|message|>think<|end|>";
  json body = {{"model", "stories260K"}, {"input", "x"}, {"max_output_tokens", 200}, {"stream", true},
               {"grammar", "root ::= " + json(text).dump()}};
  const std::string out = test::http_post(srv.port(), "/v1/responses", body.dump());
  std::map<std::string, int64_t> added;  // item id -> output_index
  std::set<std::string> done;
  json completed;
  for (size_t at = 0; (at = out.find("data: {", at)) != std::string::npos; ++at) {
    const json ev = json::parse(out.substr(at + 6, out.find('\n', at) - at - 6));
    const std::string type = ev["type"];
    if (type == "response.output_item.added") added[ev["item"]["id"]] = ev["output_index"];
    if (type == "response.output_item.done") done.insert(ev["item"]["id"].get<std::string>());
    if (ev.contains("item_id")) {
      const std::string id = ev["item_id"];
      ASSERT_TRUE(added.count(id)) << type << " before its item was added\n" << out;
      EXPECT_EQ(ev["output_index"], added[id]) << type << "\n" << out;
      EXPECT_FALSE(done.count(id)) << type << " after its item was done\n" << out;
    }
    if (type == "response.completed") completed = ev["response"];
  }
  ASSERT_EQ(completed["output"].size(), 2u) << out;
  EXPECT_EQ(completed["output"][0]["type"], "message") << out;
  EXPECT_EQ(completed["output"][1]["type"], "reasoning") << out;
  for (const auto& [id, index] : added) EXPECT_EQ(completed["output"][size_t(index)]["id"], id) << out;
}

// Responses are stored when they finish (store: true, OpenAI's default; streamed or not) and read
// back: GET /v1/responses/{id}, its input_items (the conversation before its output, paged) and
// DELETE. previous_response_id continues one: the same prompt and greedy answer as the
// conversation sent whole. store: false, and a response over the byte cap, are not stored and
// say so.
TEST(ServerResponses, StoredChainedListedAndDeleted) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048, {}, [](ServeConfig& c) { c.max_stored_bytes = 32 << 10; });
  const auto post = [&](const json& body) { return response_body(test::http_post(srv.port(), "/v1/responses", body.dump())); };
  const auto get = [&](const std::string& p) { return test::http_request(srv.port(), "GET", p, ""); };
  const json base = {{"model", "stories260K"}, {"max_output_tokens", 8}, {"temperature", 0}};
  json req = base;
  req["input"] = "Once upon a time";
  const json first = post(req);
  EXPECT_EQ(first["store"], true) << first;
  const std::string id = first["id"];
  EXPECT_EQ(id.size(), 5u + 24u) << id;  // resp_ + 24 random hex digits
  const std::string msg_id = first["output"][0]["id"];
  EXPECT_EQ(msg_id.rfind("msg_", 0), 0u) << msg_id;
  EXPECT_EQ(msg_id.find(id.substr(5)), std::string::npos) << msg_id;  // (random: an item id does not read its response)
  const std::string got = get("/v1/responses/" + id);
  EXPECT_NE(got.find("200 OK"), std::string::npos) << got;
  EXPECT_EQ(response_body(got), first);
  // Chained, and the same conversation sent whole (not stored).
  req["previous_response_id"] = id;
  req["input"] = "The end";
  const json second = post(req);
  ASSERT_EQ(second["status"].is_string(), true) << second;
  EXPECT_EQ(second["previous_response_id"], id);
  json whole = base;
  whole["store"] = false;
  whole["input"] = {{{"role", "user"}, {"content", "Once upon a time"}}, first["output"][0], {{"role", "user"}, {"content", "The end"}}};
  const json w = post(whole);
  EXPECT_EQ(w["store"], false) << w;
  EXPECT_EQ(second["usage"]["input_tokens"], w["usage"]["input_tokens"]);
  EXPECT_GT(second["usage"]["input_tokens"].get<int64_t>(), first["usage"]["input_tokens"].get<int64_t>());
  EXPECT_EQ(second["output"][0]["content"][0]["text"], w["output"][0]["content"][0]["text"]);
  EXPECT_NE(get("/v1/responses/" + w["id"].get<std::string>()).find("404 Not Found"), std::string::npos);
  // input_items: the conversation before second's output, the latest first.
  const std::string items_path = "/v1/responses/" + second["id"].get<std::string>() + "/input_items";
  const json items = response_body(get(items_path));
  ASSERT_EQ(items["data"].size(), 3u) << items;
  EXPECT_EQ(items["object"], "list");
  EXPECT_EQ(items["data"][0]["content"][0]["text"], "The end");
  EXPECT_EQ(items["data"][1], first["output"][0]);
  EXPECT_EQ(items["data"][2]["content"][0]["text"], "Once upon a time");
  EXPECT_EQ(items["data"][2]["role"], "user");
  EXPECT_EQ(items["first_id"], items["data"][0]["id"]);
  EXPECT_EQ(items["last_id"], items["data"][2]["id"]);
  EXPECT_EQ(items["has_more"], false);
  std::set<std::string> ids;
  for (const json& it : items["data"]) ids.insert(it["id"].get<std::string>());
  EXPECT_EQ(ids.size(), 3u);  // each its own id
  const json page = response_body(get(items_path + "?limit=1&order=asc"));
  ASSERT_EQ(page["data"].size(), 1u) << page;
  EXPECT_EQ(page["data"][0], items["data"][2]);
  EXPECT_EQ(page["has_more"], true);
  const json rest = response_body(get(items_path + "?order=asc&after=" + page["last_id"].get<std::string>()));
  ASSERT_EQ(rest["data"].size(), 2u) << rest;
  EXPECT_EQ(rest["data"][1], items["data"][0]);
  EXPECT_EQ(rest["has_more"], false);
  for (const char* q : {"?limit=0", "?limit=101", "?limit=x", "?order=up", "?after=nope"})
    EXPECT_NE(get(items_path + q).find("400 Bad Request"), std::string::npos) << q;
  // Streamed: stored too; its events say what was asked, then what happened.
  json streamed = base;
  streamed["input"] = "Once upon a time";
  streamed["stream"] = true;
  json created, completed;
  for (const json& ev : sse_events(test::http_post(srv.port(), "/v1/responses", streamed.dump()))) {
    if (ev["type"] == "response.created") created = ev["response"];
    if (ev["type"] == "response.completed" || ev["type"] == "response.incomplete") completed = ev["response"];
  }
  EXPECT_EQ(created["store"], true);
  EXPECT_EQ(completed["store"], true);
  EXPECT_EQ(response_body(get("/v1/responses/" + completed["id"].get<std::string>())), completed);
  // Over the byte cap (its user echoed): answered, not stored, and says so.
  json big = base;
  big["input"] = "x";
  big["user"] = std::string(40 << 10, 'u');
  const json b = post(big);
  EXPECT_EQ(b["store"], false) << b["status"];
  EXPECT_NE(get("/v1/responses/" + b["id"].get<std::string>()).find("404 Not Found"), std::string::npos);
  // Deleted: OpenAI's answer; then 404, and a chain from it is OpenAI's 400.
  const std::string del = test::http_request(srv.port(), "DELETE", "/v1/responses/" + id, "");
  EXPECT_EQ(response_body(del), json({{"id", id}, {"object", "response"}, {"deleted", true}})) << del;
  const std::string gone = get("/v1/responses/" + id);
  EXPECT_NE(gone.find("404 Not Found"), std::string::npos) << gone;
  EXPECT_EQ(response_body(gone)["error"]["message"], "Response with id '" + id + "' not found.");
  EXPECT_NE(test::http_request(srv.port(), "DELETE", "/v1/responses/" + id, "").find("404 Not Found"), std::string::npos);
  req["previous_response_id"] = second["id"];
  const json broken = response_body(test::http_post(srv.port(), "/v1/responses", req.dump()));
  EXPECT_EQ(broken["error"]["code"], "previous_response_not_found") << broken;
  EXPECT_EQ(broken["error"]["param"], "previous_response_id");
  EXPECT_EQ(broken["error"]["message"], "Previous response with id '" + id + "' not found.");
  const std::string na = test::http_request(srv.port(), "POST", "/v1/responses/" + id, "{}");
  EXPECT_NE(na.find("405"), std::string::npos) << na;
  EXPECT_NE(na.find("Allow: GET, DELETE"), std::string::npos) << na;
}

// background: true (OpenAI's background mode): the request is answered at once with the queued
// response, stored; GET polls it to its end, which is what the same request gives in the
// foreground; POST .../cancel stops one still generating (stored as cancelled; again: the same
// answer), refuses a foreground one; a streamed one whose client leaves after its first delta
// goes on to its end in the store; a pending one cannot be continued yet.
TEST(ServerResponses, InTheBackground) {
  using namespace std::chrono_literals;
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  const auto post = [&](const std::string& p, const json& body) { return response_body(test::http_post(srv.port(), p, body.dump())); };
  const auto get = [&](const std::string& id) { return response_body(test::http_request(srv.port(), "GET", "/v1/responses/" + id, "")); };
  const auto until_done = [&](const std::string& id) {
    json r;
    for (int i = 0; i < 3000; ++i) {
      r = get(id);
      if (r["status"] != "queued" && r["status"] != "in_progress") break;
      std::this_thread::sleep_for(10ms);
    }
    return r;
  };
  const json base = {{"model", "stories260K"}, {"max_output_tokens", 24}, {"temperature", 0}, {"input", "Once upon a time"}};
  const json fg = post("/v1/responses", base);
  ASSERT_EQ(fg["status"].is_string(), true) << fg;
  EXPECT_EQ(fg["background"], false);
  json bg = base;
  bg["background"] = true;
  const json q = post("/v1/responses", bg);
  ASSERT_EQ(q["status"], "queued") << q;
  EXPECT_EQ(q["background"], true);
  EXPECT_EQ(q["store"], true);
  EXPECT_EQ(q["output"], json::array());
  const std::string id = q["id"];
  const json done = until_done(id);
  ASSERT_EQ(done["status"], fg["status"]) << done;
  EXPECT_EQ(done["background"], true);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], fg["output"][0]["content"][0]["text"]) << done;
  EXPECT_EQ(done["usage"]["output_tokens"], fg["usage"]["output_tokens"]);
  EXPECT_EQ(done["usage"]["input_tokens"], fg["usage"]["input_tokens"]);
  EXPECT_EQ(post("/v1/responses/" + id + "/cancel", json::object()), done);  // (ended: as stored)
  json next = base;
  next["previous_response_id"] = id;
  EXPECT_EQ(post("/v1/responses", next)["status"].is_string(), true);  // (continued as any stored one)
  // Refused: a foreground one's cancel, no store, an unknown id.
  const json not_bg = post("/v1/responses/" + fg["id"].get<std::string>() + "/cancel", json::object());
  EXPECT_EQ(not_bg["error"]["param"], "response_id") << not_bg;
  json unstored = bg;
  unstored["store"] = false;
  EXPECT_EQ(post("/v1/responses", unstored)["error"]["param"], "background");
  EXPECT_NE(test::http_post(srv.port(), "/v1/responses/resp_none/cancel", "{}").find("404 Not Found"), std::string::npos);

  // The engine held inside a step: a background response stays queued; it cannot be continued
  // yet; cancelled, it is stored so at once and for good.
  std::optional<EngineHold> hold(std::in_place, *srv.engine);
  ASSERT_TRUE(hold->held());
  json slow = bg;
  slow["max_output_tokens"] = 1000;
  const json q2 = post("/v1/responses", slow);
  ASSERT_EQ(q2["status"], "queued") << q2;
  const std::string id2 = q2["id"];
  EXPECT_EQ(get(id2)["status"], "queued");
  next["previous_response_id"] = id2;
  const json early = post("/v1/responses", next);
  EXPECT_EQ(early["error"]["param"], "previous_response_id") << early;
  const json cancelled = post("/v1/responses/" + id2 + "/cancel", json::object());
  EXPECT_EQ(cancelled["status"], "cancelled") << cancelled;
  EXPECT_EQ(cancelled["id"], id2);
  hold.reset();
  EXPECT_EQ(post("/v1/responses", base)["output"][0]["content"][0]["text"], fg["output"][0]["content"][0]["text"]);
  EXPECT_EQ(get(id2), cancelled);
  EXPECT_EQ(post("/v1/responses/" + id2 + "/cancel", json::object()), cancelled);

  // Cancelled while it generates (2,000 tokens: ~0.1-0.5 s here), or deleted: it stops and
  // stays so; a cancelled one can be continued (its input, no output).
  json running = bg;
  running["max_output_tokens"] = 2000;
  const auto once_running = [&](const std::string& rid) {
    for (int i = 0; i < 2000 && get(rid)["status"] == "queued"; ++i) std::this_thread::sleep_for(1ms);
    return get(rid)["status"];
  };
  const std::string id4 = post("/v1/responses", running)["id"];
  ASSERT_EQ(once_running(id4), "in_progress");
  EXPECT_EQ(post("/v1/responses/" + id4 + "/cancel", json::object())["status"], "cancelled");
  std::this_thread::sleep_for(100ms);  // (tokens of the step in progress still arrive)
  const json stopped = get(id4);
  EXPECT_EQ(stopped["status"], "cancelled") << stopped;
  next["previous_response_id"] = id4;
  EXPECT_EQ(post("/v1/responses", next)["status"].is_string(), true);
  const std::string id5 = post("/v1/responses", running)["id"];
  ASSERT_EQ(once_running(id5), "in_progress");
  EXPECT_EQ(response_body(test::http_request(srv.port(), "DELETE", "/v1/responses/" + id5, ""))["deleted"], true);
  EXPECT_EQ(get(id5)["error"]["message"], "Response with id '" + id5 + "' not found.");

  // Streamed, the client gone after the first delta: the rest (600 tokens, ~0.1 s here in
  // Release, against well under a millisecond to see the client leave) is generated and stored.
  json longer = base;
  longer["max_output_tokens"] = 600;
  const json fg_long = post("/v1/responses", longer);
  json streamed = longer;
  streamed["background"] = true;
  streamed["stream"] = true;
  const std::string part = test::http_request_until(srv.port(), "POST", "/v1/responses", streamed.dump(),
                                                    "response.output_text.delta");
  std::string id3;
  for (const json& ev : sse_events(part.substr(0, part.rfind('\n', part.find("response.output_text.delta")))))
    if (ev["type"] == "response.created") id3 = ev["response"]["id"];
  ASSERT_FALSE(id3.empty()) << part;
  const json after = until_done(id3);
  ASSERT_EQ(after["status"], fg_long["status"]) << after;
  EXPECT_EQ(after["usage"]["output_tokens"], fg_long["usage"]["output_tokens"]);
  EXPECT_EQ(after["output"][0]["content"][0]["text"], fg_long["output"][0]["content"][0]["text"]) << after;

  // Its stream again (GET ?stream=true&starting_after=N): the events after N, numbered on, to its
  // end; the deltas before and after N make its text. Followed while it runs: the same.
  const auto resumed = [&](const std::string& rid, const std::string& head) {
    std::vector<json> evs = sse_events(head);
    EXPECT_FALSE(evs.empty());
    const int64_t n = evs.empty() ? -1 : evs.back()["sequence_number"].get<int64_t>();
    const std::string again =
        test::http_request(srv.port(), "GET", "/v1/responses/" + rid + "?stream=true&starting_after=" + std::to_string(n), "");
    EXPECT_NE(again.find("text/event-stream"), std::string::npos) << again.substr(0, 300);
    std::string text;
    int64_t seq = -1;
    for (const json& ev : evs) {
      EXPECT_EQ(ev["sequence_number"], ++seq);
      if (ev["type"] == "response.output_text.delta") text += ev["delta"].get<std::string>();
    }
    std::string last;
    for (const json& ev : sse_events(again)) {
      EXPECT_EQ(ev["sequence_number"], ++seq) << ev;
      if (ev["type"] == "response.output_text.delta") text += ev["delta"].get<std::string>();
      last = ev["type"];
    }
    EXPECT_EQ(last, "response.incomplete");
    return text;
  };
  const auto up_to_delta = [](const std::string& part) { return part.substr(0, part.rfind('\n', part.find("response.output_text.delta"))); };
  EXPECT_EQ(resumed(id3, up_to_delta(part)), after["output"][0]["content"][0]["text"]);
  json live = streamed;
  live["max_output_tokens"] = 2000;
  const std::string part2 = test::http_request_until(srv.port(), "POST", "/v1/responses", live.dump(), "response.output_text.delta");
  std::string id6;
  for (const json& ev : sse_events(up_to_delta(part2)))
    if (ev["type"] == "response.created") id6 = ev["response"]["id"];
  ASSERT_FALSE(id6.empty()) << part2;
  const std::string text6 = resumed(id6, up_to_delta(part2));
  const json done6 = until_done(id6);
  EXPECT_EQ(text6, done6["output"][0]["content"][0]["text"]);
  EXPECT_EQ(done6["usage"]["output_tokens"], 2000);
  // Followed from before its first token (the engine held: it cannot have ended): every event
  // after the client's last, live, to its end.
  {
    EngineHold hold7(*srv.engine);
    ASSERT_TRUE(hold7.held());
    json held_req = streamed;
    held_req["max_output_tokens"] = 50;
    const std::string head = test::http_request_until(srv.port(), "POST", "/v1/responses", held_req.dump(), "response.in_progress");
    std::string id7;
    for (const json& ev : sse_events(head.substr(0, head.find("event: response.in_progress"))))
      if (ev["type"] == "response.created") id7 = ev["response"]["id"];
    ASSERT_FALSE(id7.empty()) << head;
    EXPECT_EQ(get(id7)["status"], "queued");
    std::string followed;
    std::thread follower([&] {
      followed = test::http_request(srv.port(), "GET", "/v1/responses/" + id7 + "?stream=true&starting_after=1", "", 60);
    });
    std::this_thread::sleep_for(200ms);
    hold7.release();
    follower.join();
    const json done7 = until_done(id7);
    std::string text;
    int64_t seq = 1;
    for (const json& ev : sse_events(followed)) {
      EXPECT_EQ(ev["sequence_number"], ++seq) << ev;
      if (ev["type"] == "response.output_text.delta") text += ev["delta"].get<std::string>();
    }
    EXPECT_GT(seq, 4) << followed;
    EXPECT_EQ(text, done7["output"][0]["content"][0]["text"]);
  }
  // HEAD: the stream's head, no body.
  const std::string head_only = test::http_request(srv.port(), "HEAD", "/v1/responses/" + id3 + "?stream=true", "");
  EXPECT_NE(head_only.find("200 OK"), std::string::npos) << head_only;
  EXPECT_EQ(head_only.find("data:"), std::string::npos) << head_only;
  // Refused: a response not streamed in the background, a malformed starting_after.
  EXPECT_EQ(response_body(test::http_request(srv.port(), "GET", "/v1/responses/" + id + "?stream=true", ""))["error"]["param"],
            "stream");
  EXPECT_EQ(response_body(test::http_request(srv.port(), "GET", "/v1/responses/" + id3 + "?stream=true&starting_after=x", ""))
                ["error"]["param"],
            "starting_after");
}

// A background response whose end is over the store's byte cap alone (a foreground one is
// answered, store: false) is stored failed, saying so; one whose input alone is over it is a 400.
TEST(ServerResponses, InTheBackgroundOverTheByteCap) {
  using namespace std::chrono_literals;
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048, {}, [](ServeConfig& c) { c.max_stored_bytes = 8 << 10; });
  json req = {{"model", "stories260K"}, {"max_output_tokens", 200}, {"temperature", 0}, {"input", "Once upon a time"},
              {"background", true}, {"include", {"message.output_text.logprobs"}}, {"top_logprobs", 5}};
  const json q = response_body(test::http_post(srv.port(), "/v1/responses", req.dump()));
  ASSERT_EQ(q["status"], "queued") << q;
  json r;
  for (int i = 0; i < 3000; ++i) {
    r = response_body(test::http_request(srv.port(), "GET", "/v1/responses/" + q["id"].get<std::string>(), ""));
    if (r["status"] != "queued" && r["status"] != "in_progress") break;
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(r["status"], "failed") << r;
  EXPECT_NE(r["error"]["message"].get<std::string>().find("byte cap"), std::string::npos) << r;
  req["input"] = std::string(9 << 10, 'x');
  const json big = response_body(test::http_post(srv.port(), "/v1/responses", req.dump()));
  EXPECT_EQ(big["error"]["param"], "background") << big;
}

// include: ["message.output_text.logprobs"] (with top_logprobs alternatives) puts each token's
// logprobs on the message's output_text part, as chat's for the same conversation, and on the
// streamed deltas (which add up to them) and done events; top_logprobs alone asks for none.
TEST(ServerResponses, LogprobsOnTheOutputTextAsChats) {
  const auto lp = [](const std::string& body) { return parse_responses_request(body, kModel).logprobs; };
  EXPECT_EQ(lp(R"({"model": "stories260K", "input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 3})"), 3);
  EXPECT_EQ(lp(R"({"model": "stories260K", "input": "x", "include": ["message.output_text.logprobs"]})"), 0);
  EXPECT_EQ(lp(R"({"model": "stories260K", "input": "x", "top_logprobs": 3})"), -1);  // (vLLM's rule)
  EXPECT_EQ(lp(R"({"model": "stories260K", "input": "x", "include": ["reasoning.encrypted_content"]})"), -1);
  for (const char* body : {R"({"model": "stories260K", "input": "x", "include": "message.output_text.logprobs"})",
                           R"({"model": "stories260K", "input": "x", "include": [1]})",
                           R"({"model": "stories260K", "input": "x", "top_logprobs": 21})"})
    EXPECT_THROW(parse_responses_request(body, kModel), ApiError) << body;
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  const json chat = response_body(test::http_post(srv.port(), "/v1/chat/completions", json{
      {"model", "stories260K"}, {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}, {"max_tokens", 10},
      {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}}.dump()));
  const json expected = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(expected.size(), 10u) << chat;
  json req = {{"model", "stories260K"}, {"input", "Once upon a time"}, {"max_output_tokens", 10}, {"temperature", 0},
              {"include", {"message.output_text.logprobs"}}, {"top_logprobs", 2}};
  const json r = response_body(test::http_post(srv.port(), "/v1/responses", req.dump()));
  EXPECT_EQ(r["output"][0]["content"][0]["logprobs"], expected) << r;
  EXPECT_EQ(r["output"][0]["content"][0]["text"], chat["choices"][0]["message"]["content"]);
  req["stream"] = true;
  json deltas = json::array(), done, completed;
  for (const json& ev : sse_events(test::http_post(srv.port(), "/v1/responses", req.dump()))) {
    if (ev["type"] == "response.output_text.delta")
      for (const json& e : ev["logprobs"]) deltas.push_back(e);
    if (ev["type"] == "response.output_text.done") done = ev["logprobs"];
    if (ev["type"] == "response.incomplete" || ev["type"] == "response.completed") completed = ev["response"];
  }
  EXPECT_EQ(deltas, expected);
  EXPECT_EQ(done, expected);
  EXPECT_EQ(completed["output"][0]["content"][0]["logprobs"], expected);
  req.erase("include");  // not asked: none
  req.erase("stream");
  const json plain = response_body(test::http_post(srv.port(), "/v1/responses", req.dump()));
  EXPECT_EQ(plain["output"][0]["content"][0]["logprobs"], json::array()) << plain;
}

// The store's count cap: the oldest response is evicted; continuing it is OpenAI's 400.
TEST(ServerResponses, TheOldestStoredIsEvicted) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048, {}, [](ServeConfig& c) { c.max_stored_responses = 2; });
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    const json r = response_body(test::http_post(srv.port(), "/v1/responses",
        json{{"model", "stories260K"}, {"input", "Once"}, {"max_output_tokens", 2}}.dump()));
    EXPECT_EQ(r["store"], true) << r;
    ids.push_back(r["id"]);
  }
  EXPECT_NE(test::http_request(srv.port(), "GET", "/v1/responses/" + ids[0], "").find("404 Not Found"), std::string::npos);
  for (int i : {1, 2})
    EXPECT_NE(test::http_request(srv.port(), "GET", "/v1/responses/" + ids[size_t(i)], "").find("200 OK"), std::string::npos);
  const json r = response_body(test::http_post(srv.port(), "/v1/responses",
      json{{"model", "stories260K"}, {"input", "x"}, {"max_output_tokens", 2}, {"previous_response_id", ids[0]}}.dump()));
  EXPECT_EQ(r["error"]["code"], "previous_response_not_found") << r;
}

// What one request resolves from the store (its chain and its references) is bounded by a body's
// limit: a 2 KB request naming 30 stored items of 3.4 MB each made an I/O thread parse 100 MB (1-2
// s, both I/O threads busy with 4 of them); the response ids are not in their items' ids (an item id
// read a response: msg_<hex> named resp_<hex>).
TEST(ServerResponses, WhatARequestResolvesFromTheStoreIsBounded) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048, {}, [](ServeConfig& c) { c.max_body_bytes = 64 << 10; });
  // Reasoning before a user turn: stored whole, left out of the prompt.
  const json pad = {{"type", "reasoning"}, {"summary", {{{"type", "summary_text"}, {"text", std::string(40 << 10, 'x')}}}}};
  std::vector<std::string> ids, msgs;
  for (int i = 0; i < 2; ++i) {
    const json r = response_body(test::http_post(srv.port(), "/v1/responses",
        json{{"model", "stories260K"}, {"input", {pad, {{"role", "user"}, {"content", "Once"}}}}, {"max_output_tokens", 2}}.dump()));
    ASSERT_EQ(r["store"], true) << r.dump().substr(0, 300);
    ids.push_back(r["id"]);
    msgs.push_back(r["output"].back()["id"]);
    EXPECT_EQ(msgs.back().find(ids.back().substr(5)), std::string::npos) << msgs.back() << " " << ids.back();
  }
  // One chain (40 KB) is fine, with a small reference too; with the other's reasoning (80 KB), not.
  const json one = {{"model", "stories260K"}, {"input", "x"}, {"max_output_tokens", 2}, {"previous_response_id", ids[0]}};
  EXPECT_NE(test::http_post(srv.port(), "/v1/responses", one.dump()).find("200 OK"), std::string::npos);
  json refs = one;
  refs["input"] = {{{"type", "item_reference"}, {"id", msgs[0]}}, {{"role", "user"}, {"content", "x"}}};
  refs["previous_response_id"] = ids[1];
  EXPECT_NE(test::http_post(srv.port(), "/v1/responses", refs.dump()).find("200 OK"), std::string::npos);
  const json first_in = response_body(test::http_request(srv.port(), "GET", "/v1/responses/" + ids[0] + "/input_items", ""));
  ASSERT_EQ(first_in["data"].size(), 2u) << first_in.dump().substr(0, 300);
  refs["input"][0]["id"] = first_in["data"][1]["id"];  // (desc: the reasoning last)
  const json refused = response_body(test::http_post(srv.port(), "/v1/responses", refs.dump()));
  EXPECT_EQ(refused["error"]["param"], "input[0].id") << refused;
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("65536 bytes"), std::string::npos) << refused;
}

// The Conversations API: a conversation created with items and metadata, its items paged, added,
// read and deleted, its metadata set; responses naming it (plain, streamed, {"id"}) are prompted
// with its items first (the same tokens and answer as the conversation sent whole) and add their
// input and output items to it; refusals; deleted, it is gone.
TEST(ServerConversations, CreatedPagedEditedAndContinued) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  const auto call = [&](const std::string& method, const std::string& p, const json& body = nullptr) {
    return test::http_request(srv.port(), method, p, body.is_null() ? "" : body.dump());
  };
  const auto answer = [&](const std::string& method, const std::string& p, const json& body = nullptr) {
    return response_body(call(method, p, body));
  };
  const json created = answer("POST", "/v1/conversations", {{"metadata", {{"topic", "cats"}}}, {"items", json::parse(R"([
      {"role": "user", "content": "Once upon a time"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "there was a cat"}]},
      {"role": "user", "content": "The cat"}])")}});
  ASSERT_EQ(created["object"], "conversation") << created;
  const std::string id = created["id"];
  EXPECT_EQ(id.rfind("conv_", 0), 0u);
  EXPECT_EQ(id.size(), 5u + 24u);
  EXPECT_EQ(created["metadata"], json({{"topic", "cats"}}));
  EXPECT_TRUE(created["created_at"].is_number_integer());
  EXPECT_EQ(answer("GET", "/v1/conversations/" + id), created);
  const std::string items_path = "/v1/conversations/" + id + "/items";
  const json all = answer("GET", items_path);  // (desc: the latest first)
  ASSERT_EQ(all["data"].size(), 3u) << all;
  EXPECT_EQ(all["object"], "list");
  EXPECT_EQ(all["data"][0]["content"], json::parse(R"([{"type": "input_text", "text": "The cat"}])"));
  EXPECT_EQ(all["data"][2]["content"][0]["text"], "Once upon a time");
  EXPECT_EQ(all["first_id"], all["data"][0]["id"]);
  EXPECT_EQ(all["last_id"], all["data"][2]["id"]);
  EXPECT_EQ(all["has_more"], false);
  const json page = answer("GET", items_path + "?order=asc&limit=2");
  ASSERT_EQ(page["data"].size(), 2u) << page;
  EXPECT_EQ(page["data"][0], all["data"][2]);
  EXPECT_EQ(page["has_more"], true);
  const json rest = answer("GET", items_path + "?order=asc&after=" + page["last_id"].get<std::string>());
  ASSERT_EQ(rest["data"].size(), 1u) << rest;
  EXPECT_EQ(rest["data"][0], all["data"][0]);
  EXPECT_EQ(rest["has_more"], false);
  for (const char* q : {"?limit=0", "?limit=101", "?order=up", "?after=nope"})
    EXPECT_EQ(answer("GET", items_path + q)["error"]["type"], "invalid_request_error") << q;
  // Items added (with ids), read, one deleted (the answer: the conversation).
  const json added = answer("POST", items_path, {{"items", json::parse(R"([{"type": "function_call_output", "call_id": "c1",
      "output": "42"}, {"role": "user", "content": "x"}])")}});
  ASSERT_EQ(added["data"].size(), 2u) << added;
  EXPECT_EQ(added["object"], "list");
  const std::string fco = added["data"][0]["id"];
  EXPECT_EQ(fco.rfind("fco_", 0), 0u);
  EXPECT_EQ(added["first_id"], fco);
  EXPECT_EQ(answer("GET", items_path + "/" + fco), added["data"][0]);
  EXPECT_EQ(answer("GET", items_path)["data"].size(), 5u);
  EXPECT_EQ(answer("DELETE", items_path + "/" + fco), created);
  const std::string gone_item = call("GET", items_path + "/" + fco);
  EXPECT_NE(gone_item.find("404 Not Found"), std::string::npos) << gone_item;
  EXPECT_EQ(response_body(gone_item)["error"]["param"], "item_id");
  EXPECT_NE(call("DELETE", items_path + "/" + fco).find("404 Not Found"), std::string::npos);
  const std::string x_id = added["data"][1]["id"];
  EXPECT_EQ(answer("DELETE", items_path + "/" + x_id)["id"], id);
  json updated = created;
  updated["metadata"] = {{"topic", "dogs"}};
  EXPECT_EQ(answer("POST", "/v1/conversations/" + id, {{"metadata", {{"topic", "dogs"}}}}), updated);
  EXPECT_EQ(answer("GET", "/v1/conversations/" + id), updated);

  // A response naming it: the conversation first, as if sent whole.
  const json base = {{"model", "stories260K"}, {"max_output_tokens", 8}, {"temperature", 0}};
  json req = base;
  req["conversation"] = id;
  req["input"] = "The end";
  const json r = answer("POST", "/v1/responses", req);
  ASSERT_EQ(r["status"].is_string(), true) << r;
  EXPECT_EQ(r["conversation"], json({{"id", id}}));
  json whole = base;
  whole["store"] = false;
  whole["input"] = {all["data"][2], all["data"][1], all["data"][0], {{"role", "user"}, {"content", "The end"}}};
  const json w = answer("POST", "/v1/responses", whole);
  EXPECT_EQ(w["conversation"], nullptr);
  EXPECT_EQ(r["usage"]["input_tokens"], w["usage"]["input_tokens"]);
  EXPECT_EQ(r["output"][0]["content"][0]["text"], w["output"][0]["content"][0]["text"]);
  json after = answer("GET", items_path + "?order=asc");
  ASSERT_EQ(after["data"].size(), 5u) << after;
  EXPECT_EQ(after["data"][3]["content"][0]["text"], "The end");
  EXPECT_EQ(after["data"][3]["role"], "user");
  EXPECT_EQ(after["data"][4], r["output"][0]);
  EXPECT_EQ(answer("GET", "/v1/responses/" + r["id"].get<std::string>() + "/input_items")["data"].size(), 1u);  // (its own)
  // Streamed, not stored, the conversation as {"id"}: its items added too, the next prompt longer.
  json streamed = req;
  streamed["conversation"] = {{"id", id}};
  streamed["stream"] = true;
  streamed["store"] = false;
  streamed["input"] = "Again";
  json completed;
  for (const json& ev : sse_events(call("POST", "/v1/responses", streamed)))
    if (ev["type"] == "response.completed" || ev["type"] == "response.incomplete") completed = ev["response"];
  ASSERT_EQ(completed["conversation"], json({{"id", id}})) << completed;
  EXPECT_GT(completed["usage"]["input_tokens"].get<int64_t>(), r["usage"]["input_tokens"].get<int64_t>());
  after = answer("GET", items_path + "?order=asc");
  ASSERT_EQ(after["data"].size(), 7u) << after;
  EXPECT_EQ(after["data"][5]["content"][0]["text"], "Again");
  EXPECT_EQ(after["data"][6], completed["output"][0]);

  // Refusals.
  const auto refused = [&](const std::string& method, const std::string& p, const json& body, const std::string& param,
                           const char* status = "400 Bad Request") {
    const std::string out = call(method, p, body);
    EXPECT_NE(out.find(status), std::string::npos) << method << " " << p << ": " << out;
    EXPECT_EQ(response_body(out)["error"]["param"], param) << method << " " << p << ": " << out;
  };
  json both = req;
  both["previous_response_id"] = r["id"];
  refused("POST", "/v1/responses", both, "conversation");
  json unknown = req;
  unknown["conversation"] = "conv_none";
  refused("POST", "/v1/responses", unknown, "conversation", "404 Not Found");
  json many = {{"items", json::array()}};
  for (int i = 0; i < 21; ++i) many["items"].push_back({{"role", "user"}, {"content", "x"}});
  refused("POST", "/v1/conversations", many, "items");
  refused("POST", items_path, many, "items");
  json pairs = json::object();
  for (int i = 0; i < 17; ++i) pairs[cat("k", i)] = "v";
  refused("POST", "/v1/conversations", {{"metadata", pairs}}, "metadata");
  refused("POST", "/v1/conversations/" + id, {{"metadata", {{"k", std::string(513, 'v')}}}}, "metadata");
  refused("POST", "/v1/conversations", {{"items", {{{"type", "image_generation_call"}}}}}, "items[0].type");
  refused("POST", "/v1/conversations", {{"title", "x"}}, "title");
  refused("POST", items_path, json::object(), "items");
  refused("POST", items_path, {{"items", {after["data"][0]}}}, "items");  // (an id it holds)
  refused("GET", "/v1/conversations/conv_none", nullptr, "conversation_id", "404 Not Found");
  refused("POST", "/v1/conversations/conv_none/items", {{"items", json::array()}}, "conversation_id", "404 Not Found");
  EXPECT_NE(call("GET", items_path + "/a/b").find("404 Not Found"), std::string::npos);
  EXPECT_NE(call("GET", "/v1/conversations/" + id + "/other").find("404 Not Found"), std::string::npos);
  for (const auto& [method, p, allow] : {std::tuple{"POST", items_path + "/" + x_id, "Allow: GET, DELETE"},
                                        std::tuple{"DELETE", items_path, "Allow: GET, POST"},
                                        std::tuple{"GET", std::string("/v1/conversations"), "Allow: POST"}}) {
    const std::string out = call(method, p, json::object());
    EXPECT_NE(out.find("405"), std::string::npos) << method << " " << p << ": " << out;
    EXPECT_NE(out.find(allow), std::string::npos) << method << " " << p << ": " << out;
  }
  EXPECT_EQ(answer("GET", items_path)["data"].size(), 7u);  // (nothing refused was added)
  // Deleted: OpenAI's answer, then 404 everywhere.
  EXPECT_EQ(answer("DELETE", "/v1/conversations/" + id), json({{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}}));
  const std::string gone = call("GET", "/v1/conversations/" + id);
  EXPECT_NE(gone.find("404 Not Found"), std::string::npos) << gone;
  EXPECT_EQ(response_body(gone)["error"]["message"], "Conversation with id '" + id + "' not found.");
  EXPECT_NE(call("GET", items_path).find("404 Not Found"), std::string::npos);
  EXPECT_NE(call("DELETE", "/v1/conversations/" + id).find("404 Not Found"), std::string::npos);
  refused("POST", "/v1/responses", req, "conversation", "404 Not Found");
  // An empty body creates an empty conversation.
  const json empty = answer("POST", "/v1/conversations");
  EXPECT_EQ(empty["metadata"], json::object()) << empty;
  EXPECT_EQ(answer("GET", "/v1/conversations/" + empty["id"].get<std::string>() + "/items")["data"], json::array());
}

// A background response adds its items to its conversation when it ends (followed to its end
// here: no polling); cancelled, or its conversation deleted while it runs (the engine held), it
// adds nothing, and still ends.
TEST(ServerConversations, BackgroundResponsesAddOnlyWhatEnds) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  // (two I/O threads: a poll is answered while a reply's strand runs)
  InProcessServer srv(path, "stories260K", 2048, {}, [](ServeConfig& c) { c.http_threads = 2; });
  const auto answer = [&](const std::string& method, const std::string& p, const json& body = nullptr) {
    return response_body(test::http_request(srv.port(), method, p, body.is_null() ? "" : body.dump()));
  };
  const auto conversation = [&] {
    return answer("POST", "/v1/conversations", {{"items", {{{"role", "user"}, {"content", "Once upon a time"}}}}})["id"]
        .get<std::string>();
  };
  const auto n_items = [&](const std::string& c) { return answer("GET", "/v1/conversations/" + c + "/items")["data"].size(); };
  const auto request = [](const std::string& c) {
    return json{{"model", "stories260K"}, {"max_output_tokens", 8}, {"temperature", 0}, {"input", "The end"},
                {"conversation", c}, {"background", true}, {"stream", true}};
  };
  // (the stream's head: the request was parsed, its conversation read)
  const auto started = [&](const json& body) {
    const std::string head = test::http_request_until(srv.port(), "POST", "/v1/responses", body.dump(), "response.in_progress");
    for (const json& ev : sse_events(head.substr(0, head.find("event: response.in_progress"))))
      if (ev["type"] == "response.created") return ev["response"]["id"].get<std::string>();
    ADD_FAILURE() << head;
    return std::string();
  };
  const auto follow_to_end = [&](const std::string& rid) {
    std::string last;
    for (const json& ev : sse_events(test::http_request(srv.port(), "GET", "/v1/responses/" + rid + "?stream=true", "", 60)))
      last = ev.value("type", "");
    return last;
  };
  const std::string ended = conversation();
  std::string last;
  for (const json& ev : sse_events(test::http_post(srv.port(), "/v1/responses", request(ended).dump()))) last = ev["type"];
  EXPECT_TRUE(last == "response.completed" || last == "response.incomplete") << last;
  EXPECT_EQ(n_items(ended), 3u);  // its own, the input, the output
  // Polled (not streamed) until it finished: its turn is in its conversation by then.
  const std::string polled = conversation();
  json quiet = request(polled);
  quiet["stream"] = false;
  const std::string rp = answer("POST", "/v1/responses", quiet)["id"];
  json status;
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       std::chrono::steady_clock::now() < until;) {
    status = answer("GET", "/v1/responses/" + rp)["status"];
    if (status != "queued" && status != "in_progress") break;
  }
  EXPECT_EQ("response." + status.get<std::string>(), last);
  EXPECT_EQ(n_items(polled), 3u);
  const std::string cancelled = conversation(), deleted = conversation();
  std::string rc, rd;
  {
    EngineHold hold(*srv.engine);
    ASSERT_TRUE(hold.held());
    rc = started(request(cancelled));
    rd = started(request(deleted));
    EXPECT_EQ(answer("POST", "/v1/responses/" + rc + "/cancel", json::object())["status"], "cancelled");
    EXPECT_EQ(answer("DELETE", "/v1/conversations/" + deleted)["deleted"], true);
  }
  // The stores' gauges in /metrics (-1: absent).
  const auto gauge = [&](const std::string& name) {
    const std::string m = test::http_request(srv.port(), "GET", "/metrics", "");
    const size_t at = m.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(m.substr(at + name.size() + 2));
  };
  const double n_stored = gauge("firsttoken:stored_conversations"), bytes = gauge("firsttoken:stored_conversation_bytes");
  EXPECT_GT(n_stored, 0);
  EXPECT_GT(bytes, 0);
  EXPECT_EQ(follow_to_end(rc), "error");
  EXPECT_EQ(follow_to_end(rd), last);  // (the same prompt as the first: the same end)
  // Nothing added anywhere for the deleted one's turn (nor for the cancelled one's).
  EXPECT_EQ(gauge("firsttoken:stored_conversations"), n_stored);
  EXPECT_EQ(gauge("firsttoken:stored_conversation_bytes"), bytes);
  EXPECT_GT(gauge("firsttoken:stored_responses"), 0);
  EXPECT_EQ(n_items(cancelled), 1u);
  json again = request(cancelled);  // (the cancelled one let its conversation go)
  again["stream"] = false;
  again["background"] = false;
  EXPECT_EQ("response." + answer("POST", "/v1/responses", again)["status"].get<std::string>(), last);
  EXPECT_EQ(n_items(cancelled), 3u);
  EXPECT_EQ(answer("GET", "/v1/conversations/" + deleted)["error"]["param"], "conversation_id");
  EXPECT_EQ("response." + answer("GET", "/v1/responses/" + rd)["status"].get<std::string>(), last);
}

// One response at a time on a conversation (OpenAI's conversation_locked): a second, while the first
// waits on the engine, is refused and adds nothing; once the first ended, the next runs.
TEST(ServerConversations, OneResponseAtATime) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048);
  const auto call = [&](const std::string& method, const std::string& p, const json& body = nullptr) {
    return test::http_request(srv.port(), method, p, body.is_null() ? "" : body.dump());
  };
  const std::string id = response_body(call("POST", "/v1/conversations", {{"items", {{{"role", "user"}, {"content", "Once"}}}}}))["id"];
  const auto n_items = [&] { return response_body(call("GET", "/v1/conversations/" + id + "/items"))["data"].size(); };
  const json req = {{"model", "stories260K"}, {"max_output_tokens", 4}, {"temperature", 0}, {"input", "upon"}, {"conversation", id}};
  json first = req;  // (background and streamed: it runs on while the stream's head is read)
  first["background"] = true;
  first["stream"] = true;
  std::string rid;
  {
    EngineHold hold(*srv.engine);
    ASSERT_TRUE(hold.held());
    const std::string head = test::http_request_until(srv.port(), "POST", "/v1/responses", first.dump(), "response.in_progress");
    for (const json& ev : sse_events(head.substr(0, head.find("event: response.in_progress"))))
      if (ev["type"] == "response.created") rid = ev["response"]["id"];
    ASSERT_FALSE(rid.empty()) << head;
    const std::string second = test::http_request(srv.port(), "POST", "/v1/responses", req.dump(), 10);  // (not to wait on the hold)
    EXPECT_NE(second.find("400 Bad Request"), std::string::npos) << second;
    EXPECT_EQ(response_body(second)["error"], json({{"type", "invalid_request_error"}, {"code", "conversation_locked"},
                                                    {"param", "conversation"},
                                                    {"message", "Another process is currently operating on this "
                                                                "conversation. Please retry in a few seconds."}}));
    // (its items may still be added and read meanwhile)
    EXPECT_EQ(n_items(), 1u);
  }
  std::string last;
  for (const json& ev : sse_events(call("GET", "/v1/responses/" + rid + "?stream=true"))) last = ev.value("type", "");
  EXPECT_TRUE(last == "response.completed" || last == "response.incomplete") << last;
  EXPECT_EQ(n_items(), 3u);  // (the first's turn alone)
  const json third = response_body(call("POST", "/v1/responses", req));
  EXPECT_EQ("response." + third["status"].get<std::string>(), last) << third;
  EXPECT_EQ(n_items(), 5u);
}

// The store off (--max-stored-responses 0): no conversation is created (a 400 that says why), none
// is found. Under the byte cap, the longest unwritten conversation is evicted; one conversation is
// at most a body's limit (what a response reads of it): items, or a response's input, past it refused.
TEST(ServerConversations, TheStoreOffAndItsCaps) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  {
    InProcessServer off(path, "stories260K", 2048, {}, [](ServeConfig& c) { c.max_stored_responses = 0; });
    const std::string out = test::http_post(off.port(), "/v1/conversations", "{}");
    EXPECT_NE(out.find("400 Bad Request"), std::string::npos) << out;
    EXPECT_NE(response_body(out)["error"]["message"].get<std::string>().find("--max-stored-responses 0"), std::string::npos) << out;
    EXPECT_NE(test::http_request(off.port(), "GET", "/v1/conversations/conv_x", "").find("404 Not Found"), std::string::npos);
    EXPECT_NE(test::http_post(off.port(), "/v1/responses", R"({"input": "x", "conversation": "conv_x"})").find("404 Not Found"),
              std::string::npos);
  }
  InProcessServer srv(path, "stories260K", 2048, {}, [](ServeConfig& c) {
    c.max_stored_bytes = 12 << 10;
    c.max_body_bytes = 8 << 10;
  });
  const auto post = [&](const std::string& p, const json& body) { return response_body(test::http_post(srv.port(), p, body.dump())); };
  const auto found = [&](const std::string& id) {
    return test::http_request(srv.port(), "GET", "/v1/conversations/" + id, "").find("200 OK") != std::string::npos;
  };
  // (reasoning before a user turn: stored whole, left out of the prompt)
  const auto pad = [](size_t n) {
    return json{{"type", "reasoning"}, {"summary", {{{"type", "summary_text"}, {"text", std::string(n, 'x')}}}}};
  };
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(post("/v1/conversations", {{"items", {pad(3 << 10)}}})["id"]);
  EXPECT_TRUE(found(ids[0]) && found(ids[1]) && found(ids[2]));
  EXPECT_EQ(post("/v1/conversations/" + ids[0] + "/items", {{"items", {pad(3 << 10)}}})["data"].size(), 1u);
  EXPECT_FALSE(found(ids[1]));  // (the oldest but the one growing: evicted)
  EXPECT_TRUE(found(ids[0]) && found(ids[2]));
  ids.push_back(post("/v1/conversations", {{"items", {pad(3 << 10)}}})["id"]);
  EXPECT_FALSE(found(ids[2]));  // (ids[0] was written since: ids[2] is the longest unwritten)
  EXPECT_TRUE(found(ids[0]) && found(ids[3]));
  // One conversation holds at most a body's limit (8 KB, under the store's 12): what a response
  // reads of it. ids[0] holds 6 KB: 2 KB more items are refused, and so is a response whose own
  // input would take it past (before it runs: nothing added); a smaller turn is added.
  const auto n_items = [&](const std::string& id) {
    return response_body(test::http_request(srv.port(), "GET", "/v1/conversations/" + id + "/items?limit=100", ""))["data"].size();
  };
  for (size_t n : {size_t(6) << 10, size_t(2) << 10}) {
    const json full = post("/v1/conversations/" + ids[0] + "/items", {{"items", {pad(n)}}});
    EXPECT_EQ(full["error"]["param"], "items") << full;
    EXPECT_NE(full["error"]["message"].get<std::string>().find("larger than 8192 bytes"), std::string::npos) << full;
  }
  const json created = post("/v1/conversations", {{"items", {pad(7900)}}});  // (a body under 8 KB, stored over it)
  EXPECT_NE(created["error"]["message"].get<std::string>().find("larger than 8192 bytes"), std::string::npos) << created;
  json turn = {{"model", "stories260K"}, {"max_output_tokens", 2}, {"input", std::string(2 << 10, 'x')}, {"conversation", ids[0]}};
  const json refused = post("/v1/responses", turn);
  EXPECT_EQ(refused["error"]["param"], "input") << refused;
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("larger than 8192 bytes"), std::string::npos) << refused;
  EXPECT_EQ(n_items(ids[0]), 2u);
  turn["input"] = "Once";
  EXPECT_TRUE(post("/v1/responses", turn)["status"].is_string());
  EXPECT_EQ(n_items(ids[0]), 4u);
}

// The tools reach the chat template in the client's key order through every API that takes them
// (a template that raises with its tools as JSON shows what it got): their parameters were sorted.
TEST(ServerTools, TheTemplateSeesToolsInTheClientsOrder) {
  FT_REQUIRE_SHARED(path, "models/stories260K.gguf");
  InProcessServer srv(path, "stories260K", 2048, [](ServedModel& served) {
    std::string warning;
    served.chat = ChatTemplate::from_gguf(
        "{% if tools %}{{ raise_exception(tools | tojson) }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
        "", "", warning);
  });
  const std::string params = R"({"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}})";
  const auto shown = [&](const std::string& route, const std::string& body) {
    const json r = response_body(test::http_post(srv.port(), route, body));
    const std::string text = r.contains("error") ? r["error"].is_object() ? r["error"]["message"].dump() : r["error"].dump() : r.dump();
    return text;
  };
  const std::string chat = shown("/v1/chat/completions", R"({"model": "stories260K", "messages": [{"role": "user", "content": "a"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": )" + params + "}}]}");
  const std::string responses = shown("/v1/responses", R"({"model": "stories260K", "input": "a",
    "tools": [{"type": "function", "name": "f", "parameters": )" + params + "}]}");
  const std::string messages = shown("/v1/messages", R"({"model": "stories260K", "max_tokens": 4,
    "messages": [{"role": "user", "content": "a"}], "tools": [{"name": "f", "input_schema": )" + params + "}]}");
  for (const std::string& out : {chat, responses, messages}) {
    ASSERT_NE(out.find("zeta"), std::string::npos) << out;
    EXPECT_LT(out.find("zeta"), out.find("alpha")) << out;
  }
}

// --- gpt-oss through the server ---------------------------------------------------------------------

// One HTTP request on a fresh connection ("Connection: close"): the whole response's body.
std::string http_post_body(int port, const std::string& path, const std::string& body) {
  const std::string out = test::http_post(port, path, body);
  const size_t head = out.find("\r\n\r\n");
  if (head == std::string::npos) return out;
  std::string raw = out.substr(head + 4), body_out;
  if (out.substr(0, head).find("chunked") == std::string::npos) return raw;
  for (size_t pos = 0;;) {  // de-chunk
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(raw.substr(pos, eol - pos), nullptr, 16);
    if (n == 0) break;
    body_out += raw.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return body_out;
}

// A synthetic model that writes gpt-oss's harmony: a small vocabulary with its control tokens
// (<|channel|> and <|message|> twice each, so that the second message's header can lead elsewhere
// than the first's), and weights that make each token of a chain predict the next one (attention
// and FFN outputs zeroed: each position's state is its own token's one-hot embedding; the output
// rows score the successor). After the prompt's "<|start|>assistant" it writes, greedily:
//   <|channel|>analysis<|message|>Hmm<|start|>assistant<|channel|>commentary to=functions.get_weather
//   <|constrain|>json<|message|>{"city":"Paris"}<|call|>
// and, with logit_bias -100 on "commentary" and on the arguments (their second choices instead):
//   <|channel|>analysis<|message|>Hmm<|start|>assistant<|channel|>final<|message|>Hi<|return|>
// (No <|end|> after the analysis: before the vocabulary's <|return|>/<|call|> rule it would end
// the generation; the parser takes a message's end at the next <|start|> either way.)
class HarmonyServer : public ::testing::Test {
 protected:
  std::map<std::string, int32_t> id;  // token -> id (the second <|channel|>/<|message|> as "CH2"/"MSG2")

  void SetUp() override {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};
    static constexpr char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      tokens.push_back({'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'});
      types.push_back(6);
    }
    auto add = [&](const std::string& name, const std::string& text, int32_t type) {
      id[name] = int32_t(tokens.size());
      tokens.push_back(text);
      types.push_back(type);
    };
    for (const char* w : {"assistant", "system", "user", "developer"}) add(w, w, 4);  // (whole in the prompt)
    for (const char* c : {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"})
      add(c, c, 3);
    add("CH2", "<|channel|>", 3);
    add("MSG2", "<|message|>", 3);
    for (const char* w : {"analysis", "final", "commentary", "Hmm", "Hi", "assist", "ant", "json"}) add(w, w, 1);
    add("to", "\xE2\x96\x81to=functions.get_weather", 1);
    add("sp", "\xE2\x96\x81", 1);
    add("args", R"({"city":"Paris"})", 1);
    GGUFWriter v;
    v.set("general.architecture", GGUFValue::of_str("llama"));
    v.set("tokenizer.ggml.model", GGUFValue::of_str("llama"));
    v.set("tokenizer.ggml.tokens", GGUFValue::of_str_array(tokens));
    v.set("tokenizer.ggml.scores", GGUFValue::of_f32_array(std::vector<float>(tokens.size(), 0.0f)));
    v.set("tokenizer.ggml.token_type", GGUFValue::of_i32_array(types));
    v.set("tokenizer.ggml.bos_token_id", GGUFValue::of_u32(1));
    v.set("tokenizer.ggml.eos_token_id", GGUFValue::of_u32(2));
    v.set("tokenizer.ggml.add_bos_token", GGUFValue::of_bool(false));
    v.set("tokenizer.ggml.add_space_prefix", GGUFValue::of_bool(false));
    v.write(vocab_.path());

    // (from, to, score): the successor of each token of the chain; second choices score half.
    const std::vector<std::tuple<std::string, std::string, float>> chain = {
        {"assistant", "<|channel|>", 40}, {"<|channel|>", "analysis", 40}, {"analysis", "<|message|>", 40},
        {"<|message|>", "Hmm", 40},       {"Hmm", "<|start|>", 40},         {"<|start|>", "assist", 40},
        {"assist", "ant", 40},            {"ant", "CH2", 40},               {"CH2", "commentary", 40},
        {"CH2", "final", 20},             {"commentary", "to", 40},         {"to", "sp", 40},
        {"sp", "<|constrain|>", 40},      {"<|constrain|>", "json", 40},    {"json", "MSG2", 40},
        {"final", "MSG2", 40},            {"MSG2", "args", 40},             {"MSG2", "Hi", 20},
        {"args", "<|call|>", 40},         {"Hi", "<|return|>", 40}};
    std::map<int32_t, int32_t> dim;  // a chain token's embedding dimension
    for (const auto& [from, to, score] : chain) dim.emplace(id.at(from), int32_t(dim.size()));
    SyntheticOptions opt;
    opt.vocab_path = vocab_.path();
    write_synthetic_model(opt, src_.path());
    const auto f = GGUFFile::open(src_.path());
    GGUFWriter w;
    for (const auto& [k, val] : f->metadata()) w.set(k, val);
    for (const GGUFTensorInfo& t : f->tensors()) {
      std::vector<uint8_t> data(t.data, t.data + t.n_bytes);
      ASSERT_EQ(t.type, GGMLType::F32) << t.name;
      float* x = reinterpret_cast<float*>(data.data());
      const size_t n = data.size() / sizeof(float), row = size_t(t.ne[0]);
      if (t.name.ends_with("attn_output.weight") || t.name.ends_with("ffn_down.weight") || t.name == "output.weight")
        std::fill(x, x + n, 0.0f);
      if (t.name == "output_norm.weight") std::fill(x, x + n, 1.0f);
      if (t.name == "token_embd.weight")
        for (const auto& [tok, d] : dim) {
          std::fill(x + size_t(tok) * row, x + size_t(tok + 1) * row, 0.0f);
          x[size_t(tok) * row + size_t(d)] = 1.0f;
        }
      if (t.name == "output.weight")  // the normalized one-hot is sqrt(row) at its dimension
        for (const auto& [from, to, score] : chain)
          x[size_t(id.at(to)) * row + size_t(dim.at(id.at(from)))] = score / std::sqrt(float(row));
      w.add_tensor(t.name, t.type, t.ne, std::move(data));
    }
    w.write(model_path_.path());
  }

  // Serves the model (the built-in gpt-oss format: its template is empty) and runs each request.
  std::vector<std::string> serve(const std::vector<std::pair<std::string, json>>& requests, bool reasoning = true) {
    InProcessServer srv(model_path_.path(), "gpt-oss-tiny", 1024, [reasoning](ServedModel& served) {
      std::string warning;
      served.chat = ChatTemplate::for_model(*served.tokenizer, "", std::nullopt, warning);
      EXPECT_EQ(served.chat.format(), ChatFormat::Harmony);
      served.harmony = served.chat.harmony();  // as `serve` sets them
      served.reasoning = reasoning;
    });
    std::vector<std::string> out;
    for (const auto& [path, body] : requests) out.push_back(http_post_body(srv.port(), path, body.dump()));
    return out;
  }

  json chat(bool stream, bool final_answer) const {
    json j = {{"model", "gpt-oss-tiny"}, {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
              {"temperature", 0}, {"max_tokens", 40}, {"stream", stream},
              {"tools", json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])")}};
    if (final_answer) j["logit_bias"] = {{std::to_string(id.at("commentary")), -100}, {std::to_string(id.at("args")), -100}};
    return j;
  }

  test::TempFile vocab_{"harmony_vocab.gguf"}, src_{"harmony_src.gguf"}, model_path_{"harmony_model.gguf"};
};

// Chat completions: the analysis channel is reasoning_content, the final channel content, the
// commentary message to=functions.get_weather a tool call; streamed, the same in deltas, and no
// markup in any delta.
TEST_F(HarmonyServer, ChatSplitsReasoningContentAndCalls) {
  const auto r = serve({{"/v1/chat/completions", chat(false, false)},
                        {"/v1/chat/completions", chat(false, true)},
                        {"/v1/chat/completions", chat(true, true)},
                        {"/v1/chat/completions", chat(true, false)},
                        {"/v1/responses", {{"model", "gpt-oss-tiny"}, {"input", "Weather?"}, {"temperature", 0}, {"max_output_tokens", 40},
                                           {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"parameters", json::object()}}}}}}});
  const json call = json::parse(r[0]);
  const json& c0 = call["choices"][0];
  EXPECT_EQ(c0["finish_reason"], "tool_calls") << r[0];
  EXPECT_EQ(c0["message"]["reasoning_content"], "Hmm") << r[0];
  EXPECT_TRUE(c0["message"]["content"].is_null()) << r[0];
  ASSERT_EQ(c0["message"]["tool_calls"].size(), 1u) << r[0];
  EXPECT_EQ(c0["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(c0["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");

  const json answer = json::parse(r[1]);
  const json& c1 = answer["choices"][0];
  EXPECT_EQ(c1["finish_reason"], "stop") << r[1];
  EXPECT_EQ(c1["message"]["reasoning_content"], "Hmm") << r[1];
  EXPECT_EQ(c1["message"]["content"], "Hi") << r[1];
  EXPECT_FALSE(c1["message"].contains("tool_calls")) << r[1];

  // Streamed: the same, piece by piece.
  for (const int k : {2, 3}) {
    std::string reasoning, content, finish;
    json calls = json::array();
    for (size_t pos = 0; (pos = r[size_t(k)].find("data: {", pos)) != std::string::npos;) {
      const size_t end = r[size_t(k)].find("\n\n", pos);
      const json chunk = json::parse(r[size_t(k)].substr(pos + 6, end - pos - 6));
      pos = end;
      if (chunk["choices"].empty()) continue;
      const json& d = chunk["choices"][0]["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content") && d["content"].is_string()) {
        const std::string piece = d["content"].get<std::string>();
        EXPECT_EQ(piece.find("<|"), std::string::npos) << piece;
        content += piece;
      }
      if (d.contains("tool_calls")) calls.insert(calls.end(), d["tool_calls"].begin(), d["tool_calls"].end());
      if (chunk["choices"][0]["finish_reason"].is_string()) finish = chunk["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(reasoning, "Hmm") << r[size_t(k)];
    EXPECT_EQ(content, k == 2 ? "Hi" : "") << r[size_t(k)];
    EXPECT_EQ(finish, k == 2 ? "stop" : "tool_calls") << r[size_t(k)];
    ASSERT_EQ(calls.size(), k == 2 ? 0u : 1u) << r[size_t(k)];
    if (k == 3) {
      EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Paris"})");
    }
  }

  // The Responses API: a reasoning item, then the call.
  const json resp = json::parse(r[4]);
  ASSERT_EQ(resp["output"].size(), 2u) << r[4];
  EXPECT_EQ(resp["output"][0]["type"], "reasoning");
  EXPECT_EQ(resp["output"][0]["content"][0]["text"], "Hmm");
  EXPECT_EQ(resp["output"][1]["type"], "function_call") << r[4];
  EXPECT_EQ(resp["output"][1]["name"], "get_weather");
  EXPECT_EQ(resp["output"][1]["arguments"], R"({"city":"Paris"})");
}

// --reasoning-format none: the raw harmony text is the content (the call still found).
TEST_F(HarmonyServer, ReasoningFormatNoneLeavesTheRawText) {
  const auto r = serve({{"/v1/chat/completions", chat(false, true)}, {"/v1/chat/completions", chat(false, false)}}, false);
  const json answer = json::parse(r[0])["choices"][0];
  EXPECT_EQ(answer["message"]["content"],
            "<|channel|>analysis<|message|>Hmm<|start|>assistant<|channel|>final<|message|>Hi") << r[0];
  EXPECT_FALSE(answer["message"].contains("reasoning_content"));
  const json call = json::parse(r[1])["choices"][0];
  EXPECT_EQ(call["finish_reason"], "tool_calls") << r[1];
  EXPECT_EQ(call["message"]["content"], "<|channel|>analysis<|message|>Hmm") << r[1];
  EXPECT_EQ(call["message"]["tool_calls"][0]["function"]["arguments"], R"({"city":"Paris"})");
}

}  // namespace
}  // namespace ft::server
