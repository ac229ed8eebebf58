// Model::stage: one pipeline stage's layers (model.h): the others' views dropped, never touched.
// Model::shard: one rank's part of every layer for tensor parallelism (model.h).
//   Q (q_dim, dim), K/V (kv_dim, dim), gate/up (ffn, dim): column-parallel, rows [r n_out/n, ..):
//     a row range of a GGUF matrix is a contiguous sub-range (rows are whole blocks): a view.
//   Wo (dim, q_dim), down (dim, ffn): row-parallel, input columns [r K/n, (r+1) K/n) of every
//     row: copied out once (only those bytes of the file are read), the cut on a block boundary.
// Heads stay whole on one rank, so attention, RoPE and the KV cache of a rank see only its heads;
// query head h of the rank reads its KV head h / (H/KV) as before (both counts divided by n).
#include <cstring>

#include "core/error.h"
#include "model/model.h"

namespace ft {

namespace {

uint64_t view_bytes(const WeightView& W) { return *row_bytes(W.type, uint64_t(W.n_cols)) * uint64_t(W.n_rows); }

WeightView rows_of(const WeightView& W, int64_t r0, int64_t n) {
  const uint64_t rb = *row_bytes(W.type, uint64_t(W.n_cols));
  return {W.type, static_cast<const uint8_t*>(W.data) + uint64_t(r0) * rb, n, W.n_cols, W.layout};
}

// Columns [c0, c0 + n) of every row of W, copied into `out`; c0 and n whole blocks of W's type.
WeightView cols_of(const WeightView& W, int64_t c0, int64_t n, const char* what, int parts,
                   std::vector<MappedMemory>& out) {
  const int64_t blk = type_traits(W.type).block_size;
  if (c0 % blk != 0 || n % blk != 0)
    fail("tensor parallelism: ", what, " (", W.n_cols, " input columns, ", type_traits(W.type).name,
         ") cannot be split into ", parts, " parts of ", n, " columns on its ", blk,
         "-column quantization blocks; choose a tp_size that divides it into whole blocks");
  const uint64_t src_rb = *row_bytes(W.type, uint64_t(W.n_cols));
  const uint64_t off = *row_bytes(W.type, uint64_t(c0));
  const uint64_t rb = *row_bytes(W.type, uint64_t(n));
  MappedMemory& m = out.emplace_back(rb * uint64_t(W.n_rows), "tensor parallelism: a weight slice");
  const auto* src = static_cast<const uint8_t*>(W.data);
  for (int64_t r = 0; r < W.n_rows; ++r) std::memcpy(m.data() + uint64_t(r) * rb, src + uint64_t(r) * src_rb + off, rb);
  return {W.type, m.data(), W.n_rows, n, WeightLayout::Rows};
}

uint64_t layer_bytes(const LayerWeights& L) {
  return view_bytes(L.wq) + view_bytes(L.wk) + view_bytes(L.wv) + view_bytes(L.wo) + view_bytes(L.w_gate) +
         view_bytes(L.w_up) + view_bytes(L.w_down) + view_bytes(L.moe_router) + view_bytes(L.gate_exps) +
         view_bytes(L.up_exps) + view_bytes(L.down_exps);
}

}  // namespace

void Model::stage(int s, int n) {
  if (n < 1 || s < 0 || s >= n) fail("pipeline parallelism: stage ", s, " of ", n, " stages");
  if (stage_count_ != 1 || shard_count_ != 1) fail("pipeline parallelism: the model is already split");
  if (n == 1) return;
  const std::string file = file_ ? file_->path() : std::string("the model");
  const int32_t L = hp_.n_layers;
  if (n > L)
    fail(file, ": pipeline parallelism over ", n, " stages needs at least one layer per stage, the model has ", L,
         " layers; choose a pp_size of at most ", L);
  // Contiguous and balanced: stage s runs [s L / n, (s + 1) L / n) (sizes differ by at most one).
  const int32_t first = int32_t(int64_t(s) * L / n), end = int32_t(int64_t(s + 1) * L / n);
  for (int32_t il = 0; il < L; ++il)
    if (il < first || il >= end) weight_bytes_ -= layer_bytes(w_.layers[size_t(il)]);
  w_.layers.erase(w_.layers.begin() + end, w_.layers.end());
  w_.layers.erase(w_.layers.begin(), w_.layers.begin() + first);
  if (s != 0) {  // the embeddings and the head are stage 0's (its rank 0 computes the logits)
    weight_bytes_ -= view_bytes(w_.token_embd);
    if (w_.output.data != w_.token_embd.data) weight_bytes_ -= view_bytes(w_.output);
    w_.token_embd = {};
    w_.output = {};
    w_.output_norm = nullptr;
  }
  hp_.first_layer = first;
  hp_.n_layers = end - first;
  stage_ = s;
  stage_count_ = n;
}

bool Model::reads_tensor(std::string_view name) const {
  if (name.starts_with("blk.")) {
    int64_t il = 0;
    size_t i = 4;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && il < (int64_t(1) << 40); ++i) il = il * 10 + (name[i] - '0');
    return i > 4 && il >= hp_.first_layer && il < int64_t(hp_.first_layer) + hp_.n_layers;
  }
  if (stage_ != 0 && (name.starts_with("token_embd") || name.starts_with("output"))) return false;
  return true;
}

