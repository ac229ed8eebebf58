// The Jinja interpreter against Python's jinja2 (tests/unit/jinja_oracle.py, run as Hugging Face
// runs chat templates): language snippets and the real chat templates of ../shared/templates over
// system / multi-turn / tool-call conversations, byte for byte. Plus its limits (hostile input is
// an error, never a crash) and ChatTemplate's fallback to a built-in format.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

namespace ft {
namespace {

using json = nlohmann::json;

struct Case {
  std::string name, source;
  json context;
};

// Our render: {"ok", "text"} or {"ok": false, "error"}.
json ours(const Case& c) {
  try {
    return {{"ok", true}, {"text", jinja::Template(c.source).render(c.context)}};
  } catch (const Error& e) {
    return {{"ok", false}, {"error", e.what()}};
  }
}

// jinja2's renders of the cases, or a skip reason.
std::string oracle(const std::vector<Case>& cases, json& out) {
  if (std::system("python3 -c 'import jinja2' >/dev/null 2>&1") != 0)
    return "python3 with jinja2 is absent (Debian: python3-jinja2; scripts/setup.sh installs it)";
  test::TempFile in("jinja_cases.json"), res("jinja_results.json");
  json j = {{"cases", json::array()}};
  for (const Case& c : cases) j["cases"].push_back({{"template", c.source}, {"context", c.context}});
  {
    std::FILE* f = std::fopen(in.path().c_str(), "wb");
    const std::string s = j.dump();
    std::fwrite(s.data(), 1, s.size(), f);
    std::fclose(f);
  }
  const std::string script = std::string(FT_SOURCE_DIR) + "/tests/unit/jinja_oracle.py";
  const std::string cmd = "python3 '" + script + "' '" + in.path() + "' > '" + res.path() + "'";
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "the oracle failed: " << cmd;
    return "oracle failed";
  }
  out = json::parse(test::read_file(res.path()));
  return "";
}

// Both succeed with the same bytes, or both fail.
void expect_same(const std::vector<Case>& cases) {
  json want;
  if (const std::string why = oracle(cases, want); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(want.size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const json got = ours(cases[k]);
    const json& w = want[k];
    if (w["ok"] != got["ok"]) {
      ADD_FAILURE() << cases[k].name << ": jinja2 " << (w["ok"] == true ? "renders" : "fails: " + w["error"].get<std::string>())
                    << "; ours " << (got["ok"] == true ? "renders" : "fails: " + got["error"].get<std::string>());
      continue;
    }
    if (w["ok"] == true) {
      const std::string a = w["text"], b = got["text"];
      if (a == b) continue;
      size_t d = 0;
      while (d < a.size() && d < b.size() && a[d] == b[d]) ++d;
      ADD_FAILURE() << cases[k].name << ": differs at byte " << d << "\n  jinja2: "
                    << json(a.substr(d > 40 ? d - 40 : 0, 120)).dump() << "\n  ours:   "
                    << json(b.substr(d > 40 ? d - 40 : 0, 120)).dump();
    }
  }
}

TEST(Jinja, LanguageAgainstJinja2) {
  const json ctx = {{"xs", {3, 1, 2}},
                    {"s", "  Hello, World  "},
                    {"d", {{"b", 1}, {"a", "x"}, {"c", nullptr}}},
                    {"f", 2.5},
                    {"n", nullptr},
                    {"t", true},
                    {"u", "héllo — 日本"},
                    {"msgs", {{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}}}};
  const std::vector<std::pair<std::string, std::string>> snippets = {
      {"text", "plain text\n"},
      {"output", "{{ xs }} {{ d }} {{ f }} {{ n }} {{ t }} {{ missing }} {{ 1/2 }} {{ 7//2 }} {{ -7 % 3 }} {{ 2**10 }}"},
      {"floats", "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 3.0 }} {{ 10 / 4 }} {{ 123456789.125 }}"},
      {"strings", "{{ 'a' ~ 1 ~ none }} {{ \"q'uote\" }} {{ s.strip() }}|{{ s|trim }}|{{ s.lstrip() }}|{{ s.rstrip() }}|"},
      {"methods", "{{ s.lower() }}{{ s.upper() }}{{ s.split(',') }}{{ s.split() }}{{ 'a,b,c'.split(',', 1) }}"
                  "{{ s.startswith('  H') }}{{ s.endswith(('x', '  ')) }}{{ s.replace('l', 'L', 2) }}{{ 'ab'.title() }}"},
      {"unicode", "{{ u|length }} {{ u[1] }} {{ u[-2:] }} {{ u|upper }} {{ u|tojson }} {{ u[::-1] }}"},
      {"slices", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[-1] }} {{ xs[5] }} {{ 'abcdef'[1:5:2] }}"},
      {"if", "{% if n %}a{% elif xs|length > 2 %}b{% else %}c{% endif %}{% if not t %}x{% endif %}"},
      {"for", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
              "{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}"},
      {"for-else-filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}"
                          "{% for x in [] %}x{% else %}empty{% endfor %}"},
      {"for-dict", "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}"
                   "{% for k, v in d|items %}{{ k }}{% endfor %}"},
      {"loopcontrols", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}"
                       "{% endif %}{{ x }}{% endfor %}"},
      {"scoping", "{% set a = 1 %}{% for x in xs %}{% set a = x %}{% endfor %}{{ a }}"
                  "{% set ns = namespace(a=1) %}{% for x in xs %}{% set ns.a = ns.a + x %}{% endfor %}{{ ns.a }}"},
      {"set-block", "{% set blk %}  in {{ xs|length }}  {% endset %}[{{ blk }}]{% set p, q = [1, 2] %}{{ p }}{{ q }}"},
      {"macro", "{% macro m(a, b='B', c=none) %}<{{ a }}{{ b }}{{ c }}>{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}"
                "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}"},
      {"filter-block", "{% filter trim %}   padded   {% endfilter %}|{% filter upper|trim %} x {% endfilter %}"},
      {"tests", "{{ n is none }}{{ xs is iterable }}{{ d is mapping }}{{ s is string }}{{ f is number }}"
                "{{ missing is defined }}{{ xs is not defined }}{{ 3 is odd }}{{ 'a' is in 'abc' }}{{ 1 is equalto 1 }}"
                "{{ t is true }}{{ f is float }}{{ 1 is integer }}"},
      {"operators", "{{ 1 in xs }}{{ 9 not in xs }}{{ 'ell' in s }}{{ 'a' in d }}{{ xs == [3, 1, 2] }}{{ 1 < 2 <= 2 }}"
                    "{{ 'b' if t else 'c' }}{{ 'x' if n }}{{ n or 'dflt' }}{{ t and 'yes' }}{{ [1] + [2] }}{{ 'ab' * 3 }}"},
      {"filters", "{{ xs|join(', ') }}{{ xs|first }}{{ xs|last }}{{ xs|list }}{{ xs|reverse|list }}{{ 'aAb'|unique|list }}"
                  "{{ msgs|map(attribute='role')|join }}{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}"
                  "{{ msgs|rejectattr('role', 'equalto', 'user')|map(attribute='content')|list }}"
                  "{{ [1, 0, 2]|select|list }}{{ ['a', 'b']|reject('equalto', 'a')|list }}{{ missing|default('D') }}"
                  "{{ ''|default('E', true) }}{{ '42'|int + 1 }}{{ 2|float }}{{ -3|abs }}{{ xs|string }}{{ 'x'|capitalize }}"},
      {"tojson", "{{ d|tojson }}|{{ msgs|tojson(indent=2) }}|{{ {'k': [1, 2.5, none, true, 'a\"b\\n']}|tojson }}|{{ []|tojson }}"
                 "{{ {}|tojson(indent=4) }}"},
      {"indent", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(4, true) }}|{{ 'x\\n'|indent }}"},
      {"dict-get", "{{ d.get('a') }}{{ d.get('zz', 'no') }}{{ d.get('zz') }}{{ d['b'] }}{{ d.c }}{{ d.zz is defined }}"},
      {"list-append", "{% set l = [] %}{% for x in xs %}{{ l.append(x * 2) or '' }}{% endfor %}{{ l }}"},
      {"whitespace", "a  {%- if t -%}  b  {%- endif -%}  c\n  {% if t %}\n    d\n  {% endif %}\ne {{- ' f ' -}} g\n{# c #}\n"
                     "  {#- x -#}  h\n{%+ if t %}i{% endif %}"},
      {"raw", "{% raw %}{{ not rendered }}{% endraw %}"},
      {"raise", "{{ raise_exception('nope') }}"},
      {"undefined-attr", "{{ missing.attr }}"},
      {"str-plus-int", "{{ 'a' + 1 }}"},
      {"literals", "{{ (1, 2) }}{{ (1,) }}{{ {'a': 1} }}{{ 'ab' 'cd' }}{{ True }}{{ None }}{{ -f }}"},
  };
  std::vector<Case> cases;
  for (const auto& [name, src] : snippets) cases.push_back({name, src, ctx});
  expect_same(cases);
}

