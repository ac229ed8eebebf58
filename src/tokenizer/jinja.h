// A Jinja interpreter for the subset chat templates use, configured as Hugging Face runs them
// (trim_blocks, lstrip_blocks, loop controls; the template's single trailing newline dropped).
// No C++ Jinja library is packaged for Debian, so this is our own; its oracle is Python's jinja2
// (tests/unit/test_jinja.cpp renders the real templates of ../shared/templates with both).
//
// Supported: {{ }}, {% if/elif/else %}, {% for x[, y] in e [if c] %} with else and loop.* (index,
// index0, revindex, revindex0, first, last, length, previtem, nextitem), break/continue,
// {% set x = e %} (also ns.attr and tuple targets), {% set x %}...{% endset %}, {% macro %} with
// defaults and keyword arguments, {% filter f %}, {% raw %}, comments, whitespace control (- and +).
// Expressions: literals (strings, numbers, lists, dicts, tuples, true/false/none), attribute and
// item access, slicing, calls, `if`-`else`, or/and/not, comparisons, in / not in, is [not] tests,
// + - * / // % **, ~, filters. Python semantics where templates depend on them: truthiness,
// str()/repr() of values, list/dict reference semantics, scoping (a set inside a loop or macro
// stays there; namespace() objects cross it). Globals: range, namespace, dict, raise_exception,
// strftime_now. Filters, tests and methods: see the tables in jinja.cpp. tojson is Hugging Face's
// (json.dumps with ensure_ascii=False, keys in insertion order), not jinja2's HTML-safe one.
//
// Limits (a hostile template or input cannot exhaust the stack, memory or time): expression and
// statement nesting depth, macro recursion depth, loop iterations, output size, a string's
// size, a list's length, the depth of a value printed or compared (a list may hold itself), and
// the render's work (kRenderWork: bytes of the strings built or copied, values visited) are
// bounded; exceeding one is a LimitExceeded (an ft::Error).
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ft::jinja {

struct Node;

// What raise_exception(msg) throws: the template refused its input (a request error, not a
// failure of the interpreter).
struct Raised : Error {
  using Error::Error;
};

// What a render throws past one of its limits (work, loop iterations, the output's or a string's
// size, a list's length, nesting): another try with the same input costs as much again and ends
// the same way (ChatTemplate::render does not retry it).
struct LimitExceeded : Error {
  using Error::Error;
};

// A render's work at most (Template::render): ~2-10 s of copying, far beyond a real chat
// template's (a 2,000-message conversation accumulated into one string: ~1.5e9).
inline constexpr int64_t kRenderWork = int64_t(1) << 32;

class Template {
 public:
  // Parses; throws ft::Error "jinja: line N: what" on a syntax error or an unsupported construct.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (a JSON object; JSON numbers keep their int/float
  // kind; dicts' keys in its order: a json's are sorted). Throws Raised on raise_exception(msg),
  // LimitExceeded past a limit, ft::Error on any other render failure.
  std::string render(const nlohmann::ordered_json& context, int64_t work_limit = kRenderWork) const;

 private:
  std::unique_ptr<Node> root_;
};

}  // namespace ft::jinja
