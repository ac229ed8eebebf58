#include "model/lora.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"
#include "kernels/quant.h"
#include "model/arch.h"

namespace ft {

namespace {

std::atomic<uint64_t> g_next_uid{1};

constexpr std::string_view kSuffixA = ".lora_a", kSuffixB = ".lora_b";

// The slot of a role the forward pass can adapt, or -1 (fused roles: handled by the caller).
int slot_of(Role r) {
  switch (r) {
    case Role::Wq: return int(LoraSlot::Q);
    case Role::Wk: return int(LoraSlot::K);
    case Role::Wv: return int(LoraSlot::V);
    case Role::Wo: return int(LoraSlot::O);
    case Role::WGate: return int(LoraSlot::Gate);
    case Role::WUp: return int(LoraSlot::Up);
    case Role::WDown: return int(LoraSlot::Down);
    default: return -1;
  }
}

}  // namespace

std::unique_ptr<LoraAdapter> LoraAdapter::load(const std::string& path, const Model& base) {
  return bind(GGUFFile::open(path), base);
}

std::unique_ptr<LoraAdapter> LoraAdapter::bind(std::unique_ptr<GGUFFile> file, const Model& base) {
  const GGUFFile& f = *file;
  const HParams& hp = base.hparams();
  const std::string& P = f.path();
  if (const std::string t = f.get_str("general.type", ""); t != "adapter")
    fail(P, ": key 'general.type': '", t, "' is not a LoRA adapter file (expected \"adapter\")");
  if (const std::string t = f.get_str("adapter.type", ""); t != "lora")
    fail(P, ": key 'adapter.type': '", t, "' is not supported (expected \"lora\")");
  if (const std::string a = f.get_str("general.architecture", ""); a != hp.arch_name)
    fail(P, ": key 'general.architecture': the adapter is for '", a, "', the base model is '", hp.arch_name, "'");
  std::unique_ptr<LoraAdapter> ad(new LoraAdapter());
  ad->path_ = P;
  ad->base_ = &base;
  // llama.cpp's rule: scale = alpha / rank, or 1 when alpha is absent or 0.
  ad->alpha_ = float(f.get_f64("adapter.lora.alpha", 0.0));
  if (!std::isfinite(ad->alpha_)) fail(P, ": key 'adapter.lora.alpha' must be finite");

  // The base's adaptable matrices by name: (role, layer).
  std::map<std::string, std::pair<const TensorSpec*, int32_t>> targets;
  for_each_tensor(arch_spec(hp.arch), hp.n_layers, hp.n_experts > 0, [&](const TensorSpec& t, int32_t layer) {
    if (t.matrix) targets[tensor_name(t, layer)] = {&t, layer};
  });
  // Pair the tensors up: base name -> (A, B).
  std::map<std::string, std::pair<const GGUFTensorInfo*, const GGUFTensorInfo*>> pairs;
  for (const GGUFTensorInfo& t : f.tensors()) {
    const bool is_a = t.name.ends_with(kSuffixA), is_b = t.name.ends_with(kSuffixB);
    if (!is_a && !is_b)
      fail(P, ": tensor '", t.name, "': not a LoRA tensor (names end in '.lora_a' or '.lora_b')");
    const std::string base_name = t.name.substr(0, t.name.size() - kSuffixA.size());
    (is_a ? pairs[base_name].first : pairs[base_name].second) = &t;
  }
  if (pairs.empty()) fail(P, ": the adapter has no tensors");

  // Per layer and slot: its A tensor (shared by the slots of a fused tensor), its B (a row view
  // of the fused B), and its scale. Stacked per input below.
  struct SlotSrc {
    const GGUFTensorInfo* a = nullptr;
    WeightView b;
    float scale = 1.0f;
  };
  std::vector<std::array<SlotSrc, kLoraSlots>> src(size_t(hp.n_layers));
  // A tensor's rows as stored when `to` is its type (then mul is 1), else as f32 times mul.
  auto copy_rows = [&](const GGUFTensorInfo* t, GGMLType to, float mul, std::vector<uint8_t>& out) {
    const uint64_t n0 = t->ne[0], rows = t->ne[1];
    const std::optional<uint64_t> rb = row_bytes(t->type, n0);
    if (!rb) fail(P, ": tensor '", t->name, "': a row of ", n0, " is not whole ", type_traits(t->type).name, " blocks");
    const size_t at = out.size();
    if (to == t->type) {  // (the bytes themselves)
      out.insert(out.end(), t->data, t->data + rows * *rb);
      return;
    }
    out.resize(at + size_t(n0 * rows) * sizeof(float));
    float* f = reinterpret_cast<float*>(out.data() + at);
    for (uint64_t r = 0; r < rows; ++r) dequantize_row(t->type, t->data + r * *rb, f + r * n0, int64_t(n0));
    if (mul != 1.0f)
      for (uint64_t i = 0; i < n0 * rows; ++i) f[i] *= mul;
  };
  auto stored = [&](std::vector<uint8_t>&& bytes) -> const void* {
    ad->store_.push_back(std::move(bytes));
    return ad->store_.back().data();
  };
  for (const auto& [name, ab] : pairs) {
    const auto [ta, tb] = ab;
    if (!ta || !tb)
      fail(P, ": tensor '", name, !ta ? ".lora_b" : ".lora_a", "' has no matching '", name,
           !ta ? ".lora_a" : ".lora_b", "'");
    const auto it = targets.find(name);
    if (it == targets.end())
      fail(P, ": tensor '", ta->name, "': the base model has no matrix '", name, "'");
    const auto [spec, layer] = it->second;
    const int slot = slot_of(spec->role);
    if (!spec->per_layer || (slot < 0 && spec->role != Role::WQkv && spec->role != Role::WGateUp))
      fail(P, ": tensor '", ta->name, "': adapting '", name,
           "' is not supported (only the layers' attention and FFN matrices)");
    const GGUFTensorInfo* bt = base.file().find_tensor(name);
    if (!bt) fail(P, ": tensor '", ta->name, "': the base model ", base.file().path(), " has no tensor '", name, "'");
    const uint64_t in = bt->ne[0], out = bt->ne[1];
    if (ta->ne.size() != 2 || ta->ne[0] != in || ta->ne[1] == 0 || ta->ne[1] > uint64_t(kMaxLoraRank))
      fail(P, ": tensor '", ta->name, "': expected shape [", in, ", rank] (rank 1..", kMaxLoraRank, "), got ",
           shape_str(ta->ne));
    const uint64_t rank = ta->ne[1];
    if (tb->ne != std::vector<uint64_t>{rank, out})
      fail(P, ": tensor '", tb->name, "': expected shape ", shape_str({rank, out}), ", got ", shape_str(tb->ne));
    for (const GGUFTensorInfo* t : {ta, tb})
      if (t->type != GGMLType::F32 && t->type != GGMLType::F16 && t->type != GGMLType::Q8_0)
        fail(P, ": tensor '", t->name, "': type ", type_traits(t->type).name, " is not supported (f32, f16, q8_0)");
    // (The reader checked each row of whole blocks: row_bytes of a Q8_0 row of 16 fails there.)
    const float scale = ad->alpha_ != 0 ? ad->alpha_ / float(rank) : 1.0f;
    const GGMLType bt_to = tb->type == GGMLType::F16 ? GGMLType::F16 : GGMLType::F32;
    std::vector<uint8_t> bbytes;
    copy_rows(tb, bt_to, 1.0f, bbytes);
    const WeightView B{bt_to, stored(std::move(bbytes)), int64_t(out), int64_t(rank)};
    auto& L = src[size_t(layer)];
    auto set = [&](LoraSlot s, const WeightView& b) {
      L[size_t(s)] = {ta, b, scale};
      ad->slots_ |= 1u << unsigned(s);
    };
    if (slot >= 0) {
      set(LoraSlot(slot), B);
    } else {  // fused: each projection's rows of B, as the base's row views (arch.h fused_views)
      LayerWeights v;
      (spec->role == Role::WQkv ? v.wqkv : v.w_gate_up) = B;
      fused_views(v, hp);
      if (spec->role == Role::WQkv) {
        set(LoraSlot::Q, v.wq);
        set(LoraSlot::K, v.wk);
        set(LoraSlot::V, v.wv);
      } else {
        set(LoraSlot::Gate, v.w_gate);
        set(LoraSlot::Up, v.w_up);
      }
    }
    ad->rank_ = std::max(ad->rank_, int32_t(rank));
    ++ad->n_adapted_;
  }

  // Stack the A's of each input's slots (a fused tensor's one A once): rows in slot order.
  // Their own type when every A has it (F16 or Q8_0; Q8_0 then runs on the integer path, int8
  // activations as the base's quantized weights have) and the scales are equal (applied to
  // ya); else f32, with unequal scales folded into their rows.
  ad->stacks_.resize(size_t(hp.n_layers));
  ad->deltas_.resize(size_t(hp.n_layers));
  for (int32_t il = 0; il < hp.n_layers; ++il) {
    const auto& L = src[size_t(il)];
    for (size_t in = 0; in < kLoraInputs; ++in) {
      std::vector<const SlotSrc*> parts;  // distinct A's
      for (size_t s = 0; s < kLoraSlots; ++s) {
        if (size_t(lora_input(LoraSlot(s))) != in || !L[s].a) continue;
        if (std::none_of(parts.begin(), parts.end(), [&](const SlotSrc* p) { return p->a == L[s].a; }))
          parts.push_back(&L[s]);
      }
      if (parts.empty()) continue;
      bool same_type = true, same_scale = true;
      int64_t rows = 0;
      for (const SlotSrc* p : parts) {
        same_type = same_type && p->a->type == parts[0]->a->type;
        same_scale = same_scale && p->scale == parts[0]->scale;
        rows += int64_t(p->a->ne[1]);
      }
      const GGMLType type = same_type && same_scale ? parts[0]->a->type : GGMLType::F32;
      std::vector<uint8_t> bytes;
      std::vector<int32_t> col(parts.size());
      for (size_t i = 0, r = 0; i < parts.size(); r += size_t(parts[i]->a->ne[1]), ++i) {
        col[i] = int32_t(r);
        copy_rows(parts[i]->a, type, same_scale ? 1.0f : parts[i]->scale, bytes);
      }
      ad->stacks_[size_t(il)][in] = {{type, stored(std::move(bytes)), rows, int64_t(parts[0]->a->ne[0])},
                                     same_scale ? parts[0]->scale : 1.0f};
      for (size_t s = 0; s < kLoraSlots; ++s) {
        if (size_t(lora_input(LoraSlot(s))) != in || !L[s].a) continue;
        const size_t i = size_t(std::find_if(parts.begin(), parts.end(), [&](const SlotSrc* p) { return p->a == L[s].a; }) -
                                parts.begin());
        ad->deltas_[size_t(il)][s] = {L[s].b, col[i]};
      }
    }
  }
  ad->uid_ = g_next_uid.fetch_add(1);
  return ad;
}

bool LoraAdapter::prepare_some(Backend& be, double budget_ms) {
  if (!prepared_) {
    prepared_ = &be;
    for (auto& L : stacks_)
      for (Stack& st : L)
        if (st.a.data) to_pack_.push_back(&st.a);
    for (auto& L : deltas_)
      for (Delta& d : L)
        if (d.on()) to_pack_.push_back(&d.b);
  } else if (packed_n_ == to_pack_.size()) {
    fail("LoRA adapter ", path_, ": prepared twice");
  } else if (prepared_ != &be) {
    fail("LoRA adapter ", path_, ": its packing went on with another backend");
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (packed_n_ < to_pack_.size()) {
    WeightView& w = *to_pack_[packed_n_];
    const void* src = w.data;
    w = be.prepare(w);  // (then counted: a throw leaves it to do)
    sources_.push_back(src);
    ++packed_n_;
    if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() >= budget_ms) break;
  }
  return packed_n_ == to_pack_.size();
}

LoraAdapter::~LoraAdapter() {
  if (prepared_)
    for (const void* src : sources_) prepared_->release_prepared(src);
}

// --- the forward pass's side (Forward, model.h) -------------------------------------------

void Forward::set_reducer(Reducer* r) {
  if (r && !lora_ya_.empty()) fail("LoRA adapters with tensor parallelism (tp_size > 1) are not supported yet");
  reduce_ = r;
}

void Forward::set_stage_link(StageLink* l) {
  if (l && !lora_ya_.empty()) fail("LoRA adapters with pipeline parallelism (pp_size > 1) are not supported yet");
  if (l && (l->first_stage() != (model_.stage_index() == 0) || model_.stage_count() < 2))
    fail("pipeline parallelism: the forward's stage is not the model's (Model::stage)");
  link_ = l;
}

Forward::LoraScratch Forward::lora_scratch() const {
  const size_t M = size_t(max_batch_);
  LoraScratch s;
  s.ya.assign(M * size_t(kMaxLoraStack), 0.0f);
  s.shrinks.resize(M);
  for (auto& r : s.runs) r.resize(M);
  return s;
}

void Forward::enable_lora(LoraScratch s) {
  if (reduce_) fail("LoRA adapters with tensor parallelism (tp_size > 1) are not supported yet");
  if (link_) fail("LoRA adapters with pipeline parallelism (pp_size > 1) are not supported yet");
  if (!lora_ya_.empty()) return;
  const size_t M = size_t(max_batch_);
  if (s.ya.size() != M * size_t(kMaxLoraStack) || s.shrinks.size() != M)
    fail("forward: LoRA scratch for ", s.shrinks.size(), " rows, the batch holds ", M);
  for (const auto& r : s.runs)
    if (r.size() != M) fail("forward: LoRA scratch for ", r.size(), " rows, the batch holds ", M);
  lora_ya_ = std::move(s.ya);
  lora_shrinks_ = std::move(s.shrinks);
  lora_runs_ = std::move(s.runs);
}

// Runs of equal adapters among the batch's entries (base entries need nothing).
bool Forward::lora_segments(const Batch& b) {
  lora_segs_.clear();
  if (b.lora.empty()) return false;
  const int64_t M = b.size();
  for (int64_t i = 0; i < M;) {
    const LoraAdapter* a = b.lora[size_t(i)];
    int64_t j = i + 1;
    while (j < M && b.lora[size_t(j)] == a) ++j;
    if (a) {
      if (&a->base() != &model_) fail("forward: LoRA adapter ", a->path(), " belongs to another model");
      if (lora_ya_.empty()) fail("forward: a batch with a LoRA adapter, but LoRA is not enabled (Forward::enable_lora)");
      lora_segs_.push_back({a, i, j - i});
    }
    i = j;
  }
  return !lora_segs_.empty();
}

bool Forward::lora_shrink(int32_t il, LoraInput in, const float* X, int64_t K) {
  int n = 0;
  for (const LoraSegment& g : lora_segs_) {
    const LoraAdapter::Stack& st = g.a->stack(il, in);
    if (!st.a.data) continue;
    if (st.a.n_cols != K) fail("forward: LoRA adapter ", g.a->path(), " does not fit layer ", il);
    lora_shrinks_[size_t(n++)] = {g.first, g.n, st.a, lora_ya_.data() + g.first * kMaxLoraStack, kMaxLoraStack, st.scale};
  }
  if (n > 0) be_.matmul_runs(X, K, lora_shrinks_.data(), n, /*fuse=*/true);  // (the projection's call is next)
  return n > 0;
}

LoraDelta Forward::lora_delta(int32_t il, LoraSlot s) {
  std::vector<LoraRun>& runs = lora_runs_[size_t(s)];
  int32_t n = 0;
  for (const LoraSegment& g : lora_segs_) {
    const LoraAdapter::Delta& d = g.a->delta(il, s);
    if (!d.on()) continue;
    runs[size_t(n++)] = {g.first, g.n, lora_ya_.data() + g.first * kMaxLoraStack + d.col, kMaxLoraStack, d.b};
  }
  return {n > 0 ? runs.data() : nullptr, n};
}

}  // namespace ft