// The conversations every real template renders.
struct Conversation {
  std::string name;
  std::vector<ChatMessage> messages;
  json tools;
  bool add_generation_prompt;
  bool object_arguments = true;   // (tool-call arguments as an object; false: as their text)
  bool null_call_content = true;  // (false: "" beside calls, as gpt-oss's template needs)
};

std::vector<Conversation> conversation_list() {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Get the current weather in a city", "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "description": "The city"}, "unit": {"type": "string", "enum": ["c", "f"]}},
      "required": ["city"]}}}])");
  const ChatMessage sys{"system", "You are a helpful assistant."};
  const ChatMessage u1{"user", "Hello"};
  const ChatMessage a1{"assistant", "Hi there! How can I help?"};
  const ChatMessage u2{"user", "What's the weather in Paris? ☀️"};
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Paris", "unit": "c"})"});
  ChatMessage result{"tool", R"({"temperature": 22})"};
  result.tool_call_id = "call_1";
  result.name = "get_weather";
  const ChatMessage padded{"user", "  padded question \n"};
  ChatMessage reasoned_call = call, reasoned{"assistant", "It is 22 °C."};
  reasoned_call.reasoning = "The user wants the weather: call get_weather.";
  reasoned.reasoning = "22 degrees: answer briefly.";
  ChatMessage preamble_call = reasoned_call;
  preamble_call.content = "Let me check.";
  return {{"single-user", {u1}, nullptr, true},
          {"system-multi-turn", {sys, u1, a1, u2}, nullptr, true},
          {"system-multi-turn-no-gen", {sys, u1, a1}, nullptr, false},
          {"multi-turn", {u1, a1, padded}, nullptr, true},
          {"tools-offered", {sys, u2}, tools, true},
          {"tool-round-trip", {u2, call, result}, tools, true},
          {"tool-round-trip-text-arguments", {u2, call, result}, tools, true, false},
          {"tool-round-trip-system", {sys, u2, call, result, {"assistant", "It is 22 °C in Paris."}}, tools, false},
          // Reasoning sent back: of a call with no answer yet (and beside a preamble), of the last
          // turn (no generation prompt), of an earlier answer.
          {"reasoned-tool-round-trip", {u2, reasoned_call, result}, tools, true, true, false},
          {"reasoned-call-with-preamble", {u2, preamble_call, result}, tools, true, true, false},
          {"reasoned-last-turn", {u2, reasoned_call, result, reasoned}, tools, false, true, false},
          {"reasoned-answer-last", {u1, reasoned}, nullptr, false},
          {"reasoned-answer-earlier", {u1, reasoned, u2}, nullptr, true}};
}

