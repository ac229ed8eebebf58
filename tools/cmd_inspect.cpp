// `firsttoken inspect`: metadata, hyperparameters and (optionally) tensors of a GGUF file.
#include <cstdio>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tools/commands.h"

namespace ft::tools {

void add_inspect(CLI::App& app, InspectArgs& a) {
  CLI::App* c = app.add_subcommand("inspect", "Validate a GGUF file and print its metadata");
  c->add_option("-m,--model,model", a.model, "GGUF file")->required();
  c->add_flag("--tensors", a.tensors, "Also list every tensor");
}

namespace {
std::string brief(const GGUFValue& v) {
  switch (v.type) {
    case GGUFValueType::STRING: return v.str.size() > 80 ? cat('"', v.str.substr(0, 77), "...\"") : cat('"', v.str, '"');
    case GGUFValueType::ARRAY: return cat("[", v.array.size(), " x ", value_type_name(v.elem_type), "]");
    case GGUFValueType::BOOL: return v.b ? "true" : "false";
    case GGUFValueType::FLOAT32: case GGUFValueType::FLOAT64: return cat(v.f);
    default: return v.is_integer() ? (v.type == GGUFValueType::INT8 || v.type == GGUFValueType::INT16 ||
                                      v.type == GGUFValueType::INT32 || v.type == GGUFValueType::INT64
                                          ? cat(v.i) : cat(v.u))
                                   : "?";
  }
}
}  // namespace

int cmd_inspect(const InspectArgs& a) {
  const auto f = GGUFFile::open(a.model);
  std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors, alignment %llu\n", a.model.c_str(),
              f->version(), f->metadata().size(), f->tensors().size(), (unsigned long long)f->alignment());
  for (const auto& [k, v] : f->metadata()) std::printf("  %-45s %s\n", k.c_str(), brief(v).c_str());
  if (a.tensors)
    for (const auto& t : f->tensors()) {
      std::string shape;
      for (size_t i = 0; i < t.ne.size(); ++i) shape += cat(i ? ", " : "", t.ne[i]);
      std::printf("  %-40s %-6s [%s]\n", t.name.c_str(), type_traits(t.type).name.data(), shape.c_str());
    }
  if (f->has("general.architecture") && !f->tensors().empty()) {
    const auto m = Model::load(a.model);
    const HParams& hp = m->hparams();
    std::printf("model: %s, dim %d, %d layers, %d heads (%d KV, head dim %d), ffn %d, vocab %d, ctx %d, "
                "rope base %g, %s embeddings, %.1f MiB of weights\n",
                hp.arch_name.c_str(), hp.dim, hp.n_layers, hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.ffn_dim,
                hp.n_vocab, hp.ctx_len, double(hp.rope.freq_base), hp.tied_embeddings ? "tied" : "separate",
                double(m->weight_bytes()) / (1 << 20));
    if (hp.sliding_window > 0) {
      if (hp.swa_layers == SwaLayers::Period) {
        std::string global;
        for (int32_t il = hp.swa_period - 1, n = 0; il < hp.n_layers && n < 4; il += hp.swa_period, ++n)
          global += cat(n ? ", " : "", n == 3 ? "..." : std::to_string(il));
        std::printf("  sliding window %d on every layer but %s (global)\n", hp.sliding_window,
                    global.empty() ? "none" : global.c_str());
      } else {
        std::printf("  sliding window %d on all layers\n", hp.sliding_window);
      }
      if (hp.swa_rope_base > 0)
        std::printf("  windowed layers: rope base %g, unscaled\n", double(hp.swa_rope_base));
    }
    if (hp.n_experts > 0)
      std::printf("  mixture of experts: %d experts of ffn %d, %d per token\n", hp.n_experts, hp.expert_ffn_dim,
                  hp.n_experts_used);
    if (hp.yarn_factor > 0)
      std::printf("  rope scaling: yarn, factor %g over an original context of %d (attention factor %g)\n",
                  double(hp.yarn_factor), hp.yarn_orig_ctx, double(hp.yarn_mscale));
    else if (hp.rope.freq_scale != 1.0f)
      std::printf("  rope scaling: linear, factor %g\n", double(1.0f / hp.rope.freq_scale));
    if (hp.attn_softcap > 0 || hp.final_softcap > 0)
      std::printf("  soft caps: attention scores %g, final logits %g\n", double(hp.attn_softcap),
                  double(hp.final_softcap));
  }
  return 0;
}

}  // namespace ft::tools
