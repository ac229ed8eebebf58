// `firsttoken make-model`: synthetic random-weight GGUF models of named shapes.
#include <cstdio>
#include <unistd.h>

#include "core/error.h"
#include "model/arch.h"
#include "model/synthetic.h"
#include "tools/commands.h"

namespace ft::tools {

void add_make_model(CLI::App& app, MakeModelArgs& a) {
  CLI::App* c = app.add_subcommand(
      "make-model", "Write a synthetic GGUF model (random weights, fixed seed) of a named shape");
  std::string shapes;
  for (const auto& s : synthetic_shapes()) shapes += (shapes.empty() ? "" : ", ") + s.name;
  c->add_option("--shape", a.shape, "Shape: " + shapes)->capture_default_str();
  c->add_option("--type", a.type,
                "Weight type: " + supported_weight_type_names() +
                    ", or one of llama.cpp's mixes q4_k_m, q5_k_m (with q6_k), q3_k_m (with q4_k, q5_k, q6_k)")
      ->capture_default_str();
  c->add_option("--vocab", a.vocab, "GGUF to take the tokenizer from (default: built-in byte-level vocab)");
  c->add_option("--arch", a.arch, "Architecture: " + known_archs())->capture_default_str();
  c->add_option("--seed", a.seed, "Random seed")->capture_default_str();
  c->add_option("--layers", a.layers, "Layers (default: the shape's)");
  c->add_option("--head-dim", a.head_dim, "Width of an attention head (default: dim / heads; else written as key_length)");
  c->add_option("--kv-heads", a.kv_heads, "Key/value heads (default: the shape's; a divisor of its heads)");
  c->add_option("--window", a.window, "Sliding window of the architecture's windowed layers (default: the architecture's)");
  c->add_option("--rope-scale", a.rope_scale, "RoPE scaling factor (rope.scaling.factor; default: none)");
  c->add_option("--rope-scaling", a.rope_scaling, "--rope-scale's type: linear or yarn")->capture_default_str();
  c->add_option("--yarn-orig-ctx", a.rope_orig_ctx, "rope.scaling.original_context_length (default: not written)");
  c->add_option("--experts", a.experts, "A mixture of experts: experts per layer (qwen3moe: default 4; llama: Mixtral's form)");
  c->add_option("--experts-used", a.experts_used, "Experts per token (default 2)");
  c->add_option("-o,--out", a.out, "Output file")->required();
  c->add_option("--draft-out", a.draft_out,
                "Also write the same weights (same seed) at --draft-type: a draft model for speculative decoding");
  c->add_option("--draft-type", a.draft_type, "Weight type of --draft-out")->default_str("q8_0");
  c->add_option("--lora-rank", a.lora_rank, "Also write a random LoRA adapter of this rank (--lora-out)");
  c->add_option("--lora-out", a.lora_out, "The adapter's GGUF (llama.cpp's adapter format)");
  c->add_option("--lora-alpha", a.lora_alpha, "adapter.lora.alpha (scale = alpha / rank; default 2 x rank)");
  c->add_option("--lora-type", a.lora_type, "Type of the adapter's tensors: f32, f16, q8_0 (B in f16 where its rows of rank are not whole blocks)")->capture_default_str();
  c->add_option("--lora-seed", a.lora_seed, "The adapter's random seed (another seed, another adapter)")
      ->capture_default_str();
  c->add_option("--merged-out", a.merged_out, "Also write the model with the adapter merged (W + alpha/rank B A)");
}

namespace {

// A --type / --draft-type name (a weight type or one of llama.cpp's mixes) into opt.
void set_type(SyntheticOptions& opt, const std::string& name, const char* flag) {
  const auto mix = parse_mix_name(name);
  const auto type = mix ? std::optional<GGMLType>(mix->base) : parse_type_name(name);
  if (!type || !is_supported_weight_type(*type))
    fail("unsupported ", flag, " '", name, "' (", supported_weight_type_names(), ", q4_k_m, q5_k_m, q3_k_m)");
  opt.mix = mix ? mix->mix : SyntheticOptions::Mix::None;
  opt.type = *type;
}

}  // namespace

int cmd_make_model(const MakeModelArgs& a) {
  SyntheticOptions opt;
  opt.shape = a.shape;
  set_type(opt, a.type, "weight type");
  opt.seed = a.seed;
  opt.vocab_path = a.vocab;
  opt.arch = a.arch;
  opt.n_layers = a.layers;
  opt.head_dim = a.head_dim;
  opt.n_kv_heads = a.kv_heads;
  opt.sliding_window = a.window;
  opt.rope_scale = a.rope_scale;
  opt.rope_scaling = a.rope_scaling;
  opt.rope_orig_ctx = a.rope_orig_ctx;
  opt.n_experts = a.experts;
  opt.n_experts_used = a.experts_used;
  const bool tty = isatty(STDERR_FILENO);
  write_synthetic_model(opt, a.out, [tty](float frac) {
    if (tty) std::fprintf(stderr, "\rwriting... %3.0f%%", double(frac) * 100);
  });
  if (tty) std::fprintf(stderr, "\n");
  std::fprintf(stderr, "wrote %s (%s, %s, random weights)\n", a.out.c_str(), a.shape.c_str(), a.type.c_str());
  if (!a.draft_out.empty()) {
    const std::string dt = a.draft_type.empty() ? "q8_0" : a.draft_type;
    set_type(opt, dt, "--draft-type");
    write_synthetic_model(opt, a.draft_out);
    std::fprintf(stderr, "wrote %s (%s, %s, the same weights: a draft)\n", a.draft_out.c_str(), a.shape.c_str(), dt.c_str());
  }
  if (a.lora_rank > 0 || !a.lora_out.empty() || !a.merged_out.empty()) {
    if (a.lora_rank <= 0 || a.lora_out.empty()) fail("make-model: a LoRA adapter needs --lora-rank R and --lora-out FILE");
    SyntheticLoraOptions lo;
    lo.rank = a.lora_rank;
    lo.alpha = a.lora_alpha > 0 ? a.lora_alpha : 2.0f * float(a.lora_rank);
    const auto t = parse_type_name(a.lora_type);
    if (!t) fail("unsupported --lora-type '", a.lora_type, "' (f32, f16, q8_0)");
    lo.type = *t;
    lo.seed = a.lora_seed;
    write_synthetic_lora(a.out, lo, a.lora_out, a.merged_out);
    std::fprintf(stderr, "wrote %s (LoRA rank %d, alpha %g, %s)%s%s\n", a.lora_out.c_str(), lo.rank, double(lo.alpha),
                 a.lora_type.c_str(), a.merged_out.empty() ? "" : " and the merged model ", a.merged_out.c_str());
  }
  return 0;
}

}  // namespace ft::tools