// Their template variables (chat_template_context, the server's own path from OpenAI messages).
std::vector<std::pair<std::string, json>> conversations() {
  std::vector<std::pair<std::string, json>> out;
  for (const Conversation& c : conversation_list())
    out.emplace_back(c.name, chat_template_context(c.messages, c.tools, c.add_generation_prompt, "<s>", "</s>",
                                                   c.object_arguments, c.null_call_content));
  return out;
}

// Reasoning sent back reaches templates as reasoning_content, and as thinking (gpt-oss's name)
// but beside a call with content (gpt-oss's template refuses both: the content is its analysis).
TEST(Jinja, ReasoningReachesTemplatesAsTheyReadIt) {
  ChatMessage a{"assistant", "text"}, b{"assistant", ""}, c{"assistant", "text"};
  a.reasoning = b.reasoning = c.reasoning = "why";
  b.tool_calls.push_back({"call_1", "f", "{}"});
  c.tool_calls.push_back({"call_2", "f", "{}"});
  const json ctx = chat_template_context({{"user", "u"}, a, b, c, {"assistant", "plain"}}, nullptr, true, "", "");
  const json& m = ctx["messages"];
  EXPECT_EQ(m[1]["reasoning_content"], "why");
  EXPECT_EQ(m[1]["thinking"], "why");
  EXPECT_EQ(m[2]["thinking"], "why");
  EXPECT_EQ(m[3]["reasoning_content"], "why");
  EXPECT_FALSE(m[3].contains("thinking"));
  EXPECT_FALSE(m[4].contains("reasoning_content"));
  EXPECT_FALSE(m[4].contains("thinking"));
}

