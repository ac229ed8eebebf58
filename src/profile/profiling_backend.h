// A Backend decorator that records one span per kernel call (category "op") and forwards the
// call unchanged. Installed only when profiling is on (wrap_backend at start-up), so the normal
// path pays nothing.
//
// Each span is named by op type, GEMMs by the weight(s) they read ("gemm.wq+wk+wv", "gemm.wo",
// "gemm.w_gate+w_up", "gemm.w_down", "gemm.output"; others "rmsnorm", "rope", "attention",
// "embed", ...), with args: layer (per-layer ops), M (rows), N/K and weight type for GEMMs, and
// the useful work: flops (2·M·N·K per GEMM, 4·heads·head_dim per attended position, a few per
// element for row-wise ops) and bytes (weights read once + activations read and written; for
// attention each sequence's K/V once). The summary turns these into GFLOP/s and GB/s.
//
// Weights are recognised by their data pointer (named by the model's architecture table,
// model/arch.h), which also gives
// the layer: an op without a weight (rope, attention) belongs to the layer of the last weighted op
// before it (the forward pass runs layer by layer), so Forward needs no hook. Calls must come from
// one thread at a time (as Forward makes them).
#pragma once
#include <memory>

#include "kernels/kernels.h"

namespace ft {
class Model;
}

namespace ft::profile {

std::unique_ptr<Backend> wrap_backend(std::unique_ptr<Backend> inner, const Model& model);

}  // namespace ft::profile
