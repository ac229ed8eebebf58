// The "cpu" backend: GEMM/GEMV and flash attention from the per-ISA drivers (kernels_impl.h),
// the instruction set chosen at construction (the CPU's best, or FT_ISA / set_cpu_isa); the
// cheap row-wise ops are plain loops. make_backend() lives here.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/memory_lock.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/rowwise.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace ft {

std::unique_ptr<Backend> make_reference_backend(int threads);  // reference.cpp

namespace {

std::atomic<int> g_forced_isa{-1};  // set_cpu_isa: an IsaLevel, or -1 (FT_ISA, else the best)

cpu::IsaLevel isa_by_name(std::string_view name, const char* what) {
  std::string known;
  for (cpu::IsaLevel l : cpu::kIsaLevels) {
    if (name == cpu::isa_name(l)) {
      if (!cpu::isa_usable(l)) {
        std::string have;
        for (cpu::IsaLevel h : cpu::kIsaLevels)
          if (cpu::isa_usable(h)) have += std::string(have.empty() ? "" : ", ") + cpu::isa_name(h);
        if (!cpu::kernels_built(l))
          fail(what, " = ", name, ": this build has no kernels for it (CMake's FT_KERNEL_ISAS; it has ", have, ")");
        fail(what, " = ", name, ": this CPU does not support it (it supports ", have, ")");
      }
      return l;
    }
    known += std::string(known.empty() ? "" : ", ") + cpu::isa_name(l);
  }
  fail(what, " = '", name, "' is not an instruction set (", known, ")");
}

cpu::IsaLevel selected_isa() {
  const int forced = g_forced_isa.load();
  if (forced >= 0) return cpu::IsaLevel(forced);
  const char* env = std::getenv("FT_ISA");
  if (env && *env) return isa_by_name(env, "FT_ISA");
  return cpu::cpu_best_isa();
}

const cpu::IsaKernels& select_isa() { return cpu::kernels_for(selected_isa()); }
cpu::AttentionFn select_attention() { return cpu::attention_for(selected_isa()); }

cpu::GemmSeg seg_of(const WeightView& W, float* Y, int64_t ldy, const float* bias) {
  cpu::GemmSeg g;
  g.type = W.type;
  g.data = static_cast<const uint8_t*>(W.data);
  g.packed = W.layout == WeightLayout::Packed;
  g.row_bytes = g.packed ? cpu::group_bytes(W.type, W.n_cols) : *row_bytes(W.type, uint64_t(W.n_cols));
  g.n_rows = W.n_rows;
  g.Y = Y;
  g.ldy = ldy;
  g.bias = bias;
  return g;
}

// A LoraDelta the epilogue can read for a weight of n_rows outputs over M rows (fails naming
// what is wrong): B float (packed here or GGUF rows), (n_rows, rank <= kKC); runs inside [0, M).
const LoraDelta& checked(const LoraDelta& d, int64_t n_rows, int64_t M) {
  for (int32_t i = 0; i < d.n; ++i) {
    const LoraRun& r = d.runs[i];
    const WeightView& B = r.B;
    if (B.type != GGMLType::F32 && B.type != GGMLType::F16 && B.type != GGMLType::BF16)
      fail("lora: B must be a float type (f32, f16, bf16), got ", type_traits(B.type).name);
    if (B.n_rows != n_rows || B.n_cols < 1 || B.n_cols > cpu::kKC)
      fail("lora: B is ", B.n_rows, "x", B.n_cols, ", expected ", n_rows, " rows and a rank of 1..", cpu::kKC);
    if (r.m0 < 0 || r.n < 0 || r.m0 + r.n > M || (r.n > 0 && r.ldya < B.n_cols))
      fail("lora: run of rows [", r.m0, ", ", r.m0 + r.n, ") outside the batch of ", M, " or its ya rows too narrow");
  }
  return d;
}

class CpuFastBackend final : public Backend {
 public:
  explicit CpuFastBackend(int threads)
      : threads_(std::max(1, threads)), k_(select_isa()), attention_(select_attention()) {}
  std::string_view name() const override { return "cpu"; }
  int threads() const override { return threads_; }
  std::string_view isa() const { return k_.name; }

