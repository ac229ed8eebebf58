#include "profile/profiling_backend.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/arch.h"
#include "model/model.h"
#include "profile/trace.h"

namespace ft::profile {

namespace {

constexpr const char* kCat = "op";

uint64_t weight_bytes(const WeightView& W) {
  return row_bytes(W.type, uint64_t(W.n_cols)).value_or(0) * uint64_t(W.n_rows);
}

class ProfilingBackend final : public Backend {
 public:
  // Weights named by the architecture's table (model/arch.h), in its order: output comes after
  // token_embd, so a tied output is named "output".
  ProfilingBackend(std::unique_ptr<Backend> inner, const Model& model) : in_(std::move(inner)) {
    const HParams& hp = model.hparams();
    for_each_tensor(arch_spec(hp.arch), hp.n_layers, hp.n_experts > 0, [&](const TensorSpec& t, int32_t layer) {
      const ConstWeightSlot s = weight_slot(model.weights(), t.role, layer);
      const std::string name(t.op_name);
      if (s.matrix)
        add_weight(*s.matrix, name.c_str());
      else
        add_vec(*s.vector, name.c_str());
    });
    // Fused tensors (phi3): the GEMMs read their row views (the first shares the tensor's address).
    for (const LayerWeights& L : model.weights().layers) {
      if (L.wqkv.data) {
        add_weight(L.wq, "wqkv.q");
        add_weight(L.wk, "wqkv.k");
        add_weight(L.wv, "wqkv.v");
      }
      if (L.w_gate_up.data) {
        add_weight(L.w_gate, "w_gate_up.gate");
        add_weight(L.w_up, "w_gate_up.up");
      }
      for (const LayerWeights::Expert& e : L.experts) {  // (row views of the stacked tensors)
        add_weight(e.gate, "w_gate_exps");
        add_weight(e.up, "w_up_exps");
        add_weight(e.down, "w_down_exps");
      }
    }
    n_rmsnorm_ = intern("rmsnorm");
  }

  std::string_view name() const override { return in_->name(); }
  int threads() const override { return in_->threads(); }
  void reserve(int64_t max_rows) override { in_->reserve(max_rows); }
  uint64_t lock_prepared() override { return in_->lock_prepared(); }
  bool has_copy_of(const void* src) const override { return in_->has_copy_of(src); }
  void release_prepared(const void* src) override { in_->release_prepared(src); }
  // The repacked copy keeps the original's name (kernels see only the packed pointer).
  WeightView prepare(const WeightView& W) override {
    const WeightView p = in_->prepare(W);
    if (p.data != W.data) {
      auto it = weights_.find(W.data);
      if (it != weights_.end()) weights_[p.data] = it->second;
    }
    return p;
  }
  void rope_table(const int32_t* pos, int64_t M, const RopeParams& p, float* cs) override {
    if (!enabled()) return in_->rope_table(pos, M, p, cs);
    const int64_t t0 = now_ns();
    in_->rope_table(pos, M, p, cs);
    const int64_t t1 = now_ns();
    Args a;
    a.i("M", M).i("bytes", int64_t(4 * M * p.n_rot));
    complete("rope_table", kCat, t0, t1, a);
  }

  void matmul(const float* X, int64_t M, const WeightView& W, float* Y) override {
    if (!enabled()) return in_->matmul(X, M, W, Y);
    const WInfo& w = lookup(W);
    const int64_t t0 = now_ns();
    in_->matmul(X, M, W, Y);
    const int64_t t1 = now_ns();
    const uint64_t flops = 2ull * uint64_t(M) * uint64_t(W.n_rows) * uint64_t(W.n_cols);
    const uint64_t bytes = w.bytes + 4ull * uint64_t(M) * uint64_t(W.n_cols + W.n_rows);
    emit_gemm(w.gemm_name, t0, t1, M, W.n_rows, W.n_cols, w.type, flops, bytes, "matmul");
  }

  void matmul_multi(const float* X, int64_t M, const MatmulTarget* targets, int n) override {
    if (!enabled() || n <= 0) return in_->matmul_multi(X, M, targets, n);
    uint64_t key = uint64_t(n);
    uint64_t wbytes = 0;
    int64_t N = 0;
    for (int i = 0; i < n; ++i) {
      const WInfo& w = lookup(targets[i].W);
      if (i < 4) key |= uint64_t(w.index & 0xffff) << (8 + 16 * i);
      wbytes += w.bytes;
      N += targets[i].W.n_rows;
    }
    const int64_t K = targets[0].W.n_cols;
    const char* name = multi_name(key, targets, n);
    const char* type = lookup(targets[0].W).type;
    const int64_t t0 = now_ns();
    in_->matmul_multi(X, M, targets, n);
    const int64_t t1 = now_ns();
    uint64_t flops = 2ull * uint64_t(M) * uint64_t(N) * uint64_t(K);
    for (int i = 0; i < n; ++i)
      if (targets[i].bias) flops += uint64_t(M) * uint64_t(targets[i].W.n_rows);
    const uint64_t bytes = wbytes + 4ull * uint64_t(M) * uint64_t(K + N);
    emit_gemm(name, t0, t1, M, N, K, type, flops, bytes, "matmul_multi");
  }

