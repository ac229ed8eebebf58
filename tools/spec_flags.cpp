// --spec, --draft-model, --spec-k: speculative decoding on serve, run and bench model.
#include "core/error.h"
#include "tools/commands.h"

namespace ft::tools {

void add_spec_flags(CLI::App* c, SpecArgs& a) {
  c->add_option("--spec", a.method, "Speculative decoding: ngram (prompt lookup), draft (--draft-model) or off");
  c->add_option("--draft-model", a.draft_model, "Draft model GGUF sharing the model's tokenizer (implies --spec draft)");
  c->add_option("--spec-k", a.k, "Draft tokens per verification, 1-" + std::to_string(kMaxSpecTokens) +
                                     ", or auto (adapted per request to its acceptance rate; default " +
                                     std::to_string(SpecConfig{}.k) + ")");
}

void apply_spec_flags(const SpecArgs& a, server::ServeConfig& c) {
  if (!a.draft_model.empty()) {
    c.draft_model = a.draft_model;
    if (a.method.empty()) {
      c.enable_speculative_decoding = true;
      c.spec_method = "draft";
    }
  }
  if (!a.method.empty()) {
    const SpecMethod m = parse_spec_method(a.method);
    c.enable_speculative_decoding = m != SpecMethod::Off;
    if (m != SpecMethod::Off) c.spec_method = a.method;
  }
  if (!a.k.empty()) {
    if (a.k == "auto") {
      c.num_speculative_tokens = -1;
    } else {
      size_t used = 0;
      int64_t k = 0;
      try {
        k = std::stoll(a.k, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != a.k.size() || k < 1 || k > kMaxSpecTokens)
        fail("--spec-k must be an integer in [1, ", kMaxSpecTokens, "] or auto, got '", a.k, "'");
      c.num_speculative_tokens = k;
    }
    if (a.method.empty() && a.draft_model.empty() && !c.enable_speculative_decoding) {
      c.enable_speculative_decoding = true;  // --spec-k alone: prompt lookup
    }
  }
}

SpecConfig spec_from_flags(const SpecArgs& a) {
  server::ServeConfig c;
  apply_spec_flags(a, c);
  return server::to_spec_config(c);
}

}  // namespace ft::tools