  void reserve(int64_t max_rows) override {
    k_.reserve(max_rows, threads_);
    int64_t max_k;
    {
      std::lock_guard<std::mutex> lock(mu_);
      max_k = max_k_;
    }
    std::lock_guard<std::mutex> lock(qa_mu_);
    qa_.reserve(max_rows, max_k);
  }

  // Panel layout (packed.h): 16 rows' weights at each k side by side, quantized types still
  // quantized, each in its own (MXFP4 failing on a block the loader refuses: check_packable).
  // Cached by source pointer and shape, so tied or shared weights are packed once.
  WeightView prepare(const WeightView& W) override {
    if (W.layout == WeightLayout::Packed || !is_supported_weight_type(W.type) ||
        W.n_cols % cpu::block_len(W.type) != 0)
      return W;
    const auto* src = static_cast<const uint8_t*>(W.data);
    const uint64_t src_rb = *row_bytes(W.type, uint64_t(W.n_cols));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto [it, end] = packed_.equal_range(W.data); it != end; ++it)
      if (const Packed& p = it->second; p.n_rows == W.n_rows && p.n_cols == W.n_cols && p.type == W.type)
        return {p.type, p.bytes, W.n_rows, W.n_cols, WeightLayout::Packed};
    // (MXFP4: its rows are checked, each block's scale an f16 or +0: packed.h.)
    cpu::check_packable(W.type, src, src_rb, W.n_rows, W.n_cols);
    const uint64_t bytes = cpu::group_bytes(W.type, W.n_cols) * uint64_t(cpu::n_groups(W.n_rows));
    uint8_t* out = nullptr;
    std::shared_ptr<uint8_t> owner = alloc_packed(bytes, out);
    if (!owner) fail("prepare: out of memory packing a ", W.n_rows, "x", W.n_cols, " weight");
    k_.pack(W.type, src, src_rb, W.n_rows, W.n_cols, out);
    const auto it = packed_.emplace(W.data, Packed{W.data, W.type, W.n_rows, W.n_cols, out, std::move(owner)});
    if (cpu::is_int_type(W.type)) max_k_ = std::max(max_k_, W.n_cols);
    return {W.type, it->second.bytes, W.n_rows, W.n_cols, WeightLayout::Packed};
  }

