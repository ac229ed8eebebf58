// LoRA adapters in the GGUF format llama.cpp's convert_lora_to_gguf.py writes, applied per request.
//
// File: general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (float), and
// general.architecture = the base's. For each adapted weight "<base name>" (e.g.
// "blk.3.attn_q.weight") two tensors: "<base name>.lora_a", a matrix (rank, in) = GGUF ne
// [in, rank], and "<base name>.lora_b", (out, rank) = ne [rank, out], in F32, F16 or Q8_0 (a Q8_0
// row must be whole 32-blocks: rank a multiple of 32 for B). Every layer matrix of the forward
// pass may be adapted: attn_q/k/v, attn_qkv (phi3), attn_output, ffn_gate/up/down, ffn_up as
// phi3's fused gate+up; others (embeddings, output) are refused by name.
//
// The forward pass adds scale * B (A x) to the output of each adapted weight, scale = alpha /
// rank, per adapter segment of the batch (Batch::lora), in two steps per input (Forward):
//   shrink: the A's of the projections that read the same input (Q/K/V; O; gate/up; down) are
//     stacked at load into one matrix, so ya = scale * A_stack x is ONE segmented GEMM
//     (Backend::matmul_runs) for every adapter in the batch;
//   expand: each projection's GEMM adds ya's columns of its slot times B^T in its epilogue
//     (LoraDelta), before the bias, RoPE, gate activation or residual add, which stay fused.
// F16 tensors stay F16 (half the bytes a decode step reads); a Q8_0 A stays Q8_0 (the shrink
// on the integer path, int8 activations as for the base's quantized weights; llama.cpp's
// converter writes rank-16 adapters at --outtype q8_0 as Q8_0 A's and F16 B's, whose rows of 16
// are not whole blocks); a Q8_0 B becomes F32 (the epilogue's expand is float). prepare() puts
// A and B in the backend's packed layout.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace ft {

// The largest rank an adapter may have (the cpu backend's epilogue takes B's rank in one chunk).
inline constexpr int32_t kMaxLoraRank = 256;
// The widest stack of A's (Q, K and V: three ranks): Forward's per-row scratch for ya.
inline constexpr int32_t kMaxLoraStack = 3 * kMaxLoraRank;

class LoraAdapter {
 public:
  // Maps, validates against `base` (architecture, tensor names, shapes; ft::Error naming the
  // file and the tensor, expected vs actual) and converts. The adapter may be used by forward
  // passes of `base` only.
  static std::unique_ptr<LoraAdapter> load(const std::string& path, const Model& base);
  // The same over a file already parsed.
  static std::unique_ptr<LoraAdapter> bind(std::unique_ptr<GGUFFile> file, const Model& base);
  ~LoraAdapter();
  LoraAdapter(const LoraAdapter&) = delete;
  LoraAdapter& operator=(const LoraAdapter&) = delete;

  // Repacks A and B into be's layout (once; before any forward pass with it). The packed copies
  // are handed back to be when the adapter is destroyed, so be must outlive it.
  void prepare(Backend& be) {
    while (!prepare_some(be, 1e300)) {
    }
  }
  // The same a slice at a time: packs matrices until budget_ms has passed; true once all are.
  // (A server loads adapters beside running streams: on the thread that runs the steps, between
  // them, a slice costs each step about budget_ms; packed on another thread the same work took
  // a core from a forward that uses every core, and cost the steps ~2.5x its time.)
  bool prepare_some(Backend& be, double budget_ms);
  // The matrices handed to the backend so far (their sources: Backend::has_copy_of).
  const std::vector<const void*>& prepared_sources() const { return sources_; }

  const std::string& path() const { return path_; }
  const Model& base() const { return *base_; }
  float alpha() const { return alpha_; }
  int32_t rank() const { return rank_; }
  float scale() const { return alpha_ != 0 ? alpha_ / float(rank_) : 1.0f; }  // (llama.cpp: 1 without alpha)
  // Unique per load in this process (never reused): keys the prefix cache (KVCache salt).
  uint64_t uid() const { return uid_; }
  // Adapted weights (A/B pairs) in all.
  int32_t n_adapted() const { return n_adapted_; }

  // The A's of the projections reading one input, stacked: (sum of their ranks, in), ya =
  // scale * a x. data == null: no projection of this input is adapted.
  struct Stack {
    WeightView a;
    float scale = 1.0f;  // (scales of unequal ranks are folded into a, then 1)
  };
  // One adapted projection: its B (out, rank) and where its rank columns start in its input's
  // ya. b.data == null: not adapted.
  struct Delta {
    WeightView b;
    int32_t col = 0;
    bool on() const { return b.data != nullptr; }
  };
  const Stack& stack(int32_t layer, LoraInput in) const { return stacks_[size_t(layer)][size_t(in)]; }
  // Fused tensors appear as their row views (phi3: q, k, v share one A, each takes its rows of B).
  const Delta& delta(int32_t layer, LoraSlot s) const { return deltas_[size_t(layer)][size_t(s)]; }
  // Whether any layer adapts slot s.
  bool adapts(LoraSlot s) const { return slots_ & (1u << unsigned(s)); }

 private:
  LoraAdapter() = default;
  std::string path_;
  const Model* base_ = nullptr;
  float alpha_ = 0;
  int32_t rank_ = 0;
  uint64_t uid_ = 0;
  int32_t n_adapted_ = 0;
  uint32_t slots_ = 0;
  std::vector<std::array<Stack, kLoraInputs>> stacks_;
  std::vector<std::array<Delta, kLoraSlots>> deltas_;
  std::vector<std::vector<uint8_t>> store_;  // the copies the views point into
  Backend* prepared_ = nullptr;
  std::vector<WeightView*> to_pack_;  // prepare_some's matrices, [packed_n_, end) still to do
  size_t packed_n_ = 0;
  std::vector<const void*> sources_;  // what prepare() handed the backend
};

}  // namespace ft