  void matmul_add(const float* X, int64_t M, const WeightView& W, float* Y, const LoraDelta& lora) override {
    if (!enabled()) return in_->matmul_add(X, M, W, Y, lora);
    const WInfo& w = lookup(W);
    const int64_t t0 = now_ns();
    in_->matmul_add(X, M, W, Y, lora);
    const int64_t t1 = now_ns();
    const uint64_t MN = uint64_t(M) * uint64_t(W.n_rows);
    const uint64_t flops = 2ull * MN * uint64_t(W.n_cols) + MN;
    const uint64_t bytes = w.bytes + 4ull * uint64_t(M) * uint64_t(W.n_cols) + 8ull * MN;  // Y read and written
    emit_gemm(w.gemm_name, t0, t1, M, W.n_rows, W.n_cols, w.type, flops, bytes, "matmul_add");
  }

  void ffn_glu(const float* X, int64_t M, const WeightView& Wg, const WeightView& Wu, GateAct act,
               float* A, const LoraDelta* lora) override {
    if (!enabled()) return in_->ffn_glu(X, M, Wg, Wu, act, A, lora);
    const WInfo& g = lookup(Wg);
    const WInfo& u = lookup(Wu);
    if (!ffn_name_) {
      const MatmulTarget t[2] = {{Wg, nullptr, 0, nullptr}, {Wu, nullptr, 0, nullptr}};
      ffn_name_ = multi_name(0, t, 2);
    }
    const int64_t t0 = now_ns();
    in_->ffn_glu(X, M, Wg, Wu, act, A, lora);
    const int64_t t1 = now_ns();
    const uint64_t MF = uint64_t(M) * uint64_t(Wg.n_rows);
    const uint64_t flops = 4ull * MF * uint64_t(Wg.n_cols) + 5ull * MF;  // two GEMMs + act·mul
    const uint64_t bytes = g.bytes + u.bytes + 4ull * uint64_t(M) * uint64_t(Wg.n_cols) + 4ull * MF;
    emit_gemm(ffn_name_, t0, t1, M, 2 * Wg.n_rows, Wg.n_cols, g.type, flops, bytes,
              act == GateAct::GeluTanh ? "ffn_geglu" : act == GateAct::SwigluOai ? "ffn_swiglu_oai" : "ffn_swiglu");
  }

  // (LoRA's shrink: the deltas themselves are inside the projections' calls above. fuse: the
  // backend runs it inside the next projection's call, whose span then holds its time: no span.)
  void matmul_runs(const float* X, int64_t K, const RunTarget* t, int n, bool fuse) override {
    if (!enabled() || fuse) return in_->matmul_runs(X, K, t, n, fuse);
    const int64_t t0 = now_ns();
    in_->matmul_runs(X, K, t, n, fuse);
    const int64_t t1 = now_ns();
    uint64_t flops = 0, bytes = 0, rows = 0, N = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t mn = uint64_t(t[i].n) * uint64_t(t[i].A.n_rows);
      flops += 2 * mn * uint64_t(K);
      bytes += weight_bytes(t[i].A) + 4 * uint64_t(t[i].n) * uint64_t(K) + 4 * mn;
      rows += uint64_t(t[i].n);
      N = std::max<uint64_t>(N, uint64_t(t[i].A.n_rows));
    }
    Args a;
    if (layer_ >= 0) a.i("layer", layer_);
    a.i("M", int64_t(rows)).i("N", int64_t(N)).i("K", K).i("runs", n).i("flops", int64_t(flops)).i("bytes", int64_t(bytes));
    complete("lora_shrink", kCat, t0, t1, a);
  }

  void add_bias(float* Y, int64_t M, int64_t N, const float* bias) override {
    if (!enabled()) return in_->add_bias(Y, M, N, bias);
    const int64_t t0 = now_ns();
    in_->add_bias(Y, M, N, bias);
    const uint64_t MN = uint64_t(M) * uint64_t(N);
    emit_rowwise("add_bias", t0, now_ns(), M, N, MN, 8 * MN + 4 * uint64_t(N));
  }

  // The forward pass says which layer the next calls belong to (no guessing from weights).
  void set_layer(int32_t layer) override {
    layer_ = layer;
    in_->set_layer(layer);
  }