  uint64_t lock_prepared() override {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t total = 0;
    for (const auto& [src, p] : packed_) {
      const uint64_t bytes = cpu::group_bytes(p.type, p.n_cols) * uint64_t(cpu::n_groups(p.n_rows));
      lock_memory(p.bytes, bytes, "the packed weights");
      total += bytes;
    }
    return total;
  }
  bool has_copy_of(const void* src) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return packed_.count(src) > 0;
  }

  void release_prepared(const void* src) override {
    std::lock_guard<std::mutex> lock(mu_);
    packed_.erase(src);
  }

  void matmul(const float* X, int64_t M, const WeightView& W, float* Y) override {
    const cpu::GemmSeg g = seg_of(W, Y, W.n_rows, nullptr);
    gemm(X, M, W.n_cols, &g, 1, cpu::Epilogue::Store);
  }
  void matmul_multi(const float* X, int64_t M, const MatmulTarget* t, int n) override {
    if (n < 1 || n > 4) fail("matmul_multi: 1 to 4 targets, got ", n);
    cpu::GemmSeg g[4];
    for (int i = 0; i < n; ++i) {
      if (t[i].W.n_cols != t[0].W.n_cols) fail("matmul_multi: targets differ in K");
      g[i] = seg_of(t[i].W, t[i].Y, t[i].ldy, t[i].bias);
      g[i].rope_cs = t[i].rope_cs;
      g[i].rope_head_dim = t[i].rope_head_dim;
      g[i].rope_n_rot = t[i].rope_n_rot;
      g[i].lora = checked(t[i].lora, t[i].W.n_rows, M);
      if (t[i].rope_cs && (t[i].rope_head_dim % 16 != 0 || t[i].rope_n_rot % 2 != 0))
        fail("matmul_multi: fused RoPE needs head_dim a multiple of 16 and an even n_rot");
    }
    gemm(X, M, t[0].W.n_cols, g, n, cpu::Epilogue::Store);
  }
  void matmul_add(const float* X, int64_t M, const WeightView& W, float* Y, const LoraDelta& lora) override {
    cpu::GemmSeg g = seg_of(W, Y, W.n_rows, nullptr);
    g.lora = checked(lora, W.n_rows, M);
    gemm(X, M, W.n_cols, &g, 1, cpu::Epilogue::Add);
  }
  void ffn_glu(const float* X, int64_t M, const WeightView& Wg, const WeightView& Wu, GateAct act,
               float* A, const LoraDelta* lora) override {
    if (Wg.n_rows != Wu.n_rows || Wg.n_cols != Wu.n_cols)
      fail("ffn_glu: gate and up weights differ in shape");
    if (act == GateAct::SwigluOai) fail("ffn_glu: the swiglu_oai activation has no fused epilogue (use glu)");
    cpu::GemmSeg g[2] = {seg_of(Wg, A, Wg.n_rows, nullptr), seg_of(Wu, nullptr, 0, nullptr)};
    if (lora) {
      g[0].lora = checked(lora[0], Wg.n_rows, M);
      g[1].lora = checked(lora[1], Wu.n_rows, M);
    }
    gemm(X, M, Wg.n_cols, g, 2, act == GateAct::GeluTanh ? cpu::Epilogue::GeGLU : cpu::Epilogue::SwiGLU);
  }
  void matmul_runs(const float* X, int64_t K, const RunTarget* t, int n, bool fuse) override {
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(qa_mu_);  // (runs_ is per backend, like qa_)
    pending_ = false;
    if (runs_.size() < size_t(n)) runs_.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
      const WeightView& A = t[i].A;
      if (A.type != GGMLType::F32 && A.type != GGMLType::F16 && A.type != GGMLType::BF16 && !cpu::is_int_type(A.type))
        fail("matmul_runs: target ", i, ": A of type ", type_traits(A.type).name, " is not supported");
      if (A.n_cols != K) fail("matmul_runs: target ", i, " has K ", A.n_cols, ", X has ", K);
      if (t[i].m0 < 0 || t[i].n < 0 || t[i].ldy < A.n_rows)
        fail("matmul_runs: target ", i, ": rows [", t[i].m0, ", ", t[i].m0 + t[i].n, "), ldy ", t[i].ldy);
      runs_[size_t(i)] = seg_of(A, t[i].Y, t[i].ldy, nullptr);
    }
    if (fuse) {  // (the next gemm runs it: shrink_)
      run_targets_.assign(t, t + n);
      shrink_ = {X, K, run_targets_.data(), runs_.data(), n};
      pending_ = true;
      return;
    }
    k_.gemm_runs(X, K, t, runs_.data(), n, threads_, qa_, false);
  }

  void add_bias(float* Y, int64_t M, int64_t N, const float* bias) override { rowwise::add_bias(Y, M, N, bias); }
  void rmsnorm(const float* x, const float* w, float* y, int64_t M, int64_t n, float eps) override {
    rowwise::rmsnorm(x, w, y, M, n, eps);
  }
  void embed(const WeightView& E, const int32_t* tokens, int64_t M, float* out) override {
    rowwise::embed(E, tokens, M, out);
  }
  void rope_table(const int32_t* pos, int64_t M, const RopeParams& p, float* cs) override {
    rowwise::rope_table(pos, M, p, cs);
  }
  void rope(float* x, int64_t M, int32_t n_heads, int32_t head_dim, const int32_t* pos,
            const RopeParams& p) override {
    rowwise::rope(x, M, n_heads, head_dim, pos, p, threads_);
  }

  void attention(const float* q, int64_t M, const KVLayerView* views, const int32_t* n_ctx,
                 const AttentionShape& s, float* out) override {
    attention_(q, M, views, n_ctx, s, out, threads_);
  }

  void glu(const float* gate, const float* up, GateAct act, float* a, int64_t M, int64_t n) override {
    rowwise::glu(gate, up, act, a, M, n);
  }
  void softcap(float* x, int64_t n, float cap) override { rowwise::softcap(x, n, cap); }
  void scale(float* x, int64_t n, float s) override { rowwise::scale(x, n, s); }
  void add(float* y, const float* x, int64_t M, int64_t n) override { rowwise::add(y, x, M, n); }

 private:
  // One GEMM at a time per backend owns the quantized-activation scratch (a backend is driven
  // by one engine thread; the lock only keeps concurrent callers correct).
  void gemm(const float* X, int64_t M, int64_t K, const cpu::GemmSeg* g, int n, cpu::Epilogue e) {
    std::lock_guard<std::mutex> lock(qa_mu_);
    const bool shrink = std::exchange(pending_, false);
    k_.gemm(X, M, K, g, n, e, qa_, threads_, shrink ? &shrink_ : nullptr);
  }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  struct Packed {
    const void* src;
    GGMLType type;
    int64_t n_rows, n_cols;
    uint8_t* bytes;
    std::shared_ptr<uint8_t> owner;  // its own block, or the arena chunk it lies in
  };
  // Room for a packed weight of `bytes` (out), on huge pages whatever its size: one of
  // kHugePage or more gets its own block (alloc_streamed); smaller ones (K and V of a GQA
  // model: 0.3 MB each on TinyLlama, 44 calls per decode step) share kHugePage chunks, where on
  // 4 KiB pages each page was a TLB miss and a restart of the hardware prefetcher. A chunk is
  // freed with the last weight in it. Null when out of memory. (Under mu_.)
  std::shared_ptr<uint8_t> alloc_packed(uint64_t bytes, uint8_t*& out) {
    constexpr uint64_t kAlign = 64;
    if (bytes >= cpu::kHugePage) {
      std::shared_ptr<uint8_t> p(cpu::alloc_streamed(bytes), Free{});
      out = p.get();
      return out ? p : nullptr;
    }
    const uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    if (!chunk_ || chunk_used_ + need > cpu::kHugePage) {
      uint8_t* c = cpu::alloc_streamed(cpu::kHugePage);
      if (!c) return nullptr;
      chunk_.reset(c, Free{});
      chunk_used_ = 0;
    }
    out = chunk_.get() + chunk_used_;
    chunk_used_ += need;
    return chunk_;
  }
  int threads_;
  const cpu::IsaKernels& k_;
  cpu::AttentionFn attention_;
  mutable std::mutex mu_;
  // By source address: a mixture of experts prepares tens of thousands of views (Qwen3-30B-A3B:
  // 48 layers x 128 experts x 3), which a list searched per prepare made quadratic.
  std::unordered_multimap<const void*, Packed> packed_;
  std::shared_ptr<uint8_t> chunk_;  // alloc_packed's current chunk (chunk_used_ bytes taken)
  uint64_t chunk_used_ = 0;
  int64_t max_k_ = 0;  // largest K of a prepared integer-path weight
  std::mutex qa_mu_;
  cpu::QAct qa_;
  std::vector<cpu::GemmSeg> runs_;  // matmul_runs' segments (grown once)
  // A fused matmul_runs the next gemm runs (pending_): its job, over runs_ and a copy of its targets.
  bool pending_ = false;
  cpu::ShrinkJob shrink_{};
  std::vector<RunTarget> run_targets_;
};

}  // namespace

std::string_view cpu_isa() { return select_isa().name; }

std::vector<std::string_view> cpu_isas() {
  std::vector<std::string_view> out;
  for (cpu::IsaLevel l : cpu::kIsaLevels)
    if (cpu::isa_usable(l)) out.push_back(cpu::isa_name(l));
  return out;
}

bool is_int8_weight_type(GGMLType t) { return cpu::is_int_type(t); }

void set_cpu_isa(std::string_view name) {
  g_forced_isa.store(name.empty() ? -1 : int(isa_by_name(name, "instruction set")));
}

std::unique_ptr<Backend> make_backend(std::string_view name, int threads) {
  if (name == "cpu") return std::make_unique<CpuFastBackend>(threads);
  if (name == "reference") return make_reference_backend(threads);
  fail("unknown backend '", name, "' (available: cpu, reference)");
}

}  // namespace ft
