// Runtime settings (chosen by the user at start-up), kept apart from the model's immutable
// hyperparameters (HParams).
#pragma once
#include <cstdint>
#include <string>

namespace ft {

struct RuntimeConfig {
  std::string backend = "cpu";
  int threads = 0;             // 0 = all hardware threads
  int64_t n_ctx = 0;           // max positions per sequence; 0 = the model's trained context
  int32_t kv_block_size = 16;  // positions per KV cache block
  int64_t max_batch = 512;     // tokens per forward pass (prefill chunk size)
};

// threads resolved against the machine.
int resolve_threads(int threads);

}  // namespace ft
