// libFuzzer target: the chat-template renderer and the format detection over arbitrary
// conversations and template text. Checks: a role outside system/user/assistant/tool fails with
// ft::Error and nothing else; every message's content (what survives the format's strip()) is in the rendered text;
// detection always picks a format, and a format's own name selects it; the template text, run
// by the Jinja interpreter over the conversation, renders or fails with ft::Error (any other
// exception, a crash or a hang is a finding; its work limit is lowered to keep inputs fast).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

namespace {

bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

std::string_view strip(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const auto fmt = static_cast<ft::ChatFormat>(in.ConsumeIntegralInRange<int>(0, 4));
  const bool add_generation_prompt = in.ConsumeBool();
  const std::string bos = in.ConsumeRandomLengthString(16), eos = in.ConsumeRandomLengthString(16);
  std::vector<ft::ChatMessage> messages(in.ConsumeIntegralInRange<size_t>(0, 8));
  bool unknown_role = false;
  for (ft::ChatMessage& m : messages) {
    static const std::string_view kRoles[] = {"system", "user", "assistant", "tool"};
    constexpr int kKnown = static_cast<int>(std::size(kRoles));
    const int r = in.ConsumeIntegralInRange<int>(0, kKnown);
    m.role = r < kKnown ? std::string(kRoles[r]) : in.ConsumeRandomLengthString(12);
    unknown_role = unknown_role || std::find(std::begin(kRoles), std::end(kRoles), m.role) == std::end(kRoles);
    m.content = in.ConsumeRandomLengthString(256);
  }
  try {
    const std::string out = ft::render_chat(fmt, messages, add_generation_prompt, bos, eos);
    FT_FUZZ_CHECK(!unknown_role);
    for (const ft::ChatMessage& m : messages) FT_FUZZ_CHECK(out.find(strip(m.content)) != std::string::npos);
  } catch (const ft::Error&) {
    FT_FUZZ_CHECK(unknown_role);
  }

  const std::string jinja = in.ConsumeRemainingBytesAsString();
  const ft::ChatFormat detected = ft::detect_chat_format(jinja);
  FT_FUZZ_CHECK(ft::parse_chat_format(ft::chat_format_name(detected)) == detected);
  if (const auto named = ft::parse_chat_format(jinja)) FT_FUZZ_CHECK(ft::detect_chat_format(jinja) == *named);

  nlohmann::json context = {{"bos_token", bos}, {"eos_token", eos}, {"add_generation_prompt", add_generation_prompt},
                            {"messages", nlohmann::json::array()}};
  for (const ft::ChatMessage& m : messages) context["messages"].push_back({{"role", m.role}, {"content", m.content}});
  try {
    (void)ft::jinja::Template(jinja).render(context, int64_t(1) << 24);
  } catch (const ft::Error&) {
  }
  return 0;
}