  void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t n, float eps) override {
    if (!enabled()) return in_->rmsnorm(x, w, y, M, n, eps);
    const char* which = "rmsnorm";
    if (auto it = vecs_.find(w); it != vecs_.end()) which = it->second.name;
    const int64_t t0 = now_ns();
    in_->rmsnorm(x, w, y, M, n, eps);
    const int64_t t1 = now_ns();
    const uint64_t Mn = uint64_t(M) * uint64_t(n);
    Args a;
    if (layer_ >= 0) a.i("layer", layer_);
    a.i("M", M).i("n", n).s("weight", which).i("flops", int64_t(4 * Mn)).i("bytes", int64_t(8 * Mn + 4 * uint64_t(n)));
    complete(n_rmsnorm_, kCat, t0, t1, a);
  }

  void embed(const WeightView& E, const int32_t* tokens, int64_t M, float* out) override {
    if (!enabled()) return in_->embed(E, tokens, M, out);
    const int64_t t0 = now_ns();
    in_->embed(E, tokens, M, out);
    const int64_t t1 = now_ns();
    const uint64_t row = row_bytes(E.type, uint64_t(E.n_cols)).value_or(0);
    const WInfo& w = lookup(E);
    Args a;
    a.i("M", M).i("n", E.n_cols).s("type", w.type).i("flops", 0).i("bytes", int64_t(uint64_t(M) * (row + 4ull * uint64_t(E.n_cols))));
    complete("embed", kCat, t0, t1, a);
  }

  void rope(float* x, int64_t M, int32_t n_heads, int32_t head_dim, const int32_t* pos, const RopeParams& p) override {
    if (!enabled()) return in_->rope(x, M, n_heads, head_dim, pos, p);
    const int64_t t0 = now_ns();
    in_->rope(x, M, n_heads, head_dim, pos, p);
    const int64_t t1 = now_ns();
    const uint64_t rotated = uint64_t(M) * uint64_t(n_heads) * uint64_t(p.n_rot);
    const uint64_t all = uint64_t(M) * uint64_t(n_heads) * uint64_t(head_dim);
    Args a;
    if (layer_ >= 0) a.i("layer", layer_);
    a.i("M", M).i("heads", n_heads).i("flops", int64_t(3 * rotated)).i("bytes", int64_t(8 * all));
    complete("rope", kCat, t0, t1, a);
  }

  void attention(const float* q, int64_t M, const KVLayerView* views, const int32_t* n_ctx, const AttentionShape& s,
                 float* out) override {
    if (!enabled()) return in_->attention(q, M, views, n_ctx, s, out);
    // Useful work: every query against every position it attends to; K/V of a sequence read once
    // (queries of one sequence are adjacent in the batch and share its block table).
    uint64_t positions = 0, kv_positions = 0;
    int64_t n_seqs = 0;
    const int32_t* table = nullptr;
    int32_t seq_max = 0;
    for (int64_t i = 0; i < M; ++i) {
      positions += uint64_t(n_ctx[i]);
      if (i == 0 || views[i].block_table != table) {
        kv_positions += uint64_t(seq_max);
        seq_max = 0;
        table = views[i].block_table;
        ++n_seqs;
      }
      seq_max = std::max(seq_max, n_ctx[i]);
    }
    kv_positions += uint64_t(seq_max);
    const int64_t t0 = now_ns();
    in_->attention(q, M, views, n_ctx, s, out);
    const int64_t t1 = now_ns();
    const uint64_t hd = uint64_t(s.n_heads) * uint64_t(s.head_dim);
    const uint64_t flops = 4ull * hd * positions;
    // K and V as stored (kv_layout.h): a block's bytes per position; q and out in f32.
    const uint64_t per_pos = M > 0 ? views[0].geo.block_bytes() / uint64_t(views[0].geo.block_size) : 0;
    const uint64_t bytes = per_pos * kv_positions + 8ull * uint64_t(M) * hd;
    Args a;
    if (layer_ >= 0) a.i("layer", layer_);
    a.i("M", M).i("seqs", n_seqs).i("ctx", int64_t(positions)).i("flops", int64_t(flops)).i("bytes", int64_t(bytes));
    complete("attention", kCat, t0, t1, a);
  }

  void glu(const float* gate, const float* up, GateAct act, float* a, int64_t M, int64_t n) override {
    if (!enabled()) return in_->glu(gate, up, act, a, M, n);
    const int64_t t0 = now_ns();
    in_->glu(gate, up, act, a, M, n);
    const uint64_t Mn = uint64_t(M) * uint64_t(n);
    emit_rowwise(act == GateAct::GeluTanh ? "geglu" : act == GateAct::SwigluOai ? "swiglu_oai" : "swiglu", t0, now_ns(), M, n, 5 * Mn, 12 * Mn);
  }

