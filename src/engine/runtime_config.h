// Runtime settings (chosen by the user at start-up), kept apart from the model's immutable
// hyperparameters (HParams).
#pragma once
#include <cstdint>
#include <string>

#include "gguf/ggml_types.h"

namespace ft {

struct RuntimeConfig {
  std::string backend = "cpu";
  int threads = 0;             // 0 = all hardware threads
  int64_t n_ctx = 0;           // max positions per sequence; 0 = the model's trained context
  int32_t kv_block_size = 16;  // positions per KV cache block
  GGMLType kv_type = GGMLType::F16;  // KV cache element type: F16, BF16, Q8_0 or F32 (kv_layout.h)
  int64_t max_batch = 512;     // tokens per forward pass (prefill chunk size)
  bool mlock = false;          // pin the weights in RAM (Engine::weights_summary says how it went)
};

// threads resolved against the machine.
int resolve_threads(int threads);

}  // namespace ft