// The built-in gpt-oss format (used where a file has no template, or one that cannot run)
// renders what gpt-oss's own template renders, byte for byte, on every conversation above.
TEST(Jinja, BuiltInHarmonyRendersAsGptOssTemplate) {
  const std::string src = test::read_file(std::string(FT_SOURCE_DIR) + "/tests/data/templates/openai-gpt-oss-120b.jinja");
  ASSERT_FALSE(src.empty());
  std::string warning;
  const ChatTemplate real = ChatTemplate::from_gguf(src, "<s>", "</s>", warning);
  ASSERT_TRUE(real.is_jinja()) << warning;
  EXPECT_TRUE(real.harmony());
  const ChatTemplate builtin(ChatFormat::Harmony, "<s>", "</s>");
  for (const Conversation& c : conversation_list()) {
    if (!c.object_arguments) continue;  // (the same conversation)
    EXPECT_EQ(builtin.render(c.messages, c.tools, c.add_generation_prompt), real.render(c.messages, c.tools, c.add_generation_prompt))
        << c.name;
  }
}

// The shared templates, and newer ones of our own test data (tests/data/templates: Qwen3's,
// gpt-oss's), each over the conversations above.
TEST(Jinja, RealChatTemplatesAgainstJinja2) {
  const std::string dir = test::shared_file("templates");
  if (dir.empty()) GTEST_SKIP() << "shared test data absent: templates";
  std::vector<Case> cases;
  size_t n_templates = 0;
  for (const std::string& d : {dir, std::string(FT_SOURCE_DIR) + "/tests/data/templates"})
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      if (e.path().extension() != ".jinja") continue;
      ++n_templates;
      const std::string src = test::read_file(e.path().string());
      for (const auto& [name, ctx] : conversations()) cases.push_back({e.path().stem().string() + "/" + name, src, ctx});
    }
  ASSERT_GE(n_templates, 12u);
  expect_same(cases);
  // Not a suite of shared failures: most renders succeed (the rest are the templates' own refusals:
  // Gemma's of a system turn, Firefunction's need of `functions`, Command-R's and Hermes' of no tools).
  size_t ok = 0;
  for (const Case& c : cases) ok += ours(c)["ok"] == true;
  EXPECT_GE(ok, cases.size() * 7 / 10) << ok << " of " << cases.size() << " render";
}

