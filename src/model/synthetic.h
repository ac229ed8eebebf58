// Synthetic models: GGUF files of a named shape with random weights (fixed seed), loadable by
// Model::load and the tokenizer. For tests and benchmarks where no trained model is at hand.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"
#include "model/arch.h"

namespace ft {

struct SyntheticOptions {
  std::string shape = "tiny";     // a name from synthetic_shapes()
  GGMLType type = GGMLType::F32;  // type of the weight matrices (norms and biases stay F32)
  uint64_t seed = 1234;
  // Optional GGUF whose tokenizer.* metadata is copied (its token count sets n_vocab);
  // empty -> a built-in byte-level "llama" vocabulary.
  std::string vocab_path;
  // "llama", "qwen2" (adds Q/K/V biases), "qwen3" (q/k norms), "gemma2" (post-norms, GELU, tied
  // output, soft caps and a sliding window at llama.cpp's defaults), "gemma3" (gemma2's without
  // soft caps, q/k norms, five windowed layers then a global one), "phi3" (fused QKV and gate/up,
  // a window of half the context), "granite" (Llama's with Granite's four multipliers), "olmo2"
  // (post-norms only, q/k norms over the whole projection), "gemma" (gemma2's without post-norms,
  // soft caps or window), "qwen2moe" (qwen2's attention, 4 experts of which 2 used, and a shared
  // expert): the tensors of the architecture's
  // table (model/arch.cpp).
  std::string arch = "llama";
  // Overrides of the shape and the architecture's defaults (0: none), for tests that need more
  // layers (gemma3's global layer is its sixth), a head width other than dim / heads (qwen3's
  // attention.key_length), a window shorter than their prompts (architectures with windowed
  // layers only), or linear RoPE scaling.
  int32_t n_layers = 0;
  int32_t head_dim = 0;
  int32_t n_kv_heads = 0;  // (the reference reads olmo2 only without GQA: its k norm is dim wide)
  int32_t sliding_window = 0;
  float rope_scale = 0;                 // rope.scaling.factor, of type rope_scaling
  std::string rope_scaling = "linear";  // "linear" or "yarn"
  int32_t rope_orig_ctx = 0;            // rope.scaling.original_context_length (0: not written)
  // Mixture of experts (qwen3moe; llama with n_experts > 0, as Mixtral): experts per layer and
  // used per token (0: 4 and 2 where the architecture has only experts); each expert's FFN is
  // the shape's width.
  int32_t n_experts = 0, n_experts_used = 0;
  // llama.cpp's "_M" mixes of the K types (llama_tensor_get_type, no importance matrix):
  //   Q4_K_M / Q5_K_M (type Q4_K / Q5_K): attn_v and ffn_down in Q6_K for the layers its
  //     use_more_bits picks, output in Q6_K;
  //   Q3_K_M (type Q3_K): attn_v Q5_K in layers 0-1 then Q4_K, ffn_down Q5_K in the first
  //     n_layers/16 layers then Q4_K, attn_output Q4_K, output Q6_K.
  enum class Mix { None, Q4_K_M, Q5_K_M, Q3_K_M };
  Mix mix = Mix::None;
};

// "q4_k_m", "q5_k_m", "q3_k_m" -> the mix and its base type; nullopt for other names.
struct NamedMix {
  SyntheticOptions::Mix mix;
  GGMLType base;
};
std::optional<NamedMix> parse_mix_name(std::string_view name);

// The type of one weight matrix under a mix: its role, whether the architecture table always
// gives it more bits (the output) or does in this layer (use_more_bits: attn_v, ffn_down).
GGMLType mix_tensor_type(SyntheticOptions::Mix mix, GGMLType base, Role role, bool always_more_bits,
                         bool more_bits, int32_t layer, int32_t n_layers);

struct SyntheticShape {
  std::string name;
  int dim, n_layers, n_heads, n_kv_heads, ffn_dim;
  int n_vocab;  // 0 = from the vocabulary (259 for the built-in one)
  int ctx_len;
};

// tiny (dim 64), tiny-256 (dim 256: rows whole k-quant blocks), 110m, tinyllama-1.1b.
const std::vector<SyntheticShape>& synthetic_shapes();

// Writes a GGUF with random weights: matrices ~ N(0, 1/fan_in) so activations stay O(1), norms
// ~ 1 + small noise. The bytes depend only on the options (not on the thread count). Throws
// ft::Error on bad options: an unknown shape (listing the known ones), an unknown arch, an
// unsupported type, or a type whose block size does not divide a tensor's row length (naming
// the tensor). progress(f) is called with the fraction done, in [0, 1], from this thread.
void write_synthetic_model(const SyntheticOptions& opt, const std::string& path,
                           std::function<void(float)> progress = {});

// A random LoRA adapter (model/lora.h's format) for the model at base_path, on every layer
// matrix (attention and FFN; phi3's fused ones whole): A (rank, in) ~ N(0, 1/in), B (out, rank)
// ~ N(0, 0.25/rank) (real adapters start B at 0; random ones make each adapter's output differ),
// adapter.lora.alpha = alpha, tensors of `type` (F32, F16 or Q8_0: a Q8_0 B needs rank a multiple
// of 32). With merged_path, also that model with the adapter merged: W + (alpha/rank) B A from
// the adapter's stored (rounded) values, in each weight's own type (exact for F32; requantized
// otherwise), every other tensor and key copied.
struct SyntheticLoraOptions {
  int32_t rank = 16;
  float alpha = 32;
  GGMLType type = GGMLType::F32;
  uint64_t seed = 1;
};
void write_synthetic_lora(const std::string& base_path, const SyntheticLoraOptions& opt, const std::string& adapter_path,
                          const std::string& merged_path = {});

}  // namespace ft
