// Synthetic models: GGUF files of a named shape with random weights (fixed seed), loadable by
// Model::load and the tokenizer. For tests and benchmarks where no trained model is at hand.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"

namespace ft {

struct SyntheticOptions {
  std::string shape = "tiny";     // a name from synthetic_shapes()
  GGMLType type = GGMLType::F32;  // type of the weight matrices (norms and biases stay F32)
  uint64_t seed = 1234;
  // Optional GGUF whose tokenizer.* metadata is copied (its token count sets n_vocab);
  // empty -> a built-in byte-level "llama" vocabulary.
  std::string vocab_path;
  // "llama", "qwen2" (adds Q/K/V biases), "gemma2" (post-norms, GELU, tied output, soft caps
  // and a sliding window at llama.cpp's defaults), "phi3" (fused QKV and gate/up, a window of
  // half the context): the tensors of the architecture's table (model/arch.cpp).
  std::string arch = "llama";
  // With type Q4_K: llama.cpp's Q4_K_M mix (attn_v and ffn_down in Q6_K for the layers its
  // use_more_bits picks, output in Q6_K).
  bool q4_k_m = false;
};

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

}  // namespace ft