TEST(Jinja, HostileTemplatesAreErrorsNotCrashes) {
  const auto fails = [](const std::string& src, const std::string& needle) {
    try {
      jinja::Template(src).render(json::object());
      ADD_FAILURE() << "rendered: " << src.substr(0, 60);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}", "too deeply");
  fails("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}", "too deeply");
  std::string nested;
  for (int k = 0; k < 1000; ++k) nested += "{% if true %}";
  fails(nested, "too deeply");
  fails("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "too deep");
  // (A million iterations before the cap: ~40 s under ASan, which adds nothing to Release's run.)
  if (!test::kSanitized)
    fails("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "iterations");
  fails("{{ 'x' * 9000000000000 }}", "too long");
  EXPECT_EQ(jinja::Template("{{ '' * 9223372036854775807 }}|").render(json::object()), "|");
  fails("{{ 9223372036854775807 + 1 }}", "overflow");
  fails("{{ 1 // 0 }}", "zero");
  fails("{% for x in xs %}", "endfor");
  fails("{{ x", "unclosed");
  fails("{% include 'other.jinja' %}", "unsupported tag");
  fails("{{ x|no_such_filter }}", "unknown filter");
  fails("{{ 'unterminated }}", "unterminated");
  // Values that hold themselves (printing or comparing them recursed until the stack overflowed;
  // a render that made one leaked it: LeakSanitizer checks that they are freed).
  fails("{% set ns = namespace(x=none) %}{% set ns.x = ns %}{{ ns }}", "nests");
  fails("{% set l = [] %}{{ l.append(l) }}{{ l }}", "nests");
  fails("{% set l = [] %}{{ l.append(l) }}{{ l == l }}", "nests");
  fails("{% set l = [] %}{{ l.append(l) }}{{ l|tojson }}", "nests");
  // Work without nesting: a list doubled 60 times (2^60 elements to compare or print: with a
  // smaller work limit than kRenderWork, for time), strings past the 64 MB cap by a join, a
  // replace that multiplies a string's length.
  const std::string doubled = "{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}";
  const auto fails_within = [](const std::string& src, int64_t work, const std::string& needle) {
    try {
      jinja::Template(src).render(json::object(), work);
      ADD_FAILURE() << "rendered: " << src.substr(0, 60);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails_within(doubled + "{{ ns.a == ns.a }}", int64_t(1) << 26, "units of work");
  fails_within(doubled + "{{ ns.a }}", int64_t(1) << 26, "units of work");
  fails_within(doubled + "{{ ns.a|tojson }}", int64_t(1) << 26, "units of work");
  if (!test::kSanitized) {  // (64-80 MB strings: ~0.3-0.8 s each, under ASan several times that)
    fails("{{ ('x' * 40000000) ~ ('x' * 40000000) }}", "a string of more than");
    fails("{{ ('x' * 1000)|replace('', 'y' * 200000) }}", "replace: more than");
    fails(doubled + "{{ ns.a }}", "repr: more than");
  }
  // A big string read in a loop: each read copies it, and copies count (with a smaller limit than
  // kRenderWork: 100 MB of reads at least).
  const std::string reads = "{% set s = 'x' * 100000 %}{% for i in range(1000) %}{% if s %}{% endif %}{% endfor %}";
  EXPECT_THROW(jinja::Template(reads).render(json::object(), 50'000'000), Error);
  EXPECT_NO_THROW(jinja::Template(reads).render(json::object()));
  // Powers by squaring (a loop of b multiplications never ended for 1 ** 2^63 - 1).
  const auto out = [](const std::string& src) { return jinja::Template(src).render(json::object()); };
  EXPECT_EQ(out("{{ 1 ** 9223372036854775807 }} {{ 0 ** 9223372036854775807 }} {{ (-1) ** 9223372036854775807 }}"), "1 0 -1");
  EXPECT_EQ(out("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 39 }} {{ 7 ** 0 }}"),
            "4611686018427387904 -9223372036854775808 4052555153018976267 1");
  fails("{{ 2 ** 63 }}", "overflow");
  // range() steps past INT64_MAX without overflowing.
  EXPECT_EQ(out("{{ range(9223372036854775805, 9223372036854775807, 5)|list }}"), "[9223372036854775805]");
}

TEST(Jinja, ChatTemplateUsesJinjaOrFallsBackWithAWarning) {
  std::string warning;
  const char* qwen_like =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  const ChatTemplate j = ChatTemplate::from_gguf(qwen_like, "<s>", "</s>", warning);
  EXPECT_TRUE(j.is_jinja());
  EXPECT_TRUE(warning.empty()) << warning;
  EXPECT_EQ(j.render({{"user", "Hi"}}, nullptr, true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  // Unrunnable (a call block, here): the built-in format it resembles, and why.
  const ChatTemplate f = ChatTemplate::from_gguf(
      "{% call foo() %}x{% endcall %}{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}", "", "", warning);
  EXPECT_FALSE(f.is_jinja());
  EXPECT_EQ(f.format(), ChatFormat::ChatML);
  EXPECT_NE(warning.find("cannot be run"), std::string::npos) << warning;
  EXPECT_NE(warning.find("chatml"), std::string::npos) << warning;

  // A template that raises on the probe conversation with a system turn but takes one without is
  // run (Gemma's refuses system turns; that is its rule, not a failure of the interpreter).
  const ChatTemplate g = ChatTemplate::from_gguf(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
      "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}",
      "", "", warning);
  EXPECT_TRUE(g.is_jinja()) << warning;
  try {
    g.render({{"system", "s"}, {"user", "u"}}, nullptr, true);
    ADD_FAILURE() << "the template's raise_exception was not raised";
  } catch (const jinja::Raised& e) {
    EXPECT_NE(std::string(e.what()).find("System role not supported"), std::string::npos);
  }

  // Tool-call arguments: as an object for templates that index them, as text for those that
  // concatenate them.
  std::vector<ChatMessage> conv = {{"user", "Weather?"}, {"assistant", ""}};
  conv[1].tool_calls.push_back({"call_1", "get_weather", R"({"city": "Paris"})"});
  const ChatTemplate as_text = ChatTemplate::from_gguf(
      "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ 'CALL ' + c.function.arguments }}{% endfor %}{% endfor %}",
      "", "", warning);
  EXPECT_EQ(as_text.render(conv, nullptr, false), R"(CALL {"city": "Paris"})");
  const ChatTemplate as_object = ChatTemplate::from_gguf(
      "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments.city }}{% endfor %}{% endfor %}",
      "", "", warning);
  EXPECT_EQ(as_object.render(conv, nullptr, false), "Paris");

  // No template, or a format name: the built-in format, no warning.
  EXPECT_FALSE(ChatTemplate::from_gguf("", "", "", warning).is_jinja());
  EXPECT_TRUE(warning.empty());
  EXPECT_EQ(ChatTemplate::from_gguf("llama3", "", "", warning).format(), ChatFormat::Llama3);
}

}  // namespace
}  // namespace ft