  void softcap(float* x, int64_t n, float cap) override {
    if (!enabled()) return in_->softcap(x, n, cap);
    const int64_t t0 = now_ns();
    in_->softcap(x, n, cap);
    emit_rowwise("softcap", t0, now_ns(), 1, n, 3 * uint64_t(n), 8 * uint64_t(n));
  }

  void scale(float* x, int64_t n, float s) override {
    if (!enabled()) return in_->scale(x, n, s);
    const int64_t t0 = now_ns();
    in_->scale(x, n, s);
    emit_rowwise("scale", t0, now_ns(), 1, n, uint64_t(n), 8 * uint64_t(n));
  }

  void add(float* y, const float* x, int64_t M, int64_t n) override {
    if (!enabled()) return in_->add(y, x, M, n);
    const int64_t t0 = now_ns();
    in_->add(y, x, M, n);
    const uint64_t Mn = uint64_t(M) * uint64_t(n);
    emit_rowwise("add", t0, now_ns(), M, n, Mn, 12 * Mn);
  }

 private:
  struct WInfo {
    const char* gemm_name = nullptr;  // "gemm.wq"
    const char* short_name = nullptr;  // "wq"
    const char* type = nullptr;        // "q8_0"
    int32_t index = 0;  // into names_
    uint64_t bytes = 0;
  };
  struct VInfo {
    const char* name;
  };

  void add_weight(const WeightView& W, const char* short_name) {
    if (!W.data) return;
    WInfo w;
    w.short_name = intern(short_name);
    std::string gemm = "gemm.";
    gemm.append(short_name);  // (not operator+: GCC 12 -Wrestrict false positive)
    w.gemm_name = intern(gemm);
    w.type = intern(type_traits(W.type).name);
    w.index = index_of(w.short_name);
    w.bytes = weight_bytes(W);
    weights_[W.data] = w;
  }
  void add_vec(const float* p, const char* name) {
    if (p) vecs_[p] = {intern(name)};
  }
  int32_t index_of(const char* short_name) {
    for (size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == short_name) return int32_t(i + 1);
    names_.push_back(short_name);
    return int32_t(names_.size());
  }

  // The weight's entry (a weight not from the model gets one named by its shape).
  const WInfo& lookup(const WeightView& W) {
    auto it = weights_.find(W.data);
    if (it == weights_.end()) {
      std::string s = "w";
      s.append(std::to_string(W.n_rows)).append("x").append(std::to_string(W.n_cols));
      add_weight(W, s.c_str());
      it = weights_.find(W.data);
    }
    return it->second;
  }

  const char* multi_name(uint64_t key, const MatmulTarget* t, int n) {
    if (n <= 4 && key != 0)
      if (auto it = multi_names_.find(key); it != multi_names_.end()) return it->second;
    std::string s = "gemm.";
    for (int i = 0; i < n; ++i) {
      if (i) s += '+';
      s += lookup(t[i].W).short_name;
    }
    const char* name = intern(s);
    if (n <= 4 && key != 0) multi_names_[key] = name;
    return name;
  }

  void emit_gemm(const char* name, int64_t t0, int64_t t1, int64_t M, int64_t N, int64_t K, const char* type,
                 uint64_t flops, uint64_t bytes, const char* kernel) {
    Args a;
    if (layer_ >= 0) a.i("layer", layer_);
    a.i("M", M).i("N", N).i("K", K).s("type", type).i("flops", int64_t(flops)).i("bytes", int64_t(bytes));
    a.s("kernel", kernel);
    complete(name, kCat, t0, t1, a);
  }

  void emit_rowwise(const char* name, int64_t t0, int64_t t1, int64_t M, int64_t n, uint64_t flops, uint64_t bytes) {
    Args a;
    if (layer_ >= 0) a.i("layer", layer_);
    a.i("M", M).i("n", n).i("flops", int64_t(flops)).i("bytes", int64_t(bytes));
    complete(name, kCat, t0, t1, a);
  }

  std::unique_ptr<Backend> in_;
  std::unordered_map<const void*, WInfo> weights_;
  std::unordered_map<const float*, VInfo> vecs_;
  std::unordered_map<uint64_t, const char*> multi_names_;
  std::vector<const char*> names_;
  const char* ffn_name_ = nullptr;
  const char* n_rmsnorm_ = nullptr;
  int32_t layer_ = -1;
};

}  // namespace

std::unique_ptr<Backend> wrap_backend(std::unique_ptr<Backend> inner, const Model& model) {
  return std::make_unique<ProfilingBackend>(std::move(inner), model);
}

}  // namespace ft::profile
