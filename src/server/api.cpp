#include "server/api.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <unordered_set>

#include "core/error.h"
#include "core/json_depth.h"
#include "engine/json_schema.h"

namespace ft::server {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

std::string error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  // The message may quote the client's bytes (an HTTP target): invalid UTF-8 is replaced.
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

json parse_json_object(std::string_view body) {
  if (!json_depth_within(body))
    throw ApiError(400, cat("the request body nests arrays and objects more than ", kMaxJsonDepth, " levels deep"));
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

bool get_bool(const json& j, const char* name) {
  const json& v = j.at(name);
  if (!v.is_boolean()) bad(name, cat("'", name, "' must be a boolean"));
  return v.get<bool>();
}

namespace {

// A valid JSON text's structure by bytes (json::parse checked it first): the raw text of values,
// so that a call's arguments come back as the model wrote them (a re-dump sorted their keys and
// turned 123456789012345678901234567890 into 1.2345678901234568e+29), and a request's schemas are
// read in their own key order.
size_t skip_json_ws(std::string_view s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  return i;
}
// The end of the value at s[i] (iterative: nesting costs no stack).
size_t skip_json_value(std::string_view s, size_t i) {
  const auto skip_string = [&](size_t k) {  // s[k] == '"'
    for (++k; k < s.size() && s[k] != '"'; ++k)
      if (s[k] == '\\') ++k;
    return std::min(k + 1, s.size());
  };
  if (i >= s.size()) return i;
  if (s[i] == '"') return skip_string(i);
  if (s[i] == '{' || s[i] == '[') {
    size_t depth = 0;
    while (i < s.size()) {
      const char c = s[i];
      if (c == '"') {
        i = skip_string(i);
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if ((c == '}' || c == ']') && --depth == 0) return i + 1;
      ++i;
    }
    return i;
  }
  while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' &&
         s[i] != '\r')
    ++i;
  return i;
}
// The raw text of each member of the object at s[i] (the last of a repeated key, as json::parse
// keeps it).
std::map<std::string, std::string_view> raw_members(std::string_view s, size_t i) {
  std::map<std::string, std::string_view> out;
  if (i >= s.size() || s[i] != '{') return out;
  i = skip_json_ws(s, i + 1);
  while (i < s.size() && s[i] == '"') {
    const size_t key_end = skip_json_value(s, i);
    const json key = json::parse(s.substr(i, key_end - i), nullptr, false);
    i = skip_json_ws(s, key_end);
    if (i >= s.size() || s[i] != ':') break;
    i = skip_json_ws(s, i + 1);
    const size_t value_end = skip_json_value(s, i);
    if (key.is_string()) out[key.get<std::string>()] = s.substr(i, value_end - i);
    i = skip_json_ws(s, value_end);
    if (i >= s.size() || s[i] != ',') break;
    i = skip_json_ws(s, i + 1);
  }
  return out;
}
}  // namespace

std::vector<std::string_view> raw_elements(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = skip_json_ws(s, 0);
  if (i >= s.size() || s[i] != '[') return out;
  i = skip_json_ws(s, i + 1);
  while (i < s.size() && s[i] != ']') {
    const size_t end = skip_json_value(s, i);
    if (end == i) break;  // (not JSON)
    out.push_back(s.substr(i, end - i));
    i = skip_json_ws(s, end);
    if (i < s.size() && s[i] == ',') i = skip_json_ws(s, i + 1);
  }
  return out;
}

std::string_view raw_at(std::string_view s, std::initializer_list<std::string_view> keys) {
  for (const std::string_view key : keys) {
    const auto members = raw_members(s, skip_json_ws(s, 0));
    const auto it = members.find(std::string(key));
    if (it == members.end()) return {};
    s = it->second;
  }
  return s == "null" ? std::string_view() : s;
}

SchemaTexts schema_texts(std::string_view body) {
  SchemaTexts t;
  t.response_format = raw_at(body, {"response_format", "json_schema", "schema"});
  t.guided_json = raw_at(body, {"guided_json"});
  if (t.guided_json.empty()) t.guided_json = raw_at(body, {"json_schema"});
  for (const std::string_view tool : raw_elements(raw_at(body, {"tools"}))) t.tools.push_back(raw_at(tool, {"function", "parameters"}));
  for (const std::string_view f : raw_elements(raw_at(body, {"functions"}))) t.tools.push_back(raw_at(f, {"parameters"}));
  return t;
}

namespace {

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

std::string get_string(const json& j, const char* name, const std::string& param) {
  const json& v = j.at(name);
  if (!v.is_string()) bad(param, cat("'", param, "' must be a string"));
  return v.get<std::string>();
}

// A set of token ids as a sorted vector (its size at most the vocabulary's, however many repeats).
void sort_unique(std::vector<int32_t>& ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
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

// Where a request field belongs and what it does here. Handled: parsed below. Ignored: valid, but
// meaningless for a local engine (or a vLLM/llama.cpp knob we have no use for): a debug line.
enum : uint8_t { kCmpl = 1, kChat = 2, kBoth = 3 };
enum class Use { Handled, Ignored };
struct Field {
  std::string_view name;
  uint8_t where;
  Use use;
};
constexpr Field kFields[] = {
    // OpenAI, both endpoints.
    {"model", kBoth, Use::Handled}, {"max_tokens", kBoth, Use::Handled}, {"temperature", kBoth, Use::Handled},
    {"top_p", kBoth, Use::Handled}, {"seed", kBoth, Use::Handled}, {"stop", kBoth, Use::Handled},
    {"presence_penalty", kBoth, Use::Handled}, {"frequency_penalty", kBoth, Use::Handled},
    {"stream", kBoth, Use::Handled}, {"stream_options", kBoth, Use::Handled}, {"logprobs", kBoth, Use::Handled},
    {"n", kBoth, Use::Handled}, {"logit_bias", kBoth, Use::Handled}, {"user", kBoth, Use::Ignored},
    // OpenAI completions.
    {"prompt", kCmpl, Use::Handled}, {"echo", kCmpl, Use::Handled}, {"best_of", kCmpl, Use::Handled},
    {"suffix", kCmpl, Use::Handled},
    // OpenAI chat.
    {"messages", kChat, Use::Handled}, {"max_completion_tokens", kChat, Use::Handled},
    {"top_logprobs", kChat, Use::Handled}, {"response_format", kBoth, Use::Handled}, {"tools", kChat, Use::Handled},
    {"tool_choice", kChat, Use::Handled}, {"functions", kChat, Use::Handled}, {"function_call", kChat, Use::Handled},
    {"modalities", kChat, Use::Handled}, {"audio", kChat, Use::Handled}, {"parallel_tool_calls", kChat, Use::Handled},
    {"store", kChat, Use::Ignored}, {"metadata", kChat, Use::Ignored}, {"service_tier", kChat, Use::Ignored},
    {"prompt_cache_key", kChat, Use::Ignored}, {"reasoning_effort", kChat, Use::Handled},
    {"verbosity", kChat, Use::Ignored}, {"safety_identifier", kChat, Use::Ignored}, {"prediction", kChat, Use::Ignored},
    {"web_search_options", kChat, Use::Ignored},
    // vLLM / llama.cpp extensions.
    {"top_k", kBoth, Use::Handled}, {"min_p", kBoth, Use::Handled}, {"repetition_penalty", kBoth, Use::Handled},
    {"repeat_penalty", kBoth, Use::Handled}, {"ignore_eos", kBoth, Use::Handled}, {"min_tokens", kBoth, Use::Handled},
    {"stop_token_ids", kBoth, Use::Handled}, {"n_predict", kBoth, Use::Handled},
    {"allowed_token_ids", kBoth, Use::Handled}, {"bad_words", kBoth, Use::Handled},
    {"add_generation_prompt", kChat, Use::Handled}, {"use_beam_search", kBoth, Use::Handled},
    {"grammar", kBoth, Use::Handled}, {"json_schema", kBoth, Use::Handled}, {"guided_json", kBoth, Use::Handled},
    {"guided_choice", kBoth, Use::Handled}, {"guided_grammar", kBoth, Use::Handled},
    {"guided_decoding_backend", kBoth, Use::Ignored},
    {"echo", kChat, Use::Ignored}, {"skip_special_tokens", kBoth, Use::Handled},
    {"spaces_between_special_tokens", kBoth, Use::Ignored}, {"include_stop_str_in_output", kBoth, Use::Handled},
    {"add_special_tokens", kCmpl, Use::Handled}, {"add_special_tokens", kChat, Use::Ignored}, {"continue_final_message", kChat, Use::Handled},
    {"chat_template_kwargs", kChat, Use::Handled}, {"documents", kChat, Use::Handled},
    {"truncate_prompt_tokens", kBoth, Use::Handled}, {"prompt_logprobs", kBoth, Use::Handled},
    {"priority", kBoth, Use::Handled}, {"ttft_slo_ms", kBoth, Use::Handled}, {"request_id", kBoth, Use::Ignored}, {"length_penalty", kBoth, Use::Ignored},
    {"return_tokens_as_token_ids", kBoth, Use::Handled}, {"return_token_ids", kBoth, Use::Handled}, {"cache_salt", kBoth, Use::Handled},
    {"cache_prompt", kBoth, Use::Ignored}, {"n_probs", kBoth, Use::Ignored}, {"typical_p", kBoth, Use::Handled},
    {"repeat_last_n", kBoth, Use::Handled}, {"penalize_nl", kBoth, Use::Ignored}, {"mirostat", kBoth, Use::Handled},
    {"mirostat_tau", kBoth, Use::Handled}, {"mirostat_eta", kBoth, Use::Handled}, {"samplers", kBoth, Use::Ignored},
    {"dynatemp_range", kBoth, Use::Handled}, {"dynatemp_exponent", kBoth, Use::Handled},
    {"id_slot", kBoth, Use::Ignored}, {"t_max_predict_ms", kBoth, Use::Ignored}, {"n_keep", kBoth, Use::Ignored},
    {"timings_per_token", kBoth, Use::Ignored}, {"return_progress", kBoth, Use::Ignored},
    {"post_sampling_probs", kBoth, Use::Ignored}, {"min_keep", kBoth, Use::Handled},
};

const Field* find_field(std::string_view key, Endpoint kind) {
  const uint8_t bit = kind == Endpoint::Chat ? kChat : kCmpl;
  for (const Field& f : kFields)
    if (f.name == key && (f.where & bit)) return &f;
  return nullptr;
}

}  // namespace

std::string content_text(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return "";
  if (!c.is_array()) bad(param, "'" + param + "' must be a string or an array of content parts");
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string pp = cat(param, "[", i, "]");
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      bad(pp, "'" + pp + "' must be an object with a string 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type == "text" || type == "input_text" || type == "output_text") {
      if (!part.contains("text") || !part["text"].is_string()) bad(pp + ".text", "'" + pp + ".text' must be a string");
      out += part["text"].get<std::string>();
    } else if (type != "refusal") {
      bad(pp + ".type", "content of type '" + type + "' is not supported (this model reads text only)");
    }
  }
  return out;
}

namespace {

// One OpenAI tool call: {"id", "type": "function", "function": {"name", "arguments": JSON text}}
// (arguments given as an object are accepted and serialised).
ToolCall parse_tool_call(const json& t, const std::string& param) {
  if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
    bad(param, "'" + param + "' must be an object with a 'function' object");
  const json& f = t["function"];
  ToolCall c;
  if (t.contains("id") && !t["id"].is_null()) c.id = get_string(t, "id", param + ".id");
  if (!f.contains("name") || !f["name"].is_string()) bad(param + ".function.name", "'" + param + ".function.name' must be a string");
  c.name = f["name"].get<std::string>();
  if (f.contains("arguments") && !f["arguments"].is_null())
    c.arguments = f["arguments"].is_string() ? f["arguments"].get<std::string>() : f["arguments"].dump();
  return c;
}

// A schema as its client wrote it: raw, its text (empty: none), read with its keys in order; else
// (or where raw is not a value of parsed's type: a null that parsing replaced) parsed, keys sorted.
ordered_json ordered_schema(std::string_view raw, const json& parsed) {
  if (!raw.empty() && json_depth_within(raw)) {
    ordered_json o = parse_ordered_json(raw);
    if (!o.is_discarded() && o.type() == parsed.type()) return o;
  }
  return parsed;
}

std::string schema_grammar(const ordered_json& schema, const std::string& param) {
  try {
    return json_schema_to_gbnf(schema);
  } catch (const Error& e) {
    bad(param, e.what());
  } catch (const json::exception& e) {  // (a value of the wrong type the compiler did not check)
    bad(param, cat("json schema: ", e.what()));
  }
}

json tool_parameters(const json& tool) {
  const json& f = tool["function"];
  return f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : json{{"type", "object"}};
}

// The tools as a chat template shows them: each {"type": "function", "function": {"name",
// "description", "parameters", then the rest}} (OpenAI's order), its parameters in the client's
// key order (texts.tools[i]; Hugging Face's templates see the client's JSON as Python dicts).
ordered_json template_tools(const json& tools, const SchemaTexts& texts) {
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& f = tools[i]["function"];
    ordered_json fn = ordered_json::object();
    for (const std::string_view k : {"name", "description", "parameters"})
      if (f.contains(k))
        fn[std::string(k)] = k == "parameters" ? ordered_schema(i < texts.tools.size() ? texts.tools[i] : std::string_view(), f[k])
                                               : ordered_json(f[k]);
    for (const auto& [k, v] : f.items())
      if (!fn.contains(k)) fn[k] = v;
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// The constraint fields of llama.cpp (grammar, json_schema) and vLLM (guided_*): one at most.
void parse_grammar_fields(const json& j, ParsedRequest& r, const SchemaTexts& texts) {
  int n = 0;
  for (const char* k : {"grammar", "json_schema", "guided_json", "guided_choice", "guided_grammar"}) n += j.contains(k);
  if (n > 1) bad("grammar", "give at most one of 'grammar', 'json_schema', 'guided_json', 'guided_choice', 'guided_grammar'");
  if (j.contains("grammar")) r.grammar = get_string(j, "grammar", "grammar");
  if (j.contains("guided_grammar")) r.grammar = get_string(j, "guided_grammar", "guided_grammar");
  for (const char* k : {"json_schema", "guided_json"}) {
    if (!j.contains(k)) continue;
    ordered_json schema;
    if (j[k].is_string()) {  // vLLM takes the schema as JSON text too
      const std::string& text = j[k].get_ref<const std::string&>();
      if (!json_depth_within(text)) bad(k, cat("'", k, "' nests more than ", kMaxJsonDepth, " levels deep"));
      schema = parse_ordered_json(text);
      if (schema.is_discarded()) bad(k, cat("'", k, "' is not valid JSON"));
    } else {
      schema = ordered_schema(texts.guided_json, j[k]);
    }
    r.grammar = schema_grammar(schema, k);
  }
  if (j.contains("guided_choice")) {
    const json& c = j["guided_choice"];
    if (!c.is_array() || c.empty()) bad("guided_choice", "'guided_choice' must be a non-empty array of strings");
    std::vector<std::string> choices;
    for (const json& x : c) {
      if (!x.is_string()) bad("guided_choice", "'guided_choice' must be a non-empty array of strings");
      choices.push_back(x.get<std::string>());
    }
    try {
      r.grammar = choice_grammar(std::move(choices));
    } catch (const Error& e) {
      bad("guided_choice", e.what());
    }
  }
}

// response_format (both endpoints: vLLM takes it on completions too): validated and kept in
// r.response_format unless "text".
void parse_response_format(const json& j, ParsedRequest& r) {
  if (!j.contains("response_format")) return;
  const json& rf = j["response_format"];
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad("response_format", "'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      bad("response_format.json_schema", "'response_format.json_schema' must be an object");
    const json& js = rf["json_schema"];
    if (js.contains("schema") && !js["schema"].is_null() && !js["schema"].is_object() && !js["schema"].is_boolean())
      bad("response_format.json_schema.schema", "'response_format.json_schema.schema' must be an object");
  } else if (type != "text" && type != "json_object") {
    bad("response_format.type", "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '" + type + "'");
  }
  if (type != "text") r.response_format = rf;
}

// The grammar of r.response_format (set).
std::string response_format_grammar(const ParsedRequest& r, const SchemaTexts& texts) {
  const json& rf = r.response_format;
  if (rf["type"] == "json_object") return json_object_gbnf();
  const json& js = rf["json_schema"];
  return schema_grammar(ordered_schema(texts.response_format,
                                       js.contains("schema") && !js["schema"].is_null() ? js["schema"] : json::object()),
                        "response_format.json_schema.schema");
}

// tools and tool_choice (and their deprecated forms functions/function_call), after
// response_format: a forced call's grammar takes precedence over the format's.
void parse_structured(const json& j, ParsedRequest& r, const SchemaTexts& texts) {
  json tools = json::array();
  if (j.contains("tools")) {
    const json& t = j["tools"];
    if (!t.is_array()) bad("tools", "'tools' must be an array");
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string p = cat("tools[", i, "]");
      if (!t[i].is_object() || !t[i].contains("function") || !t[i]["function"].is_object() ||
          !t[i]["function"].contains("name") || !t[i]["function"]["name"].is_string())
        bad(p, "'" + p + "' must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
      if (t[i].contains("type") && t[i]["type"] != "function")
        bad(p + ".type", "only tools of type 'function' are supported");
      tools.push_back(t[i]);
    }
  }
  if (j.contains("functions")) {
    const json& f = j["functions"];
    if (!f.is_array()) bad("functions", "'functions' must be an array");
    for (size_t i = 0; i < f.size(); ++i) {
      if (!f[i].is_object() || !f[i].contains("name") || !f[i]["name"].is_string())
        bad(cat("functions[", i, "]"), "each function must be an object with a string 'name'");
      tools.push_back({{"type", "function"}, {"function", f[i]}});
    }
  }
  if (!tools.empty()) r.tools = template_tools(tools, texts);
  if (j.contains("parallel_tool_calls") && get_bool(j, "parallel_tool_calls") == false) r.parallel_tool_calls = false;
  r.legacy_functions = j.contains("functions") && !j.contains("tools");
  if (r.legacy_functions) r.parallel_tool_calls = false;  // (function_call is one call)
  // OpenAI: "auto" when tools are given, "none" otherwise.
  r.tool_choice = tools.empty() ? ToolChoice::None : ToolChoice::Auto;
  for (const char* key : {"function_call", "tool_choice"}) {
    if (!j.contains(key)) continue;
    const json& c = j[key];
    if (c == "none") {
      r.tool_choice = ToolChoice::None;
    } else if (c == "auto") {
      r.tool_choice = ToolChoice::Auto;
    } else if (c == "required") {
      r.tool_choice = ToolChoice::Required;
    } else if (const bool fn = c.is_object() && c.contains("function") && c["function"].is_object() &&
                               c["function"].contains("name") && c["function"]["name"].is_string();
               fn || (c.is_object() && c.contains("name") && c["name"].is_string())) {
      r.tool_choice = ToolChoice::Named;
      r.tool_name = (fn ? c["function"]["name"] : c["name"]).get<std::string>();  // (the one checked)
    } else {
      bad(key, cat("'", key, "' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}"));
    }
    if (r.tool_choice != ToolChoice::None && tools.empty()) bad(key, cat("'", key, "' requires 'tools'"));
    if (r.tool_choice == ToolChoice::Named) {
      bool found = false;
      for (const json& t : tools) found = found || t["function"]["name"] == r.tool_name;
      if (!found) bad(key, "'" + r.tool_name + "' is not one of the functions in 'tools'");
    }
  }
  // The grammar of a forced call: the named function's arguments, or an array of calls.
  const auto parameters = [&](size_t i) {
    return ordered_schema(i < texts.tools.size() ? texts.tools[i] : std::string_view(), tool_parameters(tools[i]));
  };
  if (r.tool_choice == ToolChoice::Named) {
    for (size_t i = 0; i < tools.size(); ++i)
      if (tools[i]["function"]["name"] == r.tool_name) r.grammar = schema_grammar(parameters(i), "tools");
  } else if (r.tool_choice == ToolChoice::Required) {
    // [{"name", "arguments"}, ...], "name" first.
    std::vector<std::pair<std::string, ordered_json>> calls;
    for (size_t i = 0; i < tools.size(); ++i) calls.emplace_back(tools[i]["function"]["name"].get<std::string>(), parameters(i));
    try {
      r.grammar = tool_calls_gbnf(calls, r.parallel_tool_calls ? -1 : 1);
    } catch (const Error& e) {
      bad("tools", e.what());
    } catch (const json::exception& e) {
      bad("tools", cat("json schema: ", e.what()));
    }
  } else if (!r.response_format.is_null()) {
    r.grammar = response_format_grammar(r, texts);
  }
}

}  // namespace

std::vector<ChatMessage> parse_messages(const json& m, const std::string& param) {
  if (!m.is_array() || m.empty()) bad(param, "'" + param + "' must be a non-empty array");
  std::vector<ChatMessage> out;
  out.reserve(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    const json& msg = m[i];
    const std::string pm = cat(param, "[", i, "]");
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
      bad(pm, "'" + pm + "' must be an object with a string 'role'");
    std::string role = msg["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI: developer messages replace system messages
    if (role == "function") role = "tool";     // the deprecated form of a tool result
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad(pm + ".role", "role '" + role + "' is not supported (system, developer, user, assistant, tool, function)");
    ChatMessage cm;
    cm.role = role;
    if (msg.contains("content")) cm.content = content_text(msg["content"], pm + ".content");
    if (msg.contains("name") && !msg["name"].is_null()) cm.name = get_string(msg, "name", pm + ".name");
    if (role == "tool" && msg.contains("tool_call_id") && !msg["tool_call_id"].is_null())
      cm.tool_call_id = get_string(msg, "tool_call_id", pm + ".tool_call_id");
    if (role == "assistant" && msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      const json& tc = msg["tool_calls"];
      if (!tc.is_array()) bad(pm + ".tool_calls", "'" + pm + ".tool_calls' must be an array");
      for (size_t k = 0; k < tc.size(); ++k) cm.tool_calls.push_back(parse_tool_call(tc[k], cat(pm, ".tool_calls[", k, "]")));
    }
    if (role == "assistant" && msg.contains("function_call") && !msg["function_call"].is_null())
      cm.tool_calls.push_back(parse_tool_call(json{{"function", msg["function_call"]}}, pm + ".function_call"));
    // An earlier answer's reasoning sent back (as we return it; "reasoning" as some clients
    // name it): the template decides what to render of it.
    for (const char* key : {"reasoning_content", "reasoning"})
      if (role == "assistant" && cm.reasoning.empty() && msg.contains(key) && !msg[key].is_null())
        cm.reasoning = get_string(msg, key, cat(pm, ".", key));
    out.push_back(std::move(cm));
  }
  return out;
}

std::string check_model(const json& j, const ModelInfo& model, bool required) {
  if (!j.contains("model") || j["model"].is_null()) {
    if (required) bad("model", "'model' is required");
    return model.id;
  }
  if (!j["model"].is_string()) bad("model", "'model' must be a string");
  const std::string id = model.canonical(j["model"].get<std::string>());
  if (id != model.id && !(model.has_adapter && model.has_adapter(id)))
    throw ApiError(404, "The model '" + id + "' does not exist; this server serves '" + model.id +
                            "' and its LoRA adapters (GET /v1/models)",
                   "model", "invalid_request_error", "model_not_found");
  return id;
}

namespace {
// A completions prompt or an embeddings input p (param names it): a string, token ids, or an
// array of either (the first into prompt_text / prompt_tokens, the rest into more_texts /
// more_tokens).
void parse_prompts(const json& p, const std::string& param, int32_t n_vocab, ParsedRequest& r) {
  const std::string either = cat("'", param, "' must be an array of strings or of token id arrays, not both");
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    r.prompt_tokens = get_token_ids(p, param, n_vocab);
    r.prompt_kind = PromptKind::Tokens;
  } else if (p.is_array() && !p.empty() && p[0].is_string()) {  // prompts: strings
    for (size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_string()) bad(param, either);
      (i == 0 ? r.prompt_text : r.more_texts.emplace_back()) = p[i].get<std::string>();
    }
  } else if (p.is_array() && !p.empty() && p[0].is_array()) {  // prompts: token id arrays
    r.prompt_kind = PromptKind::Tokens;
    for (size_t i = 0; i < p.size(); ++i) {
      const std::string pi = cat(param, "[", i, "]");
      if (!p[i].is_array()) bad(param, either);
      if (i > 0 && p[i].empty()) bad(param, "'" + pi + "' is empty");
      (i == 0 ? r.prompt_tokens : r.more_tokens.emplace_back()) = get_token_ids(p[i], param, n_vocab);
    }
  } else {
    bad(param, cat("'", param, "' must be a string or an array of token ids"));
  }
}

// vLLM's truncate_prompt_tokens: keep the prompt's last k tokens (k >= 1; -1: the context's worth).
void parse_truncate(const json& j, const ModelInfo& model, ParsedRequest& r) {
  if (!j.contains("truncate_prompt_tokens")) return;
  const int64_t k = get_int(j, "truncate_prompt_tokens", -1, model.n_ctx);
  if (k == 0) bad("truncate_prompt_tokens", "'truncate_prompt_tokens' must be >= 1, or -1 for the context's length");
  r.truncate_prompt_tokens = k < 0 ? model.n_ctx : k;
}
}  // namespace

namespace {
// given, else body's own (into own; the body scanned only where j has schemas).
const SchemaTexts* schemas_of(const json& j, std::string_view body, const SchemaTexts* given, SchemaTexts& own) {
  if (given) return given;
  for (const char* k : {"response_format", "json_schema", "guided_json", "tools", "functions"})
    if (j.contains(k)) {
      own = schema_texts(body);
      break;
    }
  return &own;
}
}  // namespace

ParsedRequest parse_request(Endpoint kind, std::string_view body, const ModelInfo& model, const SchemaTexts* schemas) {
  json j = parse_json_object(body);
  ParsedRequest r;
  r.kind = kind;
  r.sampling = kOpenAISampling;

  // An explicit null is the field's absence, everywhere.
  for (auto it = j.begin(); it != j.end();) it = it.value().is_null() ? j.erase(it) : std::next(it);
  for (const auto& [key, v] : j.items()) {
    const Field* f = find_field(key, kind);
    if (!f) r.unknown_fields.push_back(key);
    else if (f->use == Use::Ignored) r.ignored_fields.push_back(key);
  }

  r.model = check_model(j, model, true);

  if (kind == Endpoint::Completions) {
    if (!j.contains("prompt")) bad("prompt", "'prompt' is required");
    parse_prompts(j["prompt"], "prompt", model.n_vocab, r);
    // vLLM's add_special_tokens (completions): false = no BOS before a text prompt.
    if (j.contains("add_special_tokens")) r.add_bos = get_bool(j, "add_special_tokens");
    if (j.contains("suffix")) {  // fill in the middle: prompt_tokens() checks the model can
      r.suffix = get_string(j, "suffix", "suffix");
      if (!r.suffix.empty() && j.contains("echo") && j["echo"] == true) bad("suffix", "'echo' cannot be used with 'suffix'");
    }
  } else {
    r.prompt_kind = PromptKind::Chat;
    if (!j.contains("messages")) bad("messages", "'messages' is required");
    r.messages = parse_messages(j["messages"], "messages");
    if (j.contains("add_generation_prompt")) r.add_generation_prompt = get_bool(j, "add_generation_prompt");
    if (j.contains("continue_final_message") && get_bool(j, "continue_final_message")) {
      if (r.messages.back().role != "assistant")
        bad("continue_final_message", "'continue_final_message' needs the final message to be the assistant's");
      if (j.contains("add_generation_prompt") && r.add_generation_prompt)
        bad("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
      r.continue_final_message = true;
      r.add_generation_prompt = false;
    }
    // vLLM's: variables for the chat template (Llama 3.1's date_string, Qwen3's enable_thinking)
    // and RAG documents (Command R's); a template that does not use them ignores them.
    if (j.contains("chat_template_kwargs")) {
      if (!j["chat_template_kwargs"].is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      for (const auto& [k, v] : j["chat_template_kwargs"].items())
        if (k == "messages" || k == "tools" || k == "add_generation_prompt" || k == "bos_token" || k == "eos_token" || k == "documents")
          bad("chat_template_kwargs", cat("'chat_template_kwargs' cannot set '", k, "' (the request's own field)"));
      r.template_vars = j["chat_template_kwargs"];
    }
    if (j.contains("documents")) {
      if (!j["documents"].is_array()) bad("documents", "'documents' must be an array");
      r.template_vars["documents"] = j["documents"];
    }
    // OpenAI's reasoning_effort reaches the template as reasoning_effort (gpt-oss's reads it, as
    // vLLM passes it), unless chat_template_kwargs sets it; other templates ignore it.
    if (j.contains("reasoning_effort")) {
      if (!j["reasoning_effort"].is_string()) bad("reasoning_effort", "'reasoning_effort' must be a string");
      if (!r.template_vars.contains("reasoning_effort")) r.template_vars["reasoning_effort"] = j["reasoning_effort"];
    }
    if (j.contains("modalities")) {
      const json& m = j["modalities"];
      if (!m.is_array()) bad("modalities", "'modalities' must be an array");
      for (const json& x : m)
        if (x != "text") bad("modalities", "only the 'text' modality is supported");
    }
    if (j.contains("audio")) bad("audio", "audio output is not supported");
  }

  const char* mt = kind == Endpoint::Chat && j.contains("max_completion_tokens") ? "max_completion_tokens"
                   : !j.contains("max_tokens") && j.contains("n_predict")       ? "n_predict"
                                                                                 : "max_tokens";
  // Completions' echo may ask for no tokens (max_tokens 0): the prompt alone, scored with logprobs.
  const bool echo = kind == Endpoint::Completions && j.contains("echo") && j["echo"] == true;
  const bool no_limit = std::string_view(mt) == "n_predict" && j.contains(mt) && j[mt] == -1;  // llama.cpp's: the rest of the context
  if (j.contains(mt) && !no_limit) {
    r.max_tokens = get_int(j, mt, echo ? 0 : 1, model.n_ctx);
    if (*r.max_tokens == 0) {  // the engine computes the prompt's last position anyway: one token, dropped
      r.max_tokens = 1;
      r.echo_only = true;
    }
  } else if (kind == Endpoint::Completions && !no_limit) {
    r.max_tokens = kCompletionsMaxTokens;
    r.fit_max_tokens = true;
  }
  if (j.contains("temperature")) r.sampling.temperature = float(get_number(j, "temperature", 0, 2));
  if (j.contains("top_p")) {
    r.sampling.top_p = float(get_number(j, "top_p", 0, 1));
    if (r.sampling.top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  }
  if (j.contains("top_k")) {
    const int64_t k = get_int(j, "top_k", -1, std::numeric_limits<int32_t>::max());
    r.sampling.top_k = k < 0 ? 0 : int(k);  // -1 = off (vLLM)
  }
  if (j.contains("min_p")) r.sampling.min_p = float(get_number(j, "min_p", 0, 1));
  if (j.contains("presence_penalty")) r.sampling.presence_penalty = float(get_number(j, "presence_penalty", -2, 2));
  if (j.contains("frequency_penalty"))
    r.sampling.frequency_penalty = float(get_number(j, "frequency_penalty", -2, 2));
  for (const char* rp : {"repeat_penalty", "repetition_penalty"}) {  // llama.cpp's name, then vLLM's
    if (!j.contains(rp)) continue;
    r.sampling.repetition_penalty = float(get_number(j, rp, 0, 10));
    if (r.sampling.repetition_penalty <= 0) bad(rp, cat("'", rp, "' must be > 0"));
  }
  // llama.cpp's samplers (engine/sampler.h; the same ranges as its server).
  if (j.contains("typical_p")) {
    r.sampling.typical_p = float(get_number(j, "typical_p", 0, 1));
    if (r.sampling.typical_p <= 0) bad("typical_p", "'typical_p' must be in (0, 1]");
  }
  if (j.contains("repeat_last_n")) r.sampling.penalty_last_n = int(get_int(j, "repeat_last_n", -1, model.n_ctx));
  if (j.contains("mirostat")) r.sampling.mirostat = int(get_int(j, "mirostat", 0, 2));
  if (j.contains("mirostat_tau")) r.sampling.mirostat_tau = float(get_number(j, "mirostat_tau", 0, 100));
  if (j.contains("mirostat_eta")) r.sampling.mirostat_eta = float(get_number(j, "mirostat_eta", 0, 1));
  if (j.contains("dynatemp_range")) r.sampling.dynatemp_range = float(get_number(j, "dynatemp_range", 0, 10));
  if (j.contains("dynatemp_exponent")) r.sampling.dynatemp_exponent = float(get_number(j, "dynatemp_exponent", 0, 100));
  if (j.contains("min_keep")) r.sampling.min_keep = int(get_int(j, "min_keep", 0, model.n_vocab));
  if (j.contains("seed")) {
    r.sampling.seed = uint64_t(get_int(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    r.seed_set = true;
  }
  if (j.contains("ignore_eos")) r.ignore_eos = get_bool(j, "ignore_eos");
  if (j.contains("cache_salt")) {
    r.cache_salt = get_string(j, "cache_salt", "cache_salt");
    if (r.cache_salt.empty()) bad("cache_salt", "'cache_salt' must be a non-empty string");
  }
  if (j.contains("include_stop_str_in_output")) r.include_stop_str = get_bool(j, "include_stop_str_in_output");
  parse_truncate(j, model, r);
  // Scheduling extensions: a TTFT deadline (ms from arrival) and vLLM's priority (lower first).
  if (j.contains("ttft_slo_ms")) {
    r.ttft_slo_ms = get_number(j, "ttft_slo_ms", 0, 1e9);
    if (r.ttft_slo_ms <= 0) bad("ttft_slo_ms", "'ttft_slo_ms' must be > 0");
  }
  if (j.contains("priority")) r.priority = int32_t(get_int(j, "priority", -kPriorityBound, kPriorityBound));
  if (j.contains("min_tokens")) r.min_tokens = get_int(j, "min_tokens", 0, model.n_ctx);
  if (j.contains("stop_token_ids")) {
    if (!j["stop_token_ids"].is_array()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    for (const json& t : j["stop_token_ids"]) {
      if (!t.is_number_integer()) bad("stop_token_ids", "'stop_token_ids' must be an array of token ids");
      r.stop_token_ids.push_back(check_token_id(t.get<int64_t>(), model.n_vocab, "stop_token_ids"));
    }
    sort_unique(r.stop_token_ids);
  }
  // vLLM's allowed_token_ids (only these may be sampled) and bad_words (never generated).
  if (j.contains("allowed_token_ids")) {
    const json& a = j["allowed_token_ids"];
    if (!a.is_array() || a.empty()) bad("allowed_token_ids", "'allowed_token_ids' must be a non-empty array of token ids");
    for (const json& t : a) {
      if (!t.is_number_integer()) bad("allowed_token_ids", "'allowed_token_ids' must be a non-empty array of token ids");
      r.allowed_token_ids.push_back(check_token_id(t.get<int64_t>(), model.n_vocab, "allowed_token_ids"));
    }
    sort_unique(r.allowed_token_ids);
  }
  if (j.contains("bad_words")) {
    const json& w = j["bad_words"];
    if (!w.is_array()) bad("bad_words", "'bad_words' must be an array of strings");
    for (const json& x : w) {
      if (!x.is_string()) bad("bad_words", "'bad_words' must be an array of strings");
      r.bad_words.push_back(x.get<std::string>());
    }
  }
  if (j.contains("stream")) r.stream = get_bool(j, "stream");
  if (j.contains("stream_options")) {
    const json& so = j["stream_options"];
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed when 'stream' is true");
    for (const auto& [k, v] : so.items()) {
      if (v.is_null()) continue;
      if (k == "include_usage") {
        r.include_usage = get_bool(so, "include_usage");
      } else if (k == "continuous_usage_stats") {
        r.continuous_usage = get_bool(so, "continuous_usage_stats");
      } else if (k == "include_obfuscation") {
        get_bool(so, "include_obfuscation");  // no obfuscation padding is ever added
      } else {
        r.unknown_fields.push_back("stream_options." + k);
      }
    }
  }
  if (j.contains("stop")) {
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
  // Completions: logprobs = N (false = off). Chat: logprobs = bool, top_logprobs = N only with
  // logprobs true (OpenAI's rule).
  if (kind == Endpoint::Completions) {
    if (j.contains("logprobs") && !(j["logprobs"].is_boolean() && !j["logprobs"].get<bool>()))
      r.logprobs = int32_t(get_int(j, "logprobs", 0, kMaxLogprobs));
  } else {
    const bool lp = j.contains("logprobs") && get_bool(j, "logprobs");
    if (j.contains("top_logprobs")) {
      const int64_t n = get_int(j, "top_logprobs", 0, kMaxLogprobs);
      if (!lp) bad("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
      r.logprobs = int32_t(n);
    } else if (lp) {
      r.logprobs = 0;
    }
  }
  if (j.contains("logit_bias")) {
    const json& lb = j["logit_bias"];
    if (!lb.is_object()) bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    for (const auto& [k, v] : lb.items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
      if (ec != std::errc() || end != k.data() + k.size())
        bad("logit_bias", "'logit_bias' keys must be token ids, got '" + k + "'");
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -100 || v.get<double>() > 100)
        bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      r.logit_bias.emplace_back(check_token_id(id, model.n_vocab, "logit_bias"), float(v.get<double>()));
    }
    // One value a token: of keys naming one id ("1", "01"), the last in the object's order (its
    // keys', as text), as of a key given twice.
    sort_logit_bias(r.logit_bias);
  }
  if (j.contains("n")) r.n = int32_t(get_int(j, "n", 1, kMaxChoices));
  // best_of (completions; OpenAI's rules): candidates ranked by mean logprob per token, >= n,
  // not streamable. best_of = n is n.
  if (j.contains("best_of")) {
    const int64_t b = get_int(j, "best_of", 1, kMaxChoices);
    if (b < r.n) bad("best_of", cat("'best_of' (", b, ") must be greater than or equal to 'n' (", r.n, ")"));
    if (b > r.n && r.stream) bad("best_of", "'best_of' greater than 'n' cannot be streamed");
    r.best_of = int32_t(b);
  }
  if (j.contains("use_beam_search") && get_bool(j, "use_beam_search")) bad("use_beam_search", "beam search is not supported");
  if (kind == Endpoint::Completions && j.contains("echo")) {
    r.echo = get_bool(j, "echo");
    if (r.echo) r.prompt_logprobs = r.logprobs;  // the prompt's tokens reported as the completion's
  }
  if (j.contains("prompt_logprobs")) {  // vLLM's rules: -1 is the whole vocabulary; > 0 not with stream
    const int32_t n = int32_t(get_int(j, "prompt_logprobs", -1, kMaxLogprobs));
    if (n < 0) bad("prompt_logprobs", cat("'prompt_logprobs' -1 (the whole vocabulary) is not supported; at most ", kMaxLogprobs));
    if (r.stream && n > 0) bad("prompt_logprobs", "'prompt_logprobs' are not available when 'stream' is true");
    if (!r.stream) {
      r.report_prompt_logprobs = n;
      r.prompt_logprobs = std::max(r.prompt_logprobs, n);
    }
  }
  if (j.contains("return_tokens_as_token_ids")) r.tokens_as_ids = get_bool(j, "return_tokens_as_token_ids");
  if (j.contains("return_token_ids")) r.return_token_ids = get_bool(j, "return_token_ids");
  if (j.contains("skip_special_tokens")) r.skip_special_tokens = get_bool(j, "skip_special_tokens");
  if (const size_t prompts = 1 + r.more_texts.size() + r.more_tokens.size(); prompts > 1) {
    if (int64_t(prompts) * std::max(r.n, r.best_of) > kMaxBatchChoices)
      bad("prompt", cat(prompts, " prompts x ", std::max(r.n, r.best_of), " choices each is more than ", kMaxBatchChoices,
                        " choices in one request"));
  }
  SchemaTexts own;
  schemas = schemas_of(j, body, schemas, own);
  parse_grammar_fields(j, r, *schemas);
  parse_response_format(j, r);
  if (!r.response_format.is_null() && !r.grammar.empty())
    bad("response_format", "give 'response_format' or one of 'grammar', 'json_schema', 'guided_json', 'guided_choice', "
                           "'guided_grammar', not both");
  if (kind == Endpoint::Chat) parse_structured(j, r, *schemas);
  else if (!r.response_format.is_null()) r.grammar = response_format_grammar(r, *schemas);
  validate(r, model.n_vocab);
  return r;
}

namespace {

// An input item given by its id alone: {"type": "item_reference", "id"}, or an item of another type
// with nothing but its id (and status), as OpenAI takes it.
bool is_reference(const json& item) {
  if (!item.contains("id")) return false;
  if (item.contains("type") && item["type"] == "item_reference") return true;
  for (const auto& [k, v] : item.items())
    if (k != "type" && k != "id" && k != "status") return false;
  return true;
}

// An input item as its stored response keeps it: typed, with an id (OpenAI's prefix for its type),
// a message's string content as one text part.
json stored_item(json item) {
  if (!item.contains("type")) item["type"] = "message";
  const std::string type = item["type"].is_string() ? item["type"].get<std::string>() : "";
  if (!item.contains("id"))
    item["id"] = new_item_id(type == "message"                ? "msg_"
                             : type == "function_call"        ? "fc_"
                             : type == "function_call_output" ? "fco_"
                             : type == "reasoning"            ? "rs_"
                                                              : "item_");
  if (type == "message" && item.contains("content") && item["content"].is_string())
    item["content"] = json::array({{{"type", item.contains("role") && item["role"] == "assistant" ? "output_text" : "input_text"},
                                    {"text", item["content"]}}});
  return item;
}

// A Responses request's conversation: what it continues (previous_response_id's chain, or its
// conversation's items, from the stores), then its input's items, references resolved from the
// store. own: the input's items as stored (stored_item), when `keep`.
struct ResponsesConversation {
  std::vector<json> items;
  size_t previous = 0;         // items[0, previous) are what it continues
  std::string previous_param;  // ... named: "previous_response_id" or "conversation"
  json own = json::array();
  // A conversation's: held for the request (ConversationStore::claim), and its size (bytes()).
  std::shared_ptr<void> claim;
  uint64_t conversation_bytes = 0;
};

// What one request resolves from the stores (a chain's items, a conversation's, the references'):
// their text at most the response store's max_conversation_bytes, so that a small request cannot
// make an I/O thread parse the whole store.
class Resolved {
 public:
  explicit Resolved(const ResponseStore* store) : limit_(store ? store->max_conversation_bytes() : UINT64_MAX) {}
  void add(uint64_t bytes, const std::string& param) {
    if (bytes > limit_ - total_)  // (total_ <= limit_: no overflow)
      bad(param, cat("the stored items this request names (previous_response_id's chain, its conversation's items "
                     "and item references) come to more than ", limit_, " bytes, a request body's limit"));
    total_ += bytes;
  }

 private:
  const uint64_t limit_;
  uint64_t total_ = 0;
};

// in's items (name: "input", a Responses request's; "items", the Conversations API's) after
// c.items: references resolved from the store, each id once in the conversation (OpenAI's rule;
// so what the references resolve to is at most what the store holds: one stored item named many
// times cannot make a small body any size), kept as stored (stored_item) when keep.
void add_items(const json& in, const std::string& name, const ResponseStore* store, Resolved& resolved, bool keep,
               ResponsesConversation& c) {
  std::unordered_set<std::string> ids;
  for (const json& it : c.items)
    if (it.contains("id") && it["id"].is_string()) ids.insert(it["id"].get<std::string>());
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string p = cat(name, "[", i, "]");
    if (!in[i].is_object()) bad(p, "'" + p + "' must be an object");
    if (in[i].contains("id") && !in[i]["id"].is_string()) bad(p + ".id", "'" + p + ".id' must be a string");
    if (in[i].contains("type") && in[i]["type"] == "item_reference" && !in[i].contains("id"))
      bad(p + ".id", "'" + p + ".id' is required");
    json item;
    if (is_reference(in[i])) {
      const std::string id = in[i]["id"].get<std::string>();
      const std::optional<std::string> text = store ? store->item(id) : std::nullopt;
      if (!text) bad(p + ".id", cat("Item with id '", id, "' not found (", p, ")."));
      resolved.add(text->size(), p + ".id");
      item = json::parse(*text);
      if (in[i].contains("type") && in[i]["type"] != "item_reference" && in[i]["type"] != item["type"])
        bad(p + ".type", cat("the item with id '", id, "' is of type ", item["type"].dump(), ", not ", in[i]["type"].dump()));
    } else {
      item = in[i];
    }
    if (item.contains("id") && !ids.insert(item["id"].get<std::string>()).second)
      bad(p, cat("Duplicate item found with id '", item["id"].get<std::string>(), "': an item is in the conversation "
                 "once (previous_response_id's or the conversation's items are in it already)."));
    if (keep) c.own.push_back(stored_item(item));
    c.items.push_back(std::move(item));
  }
}

ResponsesConversation responses_conversation(const json& j, const ResponseStore* store,
                                             ConversationStore* conversations, bool keep) {
  ResponsesConversation c;
  Resolved resolved(store);
  if (j.contains("previous_response_id")) {
    if (j.contains("conversation"))  // (OpenAI's rule: one or the other)
      bad("conversation", "'previous_response_id' and 'conversation' cannot both be given: a response continues one "
                          "or the other");
    const json& prev = j["previous_response_id"];
    if (!prev.is_string()) bad("previous_response_id", "'previous_response_id' must be a string");
    ResponseStore::Chain chain;
    if (store) chain = store->chain(prev.get<std::string>());
    else chain.missing = prev.get<std::string>();
    if (!chain.missing.empty())  // (OpenAI's answer, naming the link the store no longer holds)
      throw ApiError(400, cat("Previous response with id '", chain.missing, "' not found."), "previous_response_id",
                     "invalid_request_error", "previous_response_not_found");
    for (const auto& link : chain.links)  // (a background response still generating has no output yet)
      if (link->pending)
        bad("previous_response_id", cat("Previous response with id '", link->id, "' has not finished yet: continue it "
                                        "once its status is completed (GET /v1/responses/{id})."));
    const std::vector<const ResponseStore::Item*> items = ResponseStore::items(chain, /*last_output=*/true);
    resolved.add(ResponseStore::text_bytes(items), "previous_response_id");
    c.items = ResponseStore::parse(items);
    c.previous_param = "previous_response_id";
  } else if (j.contains("conversation")) {
    const std::string id = conversation_id(j["conversation"]);
    ConversationStore::Conversation conv;
    switch (conversations ? conversations->claim(id, conv, c.claim) : ConversationStore::Change::kNoConversation) {
      case ConversationStore::Change::kDone:
        break;
      case ConversationStore::Change::kBusy:
        throw conversation_locked();
      default:
        throw conversation_not_found(id, "conversation");
    }
    c.conversation_bytes = conv.bytes();
    const std::vector<const ResponseStore::Item*> items = ConversationStore::items(conv);
    resolved.add(ResponseStore::text_bytes(items), "conversation");
    c.items = ResponseStore::parse(items);
    c.previous_param = "conversation";
  }
  c.previous = c.items.size();
  if (!j.contains("input")) bad("input", "'input' is required");
  const json& in = j["input"];
  if (in.is_string()) {
    c.items.push_back({{"type", "message"}, {"role", "user"}, {"content", in}});
    if (keep) c.own.push_back(stored_item(c.items.back()));
    return c;
  }
  if (!in.is_array()) bad("input", "'input' must be a string or an array of items");
  add_items(in, "input", store, resolved, keep, c);
  return c;
}

// conv's items as chat messages (name: what names its own items, "input" or "items"): a message's
// role and a call's name checked, other types refused (the chat parser checks the rest). origin
// (when not null): each message's item, its index in conv.items (reasoning items make no message;
// calls join the assistant turn before them).
json chat_messages(const ResponsesConversation& conv, const std::string& name, std::vector<size_t>* origin = nullptr) {
  json messages = json::array();
  const auto push = [&](json m, size_t i) {
    messages.push_back(std::move(m));
    if (origin) origin->push_back(i);
  };
  // Reasoning items' text since the last turn: the assistant turn they precede takes it (a user
  // turn or a tool result drops it: reasoning that led to no answer).
  std::string reasoning;
  const auto take_reasoning = [&](json& turn) {
    if (reasoning.empty()) return;
    const std::string had = turn.contains("reasoning_content") ? turn["reasoning_content"].get<std::string>() : "";
    turn["reasoning_content"] = had + (had.empty() ? "" : "\n\n") + reasoning;
    reasoning.clear();
  };
  for (size_t i = 0; i < conv.items.size(); ++i) {
    const json& item = conv.items[i];
    const std::string p = i < conv.previous ? conv.previous_param : cat(name, "[", i - conv.previous, "]");
    if (!item.is_object()) bad(p, "'" + p + "' must be an object");
    const std::string type = item.contains("type") && item["type"].is_string() ? item["type"].get<std::string>() : "message";
    if (type == "message") {
      if (!item.contains("role")) bad(p + ".role", "'" + p + ".role' is required");
      push({{"role", item["role"]}, {"content", item.contains("content") ? item["content"] : json("")}}, i);
      if (item["role"] == "assistant") take_reasoning(messages.back());
      else reasoning.clear();
    } else if (type == "function_call") {
      if (!item.contains("name") || !item["name"].is_string()) bad(p + ".name", "'" + p + ".name' must be a string");
      // (the values as given: the chat parser checks their types)
      const json call = {{"id", item.contains("call_id") ? item["call_id"] : json("")},
                         {"type", "function"},
                         {"function", {{"name", item["name"]}, {"arguments", item.contains("arguments") ? item["arguments"] : json("{}")}}}};
      // Calls after an assistant message (our own output's preamble, or parallel calls): one turn.
      if (!messages.empty() && messages.back()["role"] == "assistant") {
        json& turn = messages.back();
        if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
        turn["tool_calls"].push_back(call);
      } else {
        push({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({call})}}, i);
      }
      take_reasoning(messages.back());
    } else if (type == "function_call_output") {
      const json& out = item.contains("output") ? item["output"] : json("");
      push({{"role", "tool"}, {"tool_call_id", item.contains("call_id") ? item["call_id"] : json("")},
            {"content", out.is_string() || out.is_array() ? out : json(out.dump())}}, i);
      reasoning.clear();
    } else if (type == "reasoning") {  // its text: content's reasoning_text parts, else the summary's
      std::string text;
      for (const char* key : {"content", "summary"}) {
        if (!text.empty() || !item.contains(key) || !item[key].is_array()) continue;
        for (const json& part : item[key])
          if (part.is_object() && part.contains("text") && part["text"].is_string() && !part["text"].get<std::string>().empty())
            text += (text.empty() ? "" : "\n\n") + part["text"].get<std::string>();
      }
      if (!text.empty()) reasoning += (reasoning.empty() ? "" : "\n\n") + text;
    } else {
      bad(p + ".type", "input items of type '" + type + "' are not supported");
    }
  }
  return messages;
}

// A string's characters (UTF-8 code points; an invalid byte counts as one).
size_t utf8_chars(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

constexpr size_t kMaxMetadataPairs = 16, kMaxMetadataKeyChars = 64, kMaxMetadataValueChars = 512;  // OpenAI's

}  // namespace

void check_metadata(const json& m, const std::string& param) {
  if (!m.is_object()) bad(param, cat("'", param, "' must be an object of strings"));
  if (m.size() > kMaxMetadataPairs) bad(param, cat("'", param, "' has ", m.size(), " pairs: at most ", kMaxMetadataPairs));
  for (const auto& [k, v] : m.items()) {
    if (utf8_chars(k) > kMaxMetadataKeyChars)
      bad(param, cat("'", param, "' keys are at most ", kMaxMetadataKeyChars, " characters, got one of ", utf8_chars(k)));
    if (!v.is_string()) bad(param, cat("'", param, ".", k, "' must be a string"));
    if (utf8_chars(v.get_ref<const std::string&>()) > kMaxMetadataValueChars)
      bad(param, cat("'", param, ".", k, "' is ", utf8_chars(v.get_ref<const std::string&>()), " characters: at most ",
                     kMaxMetadataValueChars));
  }
}

std::string conversation_id(const json& c) {
  const json& id = c.is_object() && c.contains("id") ? c["id"] : c;
  if (!id.is_string()) bad("conversation", "'conversation' must be a conversation's id or {\"id\": id}");
  return id.get<std::string>();
}

ApiError conversation_not_found(std::string_view id, const std::string& param) {
  return ApiError(404, cat("Conversation with id '", id, "' not found."), param);
}

ApiError conversation_locked() {
  return ApiError(400, "Another process is currently operating on this conversation. Please retry in a few seconds.",
                  "conversation", "invalid_request_error", "conversation_locked");
}

std::string conversation_over_cap(std::string_view id, uint64_t cap) {
  return cat(id.empty() ? std::string("the conversation") : cat("conversation '", id, "'"), " would be larger than ", cap,
             " bytes, what one conversation may hold (--max-body-bytes, a response reads it whole; or "
             "--max-stored-bytes where smaller)");
}

std::string needs_the_store(std::string_view what) {
  return cat(what, " need the response store, which is off here (--max-stored-responses 0)");
}

json conversation_items(const json& items, const ResponseStore* store) {
  if (!items.is_array()) bad("items", "'items' must be an array of items");
  if (items.size() > size_t(kMaxConversationItems))
    bad("items", cat("'items' has ", items.size(), " items: at most ", kMaxConversationItems, " can be added at a time"));
  ResponsesConversation c;
  Resolved resolved(store);
  add_items(items, "items", store, resolved, /*keep=*/true, c);
  std::vector<size_t> origin;
  const json messages = chat_messages(c, "items", &origin);
  if (messages.empty()) return std::move(c.own);
  try {
    parse_messages(messages, "items");
  } catch (const ApiError& e) {  // (it names messages[k]: its item's index instead)
    const size_t open = e.param.find('['), close = e.param.find(']');
    if (!e.param.starts_with("items[") || close == std::string::npos) throw;
    const std::string was = e.param.substr(0, close + 1);
    const size_t k = size_t(std::stoull(e.param.substr(open + 1, close - open - 1)));
    if (k >= origin.size()) throw;
    const std::string is = cat("items[", origin[k], "]");
    std::string message = e.what();
    for (size_t at = message.find(was); at != std::string::npos; at = message.find(was, at + is.size()))
      message.replace(at, was.size(), is);
    throw ApiError(e.status, message, is + e.param.substr(was.size()), e.type, e.code);
  }
  return std::move(c.own);
}

ParsedRequest parse_responses_request(std::string_view body, const ModelInfo& model, const ResponseStore* store,
                                      ConversationStore* conversations) {
  json j = parse_json_object(body);
  for (auto it = j.begin(); it != j.end();) it = it.value().is_null() ? j.erase(it) : std::next(it);
  if (j.contains("prompt")) bad("prompt", "'prompt' (a stored prompt template) is not supported");
  static const char* const kKnown[] = {"model", "input", "instructions", "stream", "stream_options", "max_output_tokens",
                                       "temperature", "top_p", "tools", "tool_choice", "text", "parallel_tool_calls",
                                       "store", "metadata", "user", "reasoning", "truncation", "include", "service_tier",
                                       "prompt_cache_key", "safety_identifier", "top_logprobs", "max_tool_calls",
                                       "background", "previous_response_id", "conversation", "seed", "top_k", "min_p", "repetition_penalty", "stop",
                                       "chat_template_kwargs", "guided_choice", "guided_json", "grammar"};
  json chat = json::object();
  std::vector<std::string> unknown;
  for (const auto& [k, v] : j.items())
    if (std::find(std::begin(kKnown), std::end(kKnown), k) == std::end(kKnown)) unknown.push_back(k);
  for (const char* k : {"model", "stream", "temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty", "stop",
                        "parallel_tool_calls", "chat_template_kwargs", "guided_choice", "guided_json", "grammar"})
    if (j.contains(k)) chat[k] = j[k];
  // reasoning.effort reaches the template as reasoning_effort (gpt-oss's templates read it), unless
  // chat_template_kwargs sets it.
  if (j.contains("reasoning") && j["reasoning"].is_object() && j["reasoning"].contains("effort") &&
      j["reasoning"]["effort"].is_string()) {
    if (!chat.contains("chat_template_kwargs")) chat["chat_template_kwargs"] = json::object();
    if (chat["chat_template_kwargs"].is_object() && !chat["chat_template_kwargs"].contains("reasoning_effort"))
      chat["chat_template_kwargs"]["reasoning_effort"] = j["reasoning"]["effort"];
  }
  if (j.contains("max_output_tokens")) chat["max_completion_tokens"] = j["max_output_tokens"];
  if (j.contains("stream") && j["stream"] == true) chat["stream_options"] = {{"include_usage", true}};
  // Logprobs (on output_text parts and deltas) when include asks for them; top_logprobs is how
  // many alternatives (vLLM's rule: alone it asks for none).
  bool logprobs = false;
  if (j.contains("include")) {
    if (!j["include"].is_array()) bad("include", "'include' must be an array of strings");
    for (const json& x : j["include"]) {
      if (!x.is_string()) bad("include", "'include' must be an array of strings");
      logprobs = logprobs || x == "message.output_text.logprobs";
    }
  }
  if (j.contains("top_logprobs")) get_int(j, "top_logprobs", 0, kMaxLogprobs);
  if (logprobs) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = j.contains("top_logprobs") ? j["top_logprobs"] : json(0);
  }

  const bool store_asked = !j.contains("store") || get_bool(j, "store");  // (OpenAI's default: stored)
  const bool background = j.contains("background") && get_bool(j, "background");
  if (background && !store_asked) bad("background", "background responses must be stored: 'store' cannot be false");
  if (background && !(store && store->max_bytes() > 0 && store->max_responses() > 0))
    bad("background", needs_the_store("background responses"));
  if (j.contains("metadata")) check_metadata(j["metadata"], "metadata");
  // (a conversation takes the input's items, stored or not)
  ResponsesConversation conv = responses_conversation(j, store, conversations, (store_asked && store) || j.contains("conversation"));
  if (conv.claim) {  // (its turn over the conversation's cap already: refused before it runs)
    uint64_t bytes = conv.conversation_bytes;
    for (const ResponseStore::Item& it : ResponseStore::to_items(conv.own)) bytes += ResponseStore::item_bytes(it);
    const std::string id = conversation_id(j["conversation"]);
    if (bytes > conversations->max_conversation_bytes()) bad("input", conversation_over_cap(id, conversations->max_conversation_bytes()));
  }

  json messages = chat_messages(conv, "input");
  if (j.contains("instructions")) {  // (this request's own: not what it continues, as OpenAI does)
    if (!j["instructions"].is_string()) bad("instructions", "'instructions' must be a string");
    messages.insert(messages.begin(), json{{"role", "system"}, {"content", j["instructions"]}});
  }
  chat["messages"] = messages;
  if (j.contains("tools")) {
    if (!j["tools"].is_array()) bad("tools", "'tools' must be an array");
    json tools = json::array();
    for (size_t i = 0; i < j["tools"].size(); ++i) {
      const json& t = j["tools"][i];
      if (!t.is_object() || !t.contains("type") || t["type"] != "function")
        bad(cat("tools[", i, "]"), "only tools of type 'function' are supported (no built-in tools here)");
      json f = {{"name", t.contains("name") ? t["name"] : json("")}};
      for (const char* k : {"description", "parameters", "strict"})
        if (t.contains(k)) f[k] = t[k];
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    chat["tools"] = tools;
  }
  if (j.contains("tool_choice")) {
    const json& c = j["tool_choice"];
    chat["tool_choice"] = c.is_object() && c.contains("name") ? json{{"type", "function"}, {"function", {{"name", c["name"]}}}} : c;
  }
  if (j.contains("text") && j["text"].is_object() && j["text"].contains("format")) {
    const json& f = j["text"]["format"];
    if (f.is_object() && f.contains("type") && f["type"] == "json_schema")
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", f.contains("name") ? f["name"] : json("output")},
                                                  {"schema", f.contains("schema") ? f["schema"] : json::object()}}}};
    else if (f.is_object())
      chat["response_format"] = f;
  }
  // The schemas' own text (the chat body is a re-dump, keys sorted).
  SchemaTexts texts;
  texts.response_format = raw_at(body, {"text", "format", "schema"});
  texts.guided_json = raw_at(body, {"guided_json"});
  for (const std::string_view t : raw_elements(raw_at(body, {"tools"}))) texts.tools.push_back(raw_at(t, {"parameters"}));
  try {
    ParsedRequest r = parse_request(Endpoint::Chat, chat.dump(), model, &texts);
    r.kind = Endpoint::Responses;
    r.unknown_fields = unknown;
    // What the response object echoes, as the request gave it (valid by now).
    for (const char* k : {"instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "temperature", "top_p",
                          "tools", "tool_choice", "truncation", "user", "safety_identifier", "prompt_cache_key",
                          "service_tier", "top_logprobs", "max_tool_calls", "reasoning", "previous_response_id"})
      if (j.contains(k)) r.responses_echo[k] = j[k];
    r.responses_echo["store"] = store_asked;  // (the finished response's says whether it was stored)
    r.store_response = store_asked && store;
    r.background = background;
    if (background) r.responses_echo["background"] = true;
    if (j.contains("conversation")) {
      r.conversation = conversation_id(j["conversation"]);
      r.conversation_claim = std::move(conv.claim);
      r.responses_echo["conversation"] = {{"id", r.conversation}};
    }
    r.responses_input = std::move(conv.own);
    if (j.contains("text") && j["text"].is_object()) {
      r.responses_echo["text"] = j["text"];
      if (!j["text"].contains("format")) r.responses_echo["text"]["format"] = {{"type", "text"}};
    }
    if (!j.contains("tool_choice") && j.contains("tools")) r.responses_echo["tool_choice"] = "auto";
    return r;
  } catch (ApiError& e) {  // name the Responses API's params
    if (e.param.rfind("messages", 0) == 0) e.param = "input" + e.param.substr(8);
    if (e.param == "max_completion_tokens") e.param = "max_output_tokens";
    if (e.param.rfind("response_format", 0) == 0) e.param = "text.format";
    throw;
  }
}

namespace {
constexpr std::string_view kHarmonyMessage = "<|message|>", kHarmonyChannel = "<|channel|>";
// What ends a message's body: its end (<|end|>; <|return|> and <|call|> where they are in the text,
// under ignore_eos) or, where a model left it out, the next message's start.
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>", "<|channel|>"};
constexpr size_t kHarmonyConsumed = 3;  // kHarmonyEnds' first three are the message's (the rest start the next)
// How an output in harmony starts: a header's first marker, or a recipient before the channel.
constexpr std::string_view kHarmonyStarts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", " to=", "to="};
constexpr size_t kMaxHarmonyHeader = 4096;  // bytes: a longer "header" is a model off its format

// The word after `key` in a header ("" when absent): up to whitespace or the next marker.
std::string header_word(std::string_view header, std::string_view key, bool last) {
  const size_t at = last ? header.rfind(key) : header.find(key);
  if (at == std::string_view::npos) return "";
  std::string_view rest = header.substr(at + key.size());
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  size_t n = 0;
  while (n < rest.size() && !std::isspace(static_cast<unsigned char>(rest[n])) && rest[n] != '<') ++n;
  return std::string(rest.substr(0, n));
}

std::string_view trim_space(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}
}  // namespace

void HarmonySplit::emit(ReasoningParts& out, std::string_view text) {
  if (kind_ == Kind::Call) call_args_ += text;
  else if (kind_ == Kind::Reasoning && !raw_) out.reasoning += text;
  else out.content += text;
}

void HarmonySplit::open_body(ReasoningParts& out) {
  const std::string channel = header_word(header_, kHarmonyChannel, true);
  const std::string recipient = header_word(header_, "to=", false);
  if (recipient.starts_with("functions.")) {
    kind_ = Kind::Call;
    call_name_ = recipient.substr(10);
    call_args_.clear();
  } else {
    kind_ = !recipient.empty() || channel == "analysis" ? Kind::Reasoning : Kind::Content;  // (a built-in tool's call: reasoning)
  }
  if (kind_ == Kind::Reasoning && !raw_) reasoned_ = true;
  if (raw_ && kind_ != Kind::Call) out.content += header_;
  header_.clear();
  state_ = State::Body;
}

void HarmonySplit::close_body() {
  if (kind_ == Kind::Call) calls_.push_back({new_tool_call_id(), call_name_, std::string(trim_space(call_args_))});
  kind_ = Kind::Content;
  call_args_.clear();
  state_ = State::Header;
}

// The final push's open message: a call cut short is content (its arguments so far), else it ends.
void HarmonySplit::close_last(ReasoningParts& out) {
  if (kind_ == Kind::Call && cut_) {
    out.content += std::exchange(call_args_, {});
    kind_ = Kind::Content;
  }
  close_body();
}

ReasoningParts HarmonySplit::push(std::string_view text, bool final) {
  held_.append(text);
  ReasoningParts out;
  for (;;) {
    switch (state_) {
      case State::Start: {
        bool harmony = false, maybe = false;
        for (std::string_view s : kHarmonyStarts) {
          harmony = harmony || held_.starts_with(s);
          maybe = maybe || s.starts_with(held_);
        }
        if (harmony) {
          state_ = State::Header;
          break;
        }
        if (maybe && !final) return out;  // (may still become a marker)
        // Text before any header (a continued final message, a model's stray lead, a grammar's
        // JSON): an open content message, so that an end marker still closes it and the headers
        // after it are still read.
        kind_ = Kind::Content;
        state_ = State::Body;
        break;
      }
      case State::Plain:
        out.content += std::exchange(held_, {});
        return out;
      case State::Header: {
        const size_t from = header_.size() > kHarmonyMessage.size() ? header_.size() - kHarmonyMessage.size() : 0;
        header_ += std::exchange(held_, {});
        if (const size_t at = header_.find(kHarmonyMessage, from); at != std::string::npos) {
          held_ = header_.substr(at + kHarmonyMessage.size());
          header_.resize(at + kHarmonyMessage.size());
          open_body(out);
          break;
        }
        if (header_.size() > kMaxHarmonyHeader) {  // not a header: the rest is content as it comes
          out.content += std::exchange(header_, {});
          state_ = State::Plain;
          break;
        }
        if (final) {
          // An unfinished header is markup (raw: content); text with no marker at all is stray
          // text after the last message: content.
          if (raw_ || (header_.find("<|") == std::string::npos && !trim_space(header_).empty())) out.content += header_;
          header_.clear();
        }
        return out;
      }
      case State::Body: {
        size_t at = std::string::npos, which = 0;
        for (size_t k = 0; k < std::size(kHarmonyEnds); ++k)
          if (const size_t p = held_.find(kHarmonyEnds[k]); p < at) at = p, which = k;
        if (at != std::string::npos) {
          emit(out, std::string_view(held_).substr(0, at));
          size_t cut = at;
          if (which < kHarmonyConsumed) {
            cut += kHarmonyEnds[which].size();
            if (raw_ && kind_ != Kind::Call) out.content += kHarmonyEnds[which];
          }
          held_.erase(0, cut);
          close_body();
          break;
        }
        size_t keep = 0;  // the longest tail that may become a marker
        if (!final)
          for (std::string_view m : kHarmonyEnds)
            for (size_t n = std::min(m.size() - 1, held_.size()); n > keep; --n)
              if (m.starts_with(std::string_view(held_).substr(held_.size() - n))) {
                keep = n;
                break;
              }
        emit(out, std::string_view(held_).substr(0, held_.size() - keep));
        held_.erase(0, held_.size() - keep);
        if (final) close_last(out);
        return out;
      }
    }
  }
}

ReasoningSplit::Parts ReasoningSplit::push(std::string_view text, bool final) {
  if (harmony_) return harmony_->push(text, final);
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  held_.append(text);
  Parts out;
  if (state_ == State::Start) {  // "<think>" first (after whitespace), or content throughout
    lead_ = std::min(held_.find_first_not_of(" \t\r\n", lead_), held_.size());  // (whitespace seen is not rescanned)
    const size_t lead = lead_;
    const std::string_view rest = std::string_view(held_).substr(lead);
    if (rest.starts_with(kOpen)) {
      held_.erase(0, lead + kOpen.size());
      state_ = State::Reasoning;
    } else if (!final && kOpen.starts_with(rest)) {
      return out;  // (may still become "<think>")
    } else {
      state_ = State::Content;
    }
  }
  if (state_ == State::Reasoning) {
    reasoned_ = true;
    if (const size_t at = held_.find(kClose); at != std::string::npos) {
      out.reasoning = held_.substr(0, at);
      held_.erase(0, at + kClose.size());
      state_ = State::Content;
    } else {
      size_t keep = 0;  // the longest tail that begins "</think>"
      for (size_t n = std::min(kClose.size() - 1, held_.size()); n > 0 && !final; --n)
        if (kClose.starts_with(std::string_view(held_).substr(held_.size() - n))) {
          keep = n;
          break;
        }
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
  }
  out.content = std::exchange(held_, {});
  return out;
}

namespace {
// parse_native_request; schemas as parse_request's.
ParsedRequest native_request(std::string_view body, const ModelInfo& model, const SchemaTexts* schemas) {
  json j = parse_json_object(body);
  SchemaTexts own;
  schemas = schemas_of(j, body, schemas, own);
  for (auto it = j.begin(); it != j.end();) it = it.value().is_null() ? j.erase(it) : std::next(it);
  if (!j.contains("model")) j["model"] = model.id;
  if (j.contains("n") && j["n"] != 1) bad("n", "llama.cpp's /completion makes one completion ('n' must be 1)");
  if (j.contains("seed") && j["seed"].is_number_integer() && j["seed"].get<int64_t>() == -1) j.erase("seed");  // -1: random
  // logit_bias as [[id or text, bias | false], ...] or {"id or text": bias}, in the order given
  // (an object's: its keys', as text); a text's tokens get its bias. One value a token, the last
  // given (GenerationRequest::logit_bias_text; ids alone: logit_bias at once).
  std::vector<GenerationRequest::BiasEntry> entries;
  bool texts = false;
  if (j.contains("logit_bias") && (j["logit_bias"].is_array() || j["logit_bias"].is_object())) {
    const char* shape = "'logit_bias' must be [[token id or text, bias or false], ...] or an object";
    auto add = [&](const json& key, const json& bias) {
      if (!(bias.is_number() || bias == false)) bad("logit_bias", shape);
      const double b = bias == false ? -100.0 : bias.get<double>();
      if (!std::isfinite(b) || b < -100 || b > 100) bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      GenerationRequest::BiasEntry e;
      e.bias = float(b);
      if (key.is_number_integer()) {
        e.id = check_token_id(key.get<int64_t>(), model.n_vocab, "logit_bias");
      } else {
        const std::string& k = key.get_ref<const std::string&>();
        int64_t id = 0;
        if (const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id); ec == std::errc() && end == k.data() + k.size()) {
          e.id = check_token_id(id, model.n_vocab, "logit_bias");
        } else {
          e.text = k;
          texts = true;
        }
      }
      entries.push_back(std::move(e));
    };
    if (j["logit_bias"].is_array()) {
      for (const json& e : j["logit_bias"]) {
        if (!e.is_array() || e.size() != 2 || !(e[0].is_number_integer() || e[0].is_string())) bad("logit_bias", shape);
        add(e[0], e[1]);
      }
    } else {
      for (const auto& [k, v] : j["logit_bias"].items()) add(json(k), v);
    }
    j.erase("logit_bias");
  }
  const bool tokens = j.contains("return_tokens") && get_bool(j, "return_tokens");
  j.erase("return_tokens");
  // n_predict: -1 (or absent, or below) the rest of the context; a cap, not a promise (a prompt
  // plus it past the context stops at the context's end, as llama.cpp's does).
  // max_tokens is taken as n_predict (n_predict wins when both are given, as llama.cpp's), whose -1
  // parse_request takes. 0: the prompt evaluated, nothing generated (one token, dropped: echo_only).
  if (!j.contains("n_predict") && j.contains("max_tokens")) j["n_predict"] = j["max_tokens"];
  j.erase("max_tokens");
  const char* np = "n_predict";
  if (!j.contains(np) || (j[np].is_number_integer() && j[np].get<int64_t>() < 0)) j[np] = -1;
  const bool eval_only = j[np] == 0;
  if (eval_only) j[np] = 1;
  if (j[np].is_number_integer() && j[np].get<int64_t>() > model.n_ctx) j[np] = model.n_ctx;
  // llama.cpp's sampling defaults where the request sets none (its CLI's, as `run` has them).
  if (!j.contains("temperature")) j["temperature"] = kCliSampling.temperature;
  if (!j.contains("top_k")) j["top_k"] = kCliSampling.top_k;
  if (!j.contains("top_p")) j["top_p"] = kCliSampling.top_p;
  if (!j.contains("min_p")) j["min_p"] = kCliSampling.min_p;
  for (const char* k : {"echo", "logprobs", "prompt_logprobs", "best_of", "suffix"})
    if (j.contains(k)) bad(k, cat("'", k, "' is not taken by llama.cpp's /completion (use /v1/completions)"));
  // n_probs: each token's logprob and its n best alternatives (completion_probabilities), from the
  // model's distribution; llama.cpp's post-sampling form is not made.
  if (j.contains("post_sampling_probs") && get_bool(j, "post_sampling_probs"))
    bad("post_sampling_probs", "'post_sampling_probs' is not supported: n_probs reports the model's logprobs");
  j.erase("post_sampling_probs");
  if (j.contains("n_probs")) {
    if (const int64_t n = get_int(j, "n_probs", 0, kMaxLogprobs); n > 0) j["logprobs"] = n;
    j.erase("n_probs");
  }
  ParsedRequest r = parse_request(Endpoint::Completions, j.dump(), model, schemas);
  r.kind = Endpoint::Native;
  if (texts) {
    r.logit_bias_text = std::move(entries);
  } else {
    for (const auto& e : entries) r.logit_bias.emplace_back(e.id, e.bias);
    sort_logit_bias(r.logit_bias);
  }
  r.echo_only = eval_only;
  r.return_token_ids = tokens;
  r.fit_max_tokens = true;
  if (!r.more_texts.empty() || !r.more_tokens.empty()) bad("prompt", "llama.cpp's /completion takes one prompt");
  return r;
}
}  // namespace

ParsedRequest parse_native_request(std::string_view body, const ModelInfo& model) { return native_request(body, model, nullptr); }

ParsedRequest parse_infill_request(std::string_view body, const ModelInfo& model) {
  json j = parse_json_object(body);
  SchemaTexts own;
  const SchemaTexts* schemas = schemas_of(j, body, nullptr, own);
  for (auto it = j.begin(); it != j.end();) it = it.value().is_null() ? j.erase(it) : std::next(it);
  InfillParts parts;
  if (j.contains("input_prefix")) parts.prefix = get_string(j, "input_prefix", "input_prefix");
  if (j.contains("input_suffix")) parts.suffix = get_string(j, "input_suffix", "input_suffix");
  if (j.contains("input_extra")) {
    const json& extra = j["input_extra"];
    const char* shape = "'input_extra' must be an array of {\"filename\": string, \"text\": string} objects";
    if (!extra.is_array()) bad("input_extra", shape);
    for (const json& chunk : extra) {
      if (!chunk.is_object() || !chunk.contains("text") || !chunk["text"].is_string() ||
          (chunk.contains("filename") && !chunk["filename"].is_string()))
        bad("input_extra", shape);
      parts.extra.emplace_back(chunk.value("filename", std::string("tmp")), chunk["text"].get<std::string>());
    }
  }
  for (const char* k : {"input_prefix", "input_suffix", "input_extra"}) j.erase(k);
  if (j.contains("truncate_prompt_tokens"))  // (its own budgets cut the parts)
    bad("truncate_prompt_tokens", "'truncate_prompt_tokens' is not taken by /infill");
  if (!j.contains("prompt")) j["prompt"] = "";
  ParsedRequest r = native_request(j.dump(), model, schemas);
  r.infill = std::move(parts);
  return r;
}

ParsedRequest parse_embeddings_request(std::string_view body, const ModelInfo& model) {
  json j = parse_json_object(body);
  for (auto it = j.begin(); it != j.end();) it = it.value().is_null() ? j.erase(it) : std::next(it);
  ParsedRequest r;
  r.kind = Endpoint::Embeddings;
  r.embed = true;
  for (const auto& [key, v] : j.items()) {
    static constexpr std::string_view kKnown[] = {"input", "model", "encoding_format", "dimensions", "user",
                                                  "truncate_prompt_tokens", "add_special_tokens", "normalize",
                                                  "embd_normalize", "priority", "cache_salt"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) r.unknown_fields.push_back(key);
  }
  r.model = check_model(j, model, false);
  if (!j.contains("input")) bad("input", "'input' is required");
  parse_prompts(j["input"], "input", model.n_vocab, r);
  if (const size_t n = 1 + r.more_texts.size() + r.more_tokens.size(); n > size_t(kMaxEmbeddingInputs))
    bad("input", cat("'input' has ", n, " entries; at most ", kMaxEmbeddingInputs, " may be embedded in one request"));
  if (j.contains("encoding_format")) {
    const std::string f = get_string(j, "encoding_format", "encoding_format");
    if (f != "float" && f != "base64") bad("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    r.base64 = f == "base64";
  }
  if (j.contains("dimensions") && get_int(j, "dimensions", 1, INT32_MAX) != model.n_embd)
    bad("dimensions", cat("this model's embeddings have ", model.n_embd, " dimensions; 'dimensions' cannot change that"));
  if (j.contains("add_special_tokens")) r.add_bos = get_bool(j, "add_special_tokens");
  if (j.contains("normalize")) r.embd_normalize = get_bool(j, "normalize") ? 2 : -1;  // vLLM's
  if (j.contains("embd_normalize")) r.embd_normalize = int32_t(get_int(j, "embd_normalize", -1, 64));  // llama.cpp's
  parse_truncate(j, model, r);
  if (j.contains("priority")) r.priority = int32_t(get_int(j, "priority", -kPriorityBound, kPriorityBound));
  if (j.contains("cache_salt")) {
    r.cache_salt = get_string(j, "cache_salt", "cache_salt");
    if (r.cache_salt.empty()) bad("cache_salt", "'cache_salt' must be a non-empty string");
  }
  validate(r, model.n_vocab);
  return r;
}

void normalize_embedding(std::vector<float>& v, int32_t norm) {
  double sum = 0;
  if (norm < 0) return;
  if (norm == 0) {  // the largest magnitude -> 32760 (llama.cpp: an int16 range)
    for (float x : v) sum = std::max(sum, double(std::fabs(x)));
    sum /= 32760.0;
  } else if (norm == 2) {
    for (float x : v) sum += double(x) * double(x);
    sum = std::sqrt(sum);
  } else {
    for (float x : v) sum += std::pow(double(std::fabs(x)), double(norm));
    sum = std::pow(sum, 1.0 / double(norm));
  }
  const double scale = sum > 0 ? 1.0 / sum : 0.0;
  for (float& x : v) x = float(double(x) * scale);
}

std::string base64_floats(const std::vector<float>& v) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<unsigned char> bytes(v.size() * 4);
  for (size_t i = 0; i < v.size(); ++i) {  // little-endian, whatever the host
    uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[4 * i + size_t(b)] = static_cast<unsigned char>(u >> (8 * b));
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t w = uint32_t(bytes[i]) << 16;
    if (n > 1) w |= uint32_t(bytes[i + 1]) << 8;
    if (n > 2) w |= uint32_t(bytes[i + 2]);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(w >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

namespace {
// f as the double nearest its shortest decimal form, which JSON prints in that form: a float
// widened as it is prints up to 17 digits, twice the bytes. (Read back as a float, the same f.)
double shortest(float f) {
  char buf[48];
  const auto end = std::to_chars(buf, buf + sizeof buf, f).ptr;
  double d = f;
  std::from_chars(buf, end, d);
  return d;
}
}  // namespace

ParsedRequest parse_native_embeddings_request(std::string_view body, const ModelInfo& model) {
  json j = parse_json_object(body);
  const bool content = j.contains("content") && (!j.contains("input") || j["input"].is_null());
  if (content) {
    j["input"] = std::move(j["content"]);
    j.erase("content");
  }
  try {
    ParsedRequest r = parse_embeddings_request(j.dump(), model);
    r.llama_embeddings = true;
    return r;
  } catch (ApiError& e) {  // (named as the request named it)
    if (content && e.param.rfind("input", 0) == 0) e.param = "content" + e.param.substr(5);
    throw;
  }
}

json llama_embeddings_response(const std::vector<std::vector<float>>& vectors) {
  json out = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json v = json::array();
    for (float x : vectors[i]) v.push_back(shortest(x));
    out.push_back({{"index", i}, {"embedding", json::array({std::move(v)})}});
  }
  return out;
}

json embeddings_response(const std::string& model, const std::vector<std::vector<float>>& vectors, bool base64,
                         int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < vectors.size(); ++i) {
    json e;
    if (base64) {
      e = base64_floats(vectors[i]);
    } else {
      e = json::array();
      for (float x : vectors[i]) e.push_back(shortest(x));
    }
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(e)}});
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

json native_probs(const Tokenizer& tok, const std::vector<TokenLogprobs>& lps) {
  auto entry = [&](int32_t id, float lp) {
    const std::string piece = tok.token_to_piece(id);
    json bytes = json::array();
    for (unsigned char c : piece) bytes.push_back(int(c));
    return json{{"id", id}, {"token", piece}, {"bytes", std::move(bytes)}, {"logprob", lp}};
  };
  json out = json::array();
  for (const TokenLogprobs& t : lps) {
    json e = entry(t.token, t.logprob);
    e["top_logprobs"] = json::array();
    for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(entry(id, lp));
    out.push_back(std::move(e));
  }
  return out;
}

json native_chunk(const std::string& model, const std::string& content, const std::vector<int32_t>& tokens, bool stop,
                  int64_t predicted, int64_t evaluated, const std::string& stop_type, const std::string& stopping_word,
                  const NativeTimings* t) {
  json j = {{"index", 0}, {"content", content}, {"tokens", tokens}, {"id_slot", 0}, {"stop", stop}, {"model", model}};
  if (!stop) return j;
  j["tokens_predicted"] = predicted;
  j["tokens_evaluated"] = evaluated;
  j["stop_type"] = stop_type;
  j["stopping_word"] = stopping_word;
  j["truncated"] = false;
  j["has_new_line"] = content.find('\n') != std::string::npos;
  if (t) {
    auto per = [](double ms, int64_t n) { return n > 0 ? ms / double(n) : 0.0; };
    auto rate = [](double ms, int64_t n) { return ms > 0 ? 1e3 * double(n) / ms : 0.0; };
    j["tokens_cached"] = t->cached_n;
    j["timings"] = {{"prompt_n", t->prompt_n},       {"prompt_ms", t->prompt_ms},
                    {"prompt_per_token_ms", per(t->prompt_ms, t->prompt_n)},
                    {"prompt_per_second", rate(t->prompt_ms, t->prompt_n)},
                    {"predicted_n", t->predicted_n}, {"predicted_ms", t->predicted_ms},
                    {"predicted_per_token_ms", per(t->predicted_ms, t->predicted_n)},
                    {"predicted_per_second", rate(t->predicted_ms, t->predicted_n)},
                    {"cache_n", t->cached_n}};
  }
  return j;
}

json usage_json(const Usage& u, bool details) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (details) j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

static json reason_json(const std::string& r) { return r.empty() ? json(nullptr) : json(r); }

// A piece's raw bytes as a JSON string: invalid UTF-8 (a lone byte token) becomes U+FFFD when
// dumped; "bytes" carries the exact bytes.
static json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

int64_t text_offset_length(std::string_view piece) {
  int64_t n = 0;
  for (unsigned char c : piece) n += (c & 0xC0) != 0x80;
  return n;
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
    if (std::isnan(t.logprob)) {  // an echoed prompt's first token: nothing predicted it
      lps.push_back(nullptr);
      tops.push_back(nullptr);
    } else {
      lps.push_back(t.logprob);
      json top = json::object();
      for (const auto& [text, lp] : t.top)
        if (!top.contains(text)) top[text] = lp;  // two ids with one piece: the better one (best first)
      tops.push_back(top);
    }
    offsets.push_back(off);
    off += text_offset_length(t.text);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json completion_choice(Endpoint kind, int32_t index, const std::string& text, const std::string& finish_reason,
                       const json& logprobs, const json& tool_calls) {
  if (kind == Endpoint::Chat) {
    json message = {{"role", "assistant"}, {"content", text}};
    if (tool_calls.is_array() && !tool_calls.empty()) {
      message["tool_calls"] = tool_calls;
      if (text.empty()) message["content"] = nullptr;
    }
    return {{"index", index}, {"message", message}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
  }
  return {{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
}

void as_function_call(json& choice) {
  if (choice.contains("finish_reason") && choice["finish_reason"] == "tool_calls") choice["finish_reason"] = "function_call";
  for (const char* key : {"message", "delta"}) {
    if (!choice.contains(key) || !choice[key].contains("tool_calls")) continue;
    json& m = choice[key];
    if (m["tool_calls"].is_array() && !m["tool_calls"].empty() && m["tool_calls"][0].contains("function"))
      m["function_call"] = std::move(m["tool_calls"][0]["function"]);
    m.erase("tool_calls");
  }
}

json stop_reason_json(const Finish& f) {
  if (!f.stop_word.empty()) return f.stop_word;
  if (f.stop_token >= 0) return f.stop_token;
  return nullptr;
}

json completion_response(const ResponseMeta& m, json choices, const Usage& u) {
  return {{"id", m.id},
          {"object", m.kind == Endpoint::Chat ? "chat.completion" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", std::move(choices)},
          {"usage", usage_json(u)}};
}

json completion_response(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                         const Usage& u, const json& logprobs, const json& tool_calls) {
  return completion_response(m, json::array({completion_choice(m.kind, 0, text, finish_reason, logprobs, tool_calls)}), u);
}

json stream_chunk(const ResponseMeta& m, const std::string& text, bool first, const std::string& finish_reason,
                  bool with_usage_null, const json& logprobs, int32_t index) {
  json choice;
  if (m.kind == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    choice = {{"index", index}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
  } else {
    choice = {{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
  }
  json j = {{"id", m.id},
            {"object", m.kind == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
            {"created", m.created},
            {"model", m.model},
            {"choices", json::array({choice})}};
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

json tool_calls_chunk(const ResponseMeta& m, const json& tool_calls, bool with_usage_null, int32_t index) {
  json j = {{"id", m.id},
            {"object", "chat.completion.chunk"},
            {"created", m.created},
            {"model", m.model},
            {"choices", json::array({{{"index", index},
                                      {"delta", {{"tool_calls", tool_calls}}},
                                      {"logprobs", nullptr},
                                      {"finish_reason", nullptr}}})}};
  if (with_usage_null) j["usage"] = nullptr;
  return j;
}

std::string new_item_id(std::string_view prefix) {
  thread_local std::random_device rd;  // (not a seeded generator: ids read back stored responses)
  char b[32];
  std::snprintf(b, sizeof b, "%08x%08x%08x", unsigned(rd()), unsigned(rd()), unsigned(rd()));
  return std::string(prefix) + b;
}

std::string new_tool_call_id() { return new_item_id("call_"); }

namespace {

bool known_tool(const json& tools, const std::string& name) {
  if (!tools.is_array()) return false;
  for (const json& t : tools)
    if (t.contains("function") && t["function"].value("name", "") == name) return true;
  return false;
}

// {"name", "arguments" | "parameters"} naming a known tool -> a call.
// A call's arguments as OpenAI and Anthropic define them: a JSON object, as text. Anything else (a
// number, an array, text that is not JSON) makes no call: the model's text stays content.
bool object_arguments(std::string_view args) {
  if (!json_depth_within(args)) return false;
  const json j = json::parse(args.begin(), args.end(), nullptr, false);
  return !j.is_discarded() && j.is_object();
}

// raw: j's text. The arguments as the model wrote them: a JSON string's content, else the
// object's own text.
std::optional<ToolCall> call_from_json(const json& j, std::string_view raw, const json& tools) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (!known_tool(tools, name)) return std::nullopt;
  const char* key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  std::string args = "{}";
  if (key && j[key].is_string()) {
    args = j[key].get<std::string>();
  } else if (key) {
    const auto members = raw_members(raw, skip_json_ws(raw, 0));
    const auto it = members.find(key);
    args = it != members.end() ? std::string(it->second) : j[key].dump();
  }
  if (!object_arguments(args)) return std::nullopt;
  return ToolCall{new_tool_call_id(), name, args};
}

// One JSON value (object/array) or several separated by ';' / whitespace -> calls; all or none.
std::vector<ToolCall> calls_from_text(std::string_view text, const json& tools) {
  std::vector<ToolCall> out;
  if (!json_depth_within(text)) return out;  // (the model's text: not calls)
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return out;
  // Each item's raw text: the array's elements, or the whole value.
  const size_t i = skip_json_ws(text, 0);
  const std::vector<std::string_view> raws =
      j.is_array() ? raw_elements(text) : std::vector<std::string_view>{text.substr(i, skip_json_value(text, i) - i)};
  const json items = j.is_array() ? j : json::array({j});
  if (raws.size() != items.size()) return out;  // (cannot be: the text is valid JSON)
  for (size_t k = 0; k < items.size(); ++k) {
    auto c = call_from_json(items[k], raws[k], tools);
    if (!c) return {};
    out.push_back(std::move(*c));
  }
  return out;
}

std::string_view trim_ws(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

constexpr std::string_view kMarkers[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<function="};

}  // namespace

FoundToolCalls extract_tool_calls(ToolChoice choice, const std::string& tool_name, const json& tools,
                                  std::string_view text, bool held) {
  FoundToolCalls f;
  if (choice == ToolChoice::Named) {  // (arguments cut short, by a stop string or the length: no call)
    if (object_arguments(trim_ws(text))) f.calls.push_back({new_tool_call_id(), tool_name, std::string(trim_ws(text))});
    else f.content = std::string(text);
    return f;
  }
  if (choice == ToolChoice::None) {
    f.content = std::string(text);
    return f;
  }
  const std::string_view t = trim_ws(text);
  // The content around calls: trimmed; held (a stream's rest), with the whitespace that separates
  // it from the text released before it.
  const auto content_of = [&](std::string_view c) {
    if (!held || trim_ws(c).empty()) return std::string(trim_ws(c));
    while (std::isspace(static_cast<unsigned char>(c.back()))) c.remove_suffix(1);
    return std::string(text.substr(0, size_t(t.data() - text.data()))) + std::string(c);
  };
  // A whole output of JSON calls (Llama 3.x), before the markers: its strings may hold them.
  if (t.starts_with("{") || t.starts_with("[")) {
    f.calls = calls_from_text(t, tools);
    if (!f.calls.empty()) return f;
  }
  // <tool_call>{...}</tool_call> blocks, with text around them.
  if (t.find("<tool_call>") != std::string_view::npos) {
    std::string content;
    size_t pos = 0;
    while (pos < t.size()) {
      const size_t b = t.find("<tool_call>", pos);
      if (b == std::string_view::npos) break;
      size_t e = t.find("</tool_call>", b);
      const size_t body_end = e == std::string_view::npos ? t.size() : e;
      auto calls = calls_from_text(trim_ws(t.substr(b + 11, body_end - b - 11)), tools);
      if (calls.empty()) return {{}, std::string(text)};
      content += t.substr(pos, b - pos);
      for (auto& c : calls) f.calls.push_back(std::move(c));
      pos = e == std::string_view::npos ? t.size() : e + 12;
    }
    content += t.substr(std::min(pos, t.size()));
    f.content = content_of(content);
    return f;
  }
  for (std::string_view marker : {std::string_view("[TOOL_CALLS]"), std::string_view("<|python_tag|>")}) {
    if (const size_t b = t.find(marker); b != std::string_view::npos) {
      auto calls = calls_from_text(trim_ws(t.substr(b + marker.size())), tools);
      if (calls.empty()) return {{}, std::string(text)};
      return {std::move(calls), content_of(t.substr(0, b))};
    }
  }
  if (const size_t b = t.find("<function="); b != std::string_view::npos) {  // <function=NAME>{args}</function>, repeated
    const std::string_view calls = t.substr(b);
    size_t pos = 0;
    while (pos < calls.size()) {
      const std::string_view rest = trim_ws(calls.substr(pos));
      if (rest.empty()) break;
      if (!rest.starts_with("<function=")) return {{}, std::string(text)};
      const size_t gt = rest.find('>');
      const size_t end = rest.find("</function>");
      if (gt == std::string_view::npos) return {{}, std::string(text)};
      const std::string name(rest.substr(10, gt - 10));
      const std::string_view args = trim_ws(rest.substr(gt + 1, (end == std::string_view::npos ? rest.size() : end) - gt - 1));
      if (!known_tool(tools, name) || !object_arguments(args)) return {{}, std::string(text)};
      f.calls.push_back({new_tool_call_id(), name, std::string(args)});
      pos = size_t(rest.data() - calls.data()) + (end == std::string_view::npos ? rest.size() : end + 11);
    }
    f.content = content_of(t.substr(0, b));
    return f;
  }
  f.content = std::string(text);
  return f;
}

FoundToolCalls harmony_tool_calls(std::vector<ToolCall> calls, ToolChoice choice, const json& tools) {
  FoundToolCalls f;
  for (ToolCall& c : calls) {
    if (choice == ToolChoice::Auto && known_tool(tools, c.name) && object_arguments(c.arguments)) f.calls.push_back(std::move(c));
    else f.content += (f.content.empty() ? "" : "\n") + c.arguments;
  }
  return f;
}

FoundToolCalls at_most_one_call(FoundToolCalls found, bool parallel) {
  if (!parallel && found.calls.size() > 1) found.calls.resize(1);
  return found;
}

std::string ToolCallHold::push(std::string_view text) {
  const size_t before = held_.size();
  held_.append(text);
  if (in_call_) return "";
  size_t ws = 0;  // text's trailing whitespace
  while (ws < text.size() && std::isspace(static_cast<unsigned char>(text[text.size() - 1 - ws]))) ++ws;
  ws_tail_ = ws == text.size() ? ws_tail_ + ws : ws;
  if (!past_start_) {
    if (ws_tail_ == held_.size()) return "";  // nothing but whitespace yet
    // JSON or a whole marker first: a call (or not) to be told at the end; held whole from here
    // (so later pushes cost only their own bytes).
    const std::string_view t = std::string_view(held_).substr(held_.find_first_not_of(" \t\n\v\f\r"));
    bool call = t[0] == '{' || t[0] == '[', prefix = false;
    for (std::string_view m : kMarkers) {
      call = call || t.starts_with(m);
      prefix = prefix || m.starts_with(t);
    }
    if (call) {
      in_call_ = true;
      return "";
    }
    if (prefix) return "";  // a marker's first bytes
    past_start_ = true;
  }
  // A whole marker ends in the new text (what was held before held none).
  constexpr size_t kLongest = std::max_element(std::begin(kMarkers), std::end(kMarkers),
                                               [](auto a, auto b) { return a.size() < b.size(); })->size();
  const size_t from = before > kLongest ? before - kLongest : 0;
  size_t cut = held_.size();
  for (std::string_view m : kMarkers)
    if (const size_t at = held_.find(m, from); at != std::string::npos && at < cut) {
      cut = at;
      in_call_ = true;
    }
  if (!in_call_)  // a tail that may become a marker
    for (std::string_view m : kMarkers)
      for (size_t n = std::min(m.size() - 1, held_.size()); n > 0; --n)
        if (std::string_view(held_).substr(held_.size() - n) == m.substr(0, n)) {
          cut = std::min(cut, held_.size() - n);
          break;
        }
  if (cut == held_.size()) cut -= ws_tail_;  // trailing whitespace (around a call it is not content)
  while (cut > 0 && std::isspace(static_cast<unsigned char>(held_[cut - 1]))) --cut;
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  ws_tail_ = std::min(ws_tail_, held_.size());
  released_ = released_ || !out.empty();
  return out;
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    json c = {{"id", calls[k].id}, {"type", "function"}, {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
    if (with_index) c["index"] = k;
    out.push_back(std::move(c));
  }
  return out;
}

json usage_chunk(const ResponseMeta& m, const Usage& u) {
  return {{"id", m.id},
          {"object", m.kind == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", json::array()},
          {"usage", usage_json(u)}};
}

json responses_object(const ResponseMeta& m, const std::string& status, const json& output, const Usage* u,
                      const std::string& incomplete_reason, const json& request) {
  json r = {{"id", m.id},
            {"object", "response"},
            {"created_at", m.created},
            {"status", status},
            {"model", m.model},
            {"background", false},
            {"output", output},
            {"error", nullptr},
            {"incomplete_details", incomplete_reason.empty() ? json(nullptr) : json{{"reason", incomplete_reason}}},
            {"instructions", nullptr},
            {"max_output_tokens", nullptr},
            {"metadata", json::object()},
            {"parallel_tool_calls", true},
            {"previous_response_id", nullptr},
            {"conversation", nullptr},
            {"store", false},  // (request's echo: what it asked; a finished response's: whether it was stored)
            {"temperature", 1.0},
            {"top_p", 1.0},
            {"tool_choice", "auto"},
            {"tools", json::array()},
            {"text", {{"format", {{"type", "text"}}}}},
            {"truncation", "disabled"},
            {"usage", nullptr}};
  for (const auto& [k, v] : request.items()) r[k] = v;
  if (u)
    r["usage"] = {{"input_tokens", u->prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", u->cached_tokens}}},
                  {"output_tokens", u->completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", u->reasoning_tokens}}},
                  {"total_tokens", u->prompt_tokens + u->completion_tokens}};
  return r;
}

json responses_message_item(const std::string& id, const std::string& text, const std::string& status,
                            const json& logprobs) {
  json content = json::array();
  if (status != "in_progress")
    content.push_back({{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", logprobs}});
  return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"}, {"content", content}};
}

json responses_reasoning_item(const std::string& id, const std::string& text, const std::string& status) {
  json content = json::array();
  if (status != "in_progress") content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"type", "reasoning"}, {"id", id}, {"status", status}, {"summary", json::array()}, {"content", content}};
}

json responses_call_item(const ToolCall& c, const std::string& status) {
  return {{"type", "function_call"}, {"id", "fc_" + c.id.substr(std::min<size_t>(5, c.id.size()))},
          {"call_id", c.id}, {"name", c.name}, {"arguments", c.arguments}, {"status", status}};
}

std::string responses_event(const std::string& type, json data, int64_t sequence_number) {
  data["sequence_number"] = sequence_number;
  return typed_event(type, std::move(data));
}

std::string typed_event(const std::string& type, json data) {
  data["type"] = type;
  return "event: " + type + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sse_event(const json& j) {
  // Invalid UTF-8 (a byte-level token at the very end) is replaced, never thrown on.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

const char* status_text(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 401: return "Unauthorized";
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

std::string sse_response_head(bool keep_alive, std::string_view extra_headers) {
  return cat("HTTP/1.1 200 OK\r\nServer: firsttoken\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             "Connection: ", keep_alive ? "keep-alive" : "close", "\r\nTransfer-Encoding: chunked\r\n", extra_headers,
             "\r\n");
}

std::string cors_allow_origin(std::string_view allowed, std::string_view origin) {
  if (origin.empty()) return "";
  size_t b = 0;
  while (b <= allowed.size()) {
    size_t e = allowed.find(',', b);
    if (e == std::string_view::npos) e = allowed.size();
    std::string_view item = allowed.substr(b, e - b);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item == "*") return "*";
    if (!item.empty() && item == origin) return std::string(origin);
    b = e + 1;
  }
  return "";
}

namespace {
// given == api_key in time independent of where they differ; never for an empty key.
bool key_matches(std::string_view api_key, std::string_view given) {
  unsigned diff = given.size() != api_key.size();
  for (size_t k = 0; k < given.size(); ++k) diff |= unsigned(uint8_t(given[k]) ^ uint8_t(api_key[k % std::max<size_t>(1, api_key.size())]));
  return diff == 0 && !api_key.empty();
}
}  // namespace

bool authorized(std::string_view api_key, std::string_view authorization, std::string_view x_api_key) {
  if (!x_api_key.empty() && key_matches(api_key, x_api_key)) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() < kBearer.size()) return false;
  for (size_t k = 0; k < kBearer.size(); ++k)  // the scheme is case-insensitive
    if (std::tolower(static_cast<unsigned char>(authorization[k])) != std::tolower(static_cast<unsigned char>(kBearer[k])))
      return false;
  return key_matches(api_key, authorization.substr(kBearer.size()));
}

std::string request_id(std::string_view h) {
  if (h.empty() || h.size() > 128) return "";
  for (char c : h)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' && c != '-') return "";
  return std::string(h);
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