void Model::shard(int rank, int n) {
  if (n < 1 || rank < 0 || rank >= n) fail("tensor parallelism: rank ", rank, " of ", n, " ranks");
  if (shard_count_ != 1) fail("tensor parallelism: the model is already sharded");
  if (n == 1) return;
  HParams& hp = hp_;
  const std::string file = file_ ? file_->path() : std::string("the model");
  auto divides = [&](int32_t v, const char* what) {
    if (v % n != 0)
      fail(file, ": tensor parallelism over ", n, " ranks needs ", what, " divisible by ", n, ", the model has ", v);
  };
  if (hp.n_experts > 0)
    fail(file, ": tensor parallelism over a mixture of experts (", hp.n_experts, " experts) is not supported");
  if (hp.qk_norm_whole)  // (each rank holds some heads: the norm's sum over all of them would need an allreduce)
    fail(file, ": tensor parallelism with q/k norms over the whole projection (", hp.arch_name, ") is not supported");
  divides(hp.n_heads, "the attention heads");
  divides(hp.n_kv_heads, "the KV heads");
  divides(hp.ffn_dim, "the FFN width");
  const int64_t q = hp.q_dim() / n, kv = hp.kv_dim() / n, f = hp.ffn_dim / n;
  for (size_t il = 0; il < w_.layers.size(); ++il) {
    LayerWeights& L = w_.layers[il];
    const uint64_t before = layer_bytes(L);
    L.wq = rows_of(L.wq, rank * q, q);
    L.wk = rows_of(L.wk, rank * kv, kv);
    L.wv = rows_of(L.wv, rank * kv, kv);
    if (L.bq) L.bq += rank * q;
    if (L.bk) L.bk += rank * kv;
    if (L.bv) L.bv += rank * kv;
    if (L.attn_sinks) L.attn_sinks += rank * (hp.n_heads / n);  // (the rank's query heads'; bo stays whole:
                                                                 //  added once, after the allreduce)
    L.wqkv = {};      // (phi3: wq/wk/wv above are the views the forward reads)
    L.w_gate_up = {};
    L.w_gate = rows_of(L.w_gate, rank * f, f);
    L.w_up = rows_of(L.w_up, rank * f, f);
    const std::string layer = "layer " + std::to_string(hp.first_layer + int32_t(il));
    L.wo = cols_of(L.wo, rank * q, q, (layer + " attn_output").c_str(), n, shard_copies_);
    L.w_down = cols_of(L.w_down, rank * f, f, (layer + " ffn_down").c_str(), n, shard_copies_);
    weight_bytes_ -= before - layer_bytes(L);
  }
  hp.n_heads /= n;
  hp.n_kv_heads /= n;
  hp.ffn_dim /= n;
  shard_rank_ = rank;
  shard_count_ = n;
}

}  // namespace ft
