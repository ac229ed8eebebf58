// The transformer forward pass, one function per block, an explicit loop over layers.
//   x = embed(tokens)
//   for each layer:  x += attention(rmsnorm(x))   x += ffn(rmsnorm(x))
//   logits = output(rmsnorm(x))   (only for entries that want logits)
// The architectures' differences (HParams, from the table's ArchFeatures and the weights bound):
//   gemma:  x = embed * sqrt(dim); the FFN's gate is GELU (tanh form); the output tied to the
//           embeddings.
//   gemma2: x = embed * sqrt(dim); x += post_norm(attention(..)) and x += post_norm(ffn(..))
//           (post-norms where the layer has them); the FFN's gate is GELU (tanh form); scores
//           and logits soft-capped; even layers attend through the sliding window.
//   phi3:   Q/K/V and gate/up are row views of fused tensors (the same GEMM calls); every layer
//           windowed; long/short rope factors chosen by the context (constructor).
//   qwen2:  Q/K/V biases in the GEMM epilogue.
//   granite: x = embed * embedding_scale; x += residual_scale * block(..); logits / logit_scale;
//            its own attention scale.
//   qwen3, gemma3: each q and k head RMS-normed (q_norm, k_norm) before RoPE.
//   qwen2moe: qwen2's attention; qwen3moe's experts, their weights not renormalised over the
//           chosen (moe_renorm), plus a shared expert weighted by sigmoid(h · gate vector).
//   olmo2:  no pre-norms (attention and the FFN read x itself); gemma2's post-norms; q and k
//           RMS-normed over the whole projection (qk_norm_whole) before RoPE.
//   gemma3: gemma2's post-norms, GELU and embedding scale, no soft caps; five windowed layers
//           then a global one, the windowed ones rotating with their own base (rope_swa_).
//   gpt-oss: Q/K/V and output biases; each query head's sink logit in its softmax; even layers
//           windowed; experts with biases (router too) and the clamped SwiGLU (swiglu_oai).
// Pipeline parallelism (StageLink, Model::stage): the layers are the stage's; the first stage
// embeds, the others receive x from the previous stage; all but the last send x on (posted: the
// next step may start here while the next stage runs this one; progress() between blocks lets
// those sends move); the last sends the rows that want logits to the first stage, whose rank 0
// computes the logits.
// LoRA (model/lora.h): before each projection, one shrink GEMM over the batch's adapted runs
// (ya = scale * A_stack x for every adapter at once); the projection's GEMM then adds each run's
// ya B^T in its epilogue (LoraDelta), before the bias, RoPE, activation or residual add, so the
// fused kernels stay fused. Base-only batches skip both.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "core/error.h"
#include "model/model.h"

namespace ft {

namespace {
// Faults in the bytes [p, p + n) of a (file) mapping now: WILLNEED starts the reads
// asynchronously, then one load per page waits for them. For the token embedding, which
// stays in the GGUF mapping (embed() reads single rows): without this the first forward of a
// fresh process took a page fault per new token's row (~6 ms for a prompt on the 110m shape,
// up to 13 ms for one decode token where the page cache was cold).
void prefault(const void* p, uint64_t n) {
  if (!p || n == 0) return;
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t b = uintptr_t(p) / page * page, e = uintptr_t(p) + n;
  madvise(reinterpret_cast<void*>(b), size_t(e - b), MADV_WILLNEED);  // (advice: failure is harmless)
  // (A page holding any byte of the range is mapped whole.)
  for (uintptr_t a = b; a < e; a += page) (void)*reinterpret_cast<const volatile unsigned char*>(a);
}
}  // namespace

Forward::Forward(const Model& model, Backend& backend, int64_t max_batch, int64_t n_ctx)
    : model_(model), be_(backend), w_(model.weights()), max_batch_(max_batch), rope_(model.hparams().rope) {
  if (max_batch <= 0) fail("forward: max batch must be positive");
  // llama.cpp's choice: the long factors when the context per sequence exceeds the original one.
  if (w_.rope_long || w_.rope_short) {
    const int64_t ctx = n_ctx > 0 ? n_ctx : model.hparams().ctx_len;
    rope_.freq_factors = ctx > model.hparams().rope_ctx_orig && w_.rope_long ? w_.rope_long : w_.rope_short;
  }
  rope_swa_ = rope_;
  if (model.hparams().swa_rope_base > 0) {  // (llama.cpp's gemma3: no factors; YaRN at scale 1 is none)
    rope_swa_.freq_base = model.hparams().swa_rope_base;
    rope_swa_.freq_scale = 1.0f;
    rope_swa_.freq_factors = nullptr;
    rope_swa_.attn_factor = rope_.attn_factor / model.hparams().yarn_mscale;
  }
  // (Fused tensors: the row views are what the GEMMs read, so those are prepared.)
  for (LayerWeights& L : w_.layers) {
    for (WeightView* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.moe_router, &L.w_gate_shexp,
                          &L.w_up_shexp, &L.w_down_shexp})
      if (v->data) *v = be_.prepare(*v);
    for (LayerWeights::Expert& e : L.experts)  // (each expert's row views: the stacked tensors are never read whole)
      for (WeightView* v : {&e.gate, &e.up, &e.down}) *v = be_.prepare(*v);
  }
  if (w_.output.data) w_.output = be_.prepare(w_.output);  // token_embd stays in rows: embed() reads single rows
  // (A pipeline stage other than the first has neither: Model::stage dropped them.)
  const HParams& hp = model.hparams();
  const size_t M = size_t(max_batch);
  float** const bufs[] = {&x_, &h_, &q_, &k_, &v_, &attn_, &gate_};
  const int32_t widths[] = {hp.dim, hp.dim, hp.q_dim(), hp.kv_dim(), hp.kv_dim(), hp.q_dim(),
                            std::max({hp.ffn_dim, hp.expert_ffn_dim, hp.shexp_ffn_dim})};
  // Checked: a batch of 2^62 tokens wrapped M x width (and then the vectors below failed inside
  // the standard library). Past the bound, no product below can overflow either.
  uint64_t floats = 0;
  for (const int32_t w : widths) {
    uint64_t n = 0;
    if (__builtin_mul_overflow(uint64_t(M), uint64_t(std::max(w, 0)), &n) || n > (uint64_t(1) << 56) ||
        __builtin_add_overflow(floats, (n + 15) / 16 * 16, &floats) || floats > (uint64_t(1) << 56))  // 64-byte aligned each
      fail("forward: a batch of ", max_batch, " tokens: its activations (x ", w, " floats each) overflow memory sizes");
  }
  scratch_ = MappedMemory(floats * sizeof(float), "forward: activation scratch", MappedMemory::Prefault::Yes);
  float* next = reinterpret_cast<float*>(scratch_.data());
  for (size_t i = 0; i < std::size(bufs); ++i) {
    *bufs[i] = next;
    next += (uint64_t(M) * uint64_t(widths[i]) + 15) / 16 * 16;
  }
  views_.resize(M);
  if (hp.n_experts > 0) {
    const size_t E = size_t(hp.n_experts), K = size_t(hp.n_experts_used), D = size_t(hp.dim);
    moe_logits_.resize(M * E);
    moe_in_.resize(M * D);
    moe_out_.resize(M * D);
    moe_sum_.resize(M * D);
    moe_weight_.resize(M * K);
    moe_choice_.resize(M * K);
    moe_offsets_.resize(E + 1);
    moe_fill_.resize(E);
    moe_rows_.resize(M * K);
    moe_row_weight_.resize(M * K);
    // gpt-oss's experts run unfused (their biases, and an activation with no fused epilogue)
    const bool biased = !w_.layers.empty() && w_.layers[0].gate_exps_b;
    if (biased || hp.ffn_act == GateAct::SwigluOai) moe_up_.resize(M * size_t(hp.expert_ffn_dim));
  }
  // Interleaved (llama) pairs stay inside the GEMM epilogue's 16-column groups; neox-style
  // halves pairs do not, so Qwen2 keeps the separate RoPE pass, as do q/k norms (before RoPE)
  // and per-layer RoPE bases (one table per batch).
  const bool qk_norm = !w_.layers.empty() && (w_.layers[0].q_norm || w_.layers[0].k_norm);
  fused_rope_ = rope_.style == RopeStyle::Interleaved && hp.head_dim % 16 == 0 && rope_.n_rot % 2 == 0 && !qk_norm &&
                hp.swa_rope_base == 0;
  if (fused_rope_) rope_cs_.resize(M * size_t(rope_.n_rot));
  n_ctx_.resize(M);
  logit_rows_.reserve(M);
  be_.reserve(max_batch);  // kernels' per-thread scratch, so run() does not allocate
  // The token embedding rows, so that the first request does not wait on page faults.
  if (w_.token_embd.data)
    prefault(w_.token_embd.data, row_bytes(w_.token_embd.type, uint64_t(w_.token_embd.n_cols)).value_or(0) *
                                     uint64_t(w_.token_embd.n_rows));
}

void Forward::validate(const Batch& b, const KVCache& kv) const {
  const HParams& hp = model_.hparams();
  const int64_t M = b.size();
  if (M == 0) fail("forward: empty batch");
  if (M > max_batch_) fail("forward: batch of ", M, " tokens exceeds the maximum ", max_batch_);
  if (b.pos.size() != size_t(M) || b.seq.size() != size_t(M) || b.want_logits.size() != size_t(M) ||
      (!b.lora.empty() && b.lora.size() != size_t(M)))
    fail("forward: batch fields have different lengths");
  for (int64_t i = 0; i < M; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= hp.n_vocab)
      fail("forward: token id ", b.tokens[i], " out of range [0, ", hp.n_vocab, ")");
    if (b.pos[i] < 0 || b.pos[i] >= kv.capacity(b.seq[i]))
      fail("forward: position ", b.pos[i], " of sequence ", b.seq[i],
           " is outside its KV capacity ", kv.capacity(b.seq[i]));
  }
}

const float* Forward::pre_norm(const float* w, int64_t M) {
  if (!w) return x_;
  const HParams& hp = model_.hparams();
  be_.rmsnorm(x_, w, h_, M, hp.dim, hp.rms_eps);
  return h_;
}

// x += Wo · softmax(q kᵀ / √d) v, with q, k, v = rmsnorm(x) · W{q,k,v} (+ bias), RoPE on q and k.
void Forward::attention_block(int32_t il, const Batch& b, KVCache& kv, int64_t M) {
  const HParams& hp = model_.hparams();
  const LayerWeights& L = w_.layers[size_t(il)];
  const float* in = pre_norm(L.attn_norm, M);
  // Q, K, V in one GEMM pass over the three weights (biases, if any, in its epilogue; LoRA
  // deltas before them).
  Backend::MatmulTarget t[3] = {{L.wq, q_, hp.q_dim(), L.bq}, {L.wk, k_, hp.kv_dim(), L.bk}, {L.wv, v_, hp.kv_dim(), L.bv}};
  if (lora_shrink(il, LoraInput::Qkv, in, hp.dim))
    for (int i = 0; i < 3; ++i) t[i].lora = lora_delta(il, LoraSlot(int(LoraSlot::Q) + i));
  if (fused_rope_) {  // RoPE on Q and K in the same pass, from the batch's cos/sin table
    for (int i = 0; i < 2; ++i) {
      t[i].rope_cs = rope_cs_.data();
      t[i].rope_head_dim = hp.head_dim;
      t[i].rope_n_rot = rope_.n_rot;
    }
    be_.matmul_multi(in, M, t, 3);
  } else {
    be_.matmul_multi(in, M, t, 3);
    // (in place: row by row; a row is a head, or a token's whole projection with qk_norm_whole)
    const int64_t q_row = hp.qk_norm_whole ? hp.q_dim() : hp.head_dim, k_row = hp.qk_norm_whole ? hp.kv_dim() : hp.head_dim;
    if (L.q_norm) be_.rmsnorm(q_, L.q_norm, q_, M * hp.q_dim() / q_row, q_row, hp.rms_eps);
    if (L.k_norm) be_.rmsnorm(k_, L.k_norm, k_, M * hp.kv_dim() / k_row, k_row, hp.rms_eps);
    const RopeParams& rope = hp.windowed(hp.first_layer + il) ? rope_swa_ : rope_;
    be_.rope(q_, M, hp.n_heads, hp.head_dim, b.pos.data(), rope);
    be_.rope(k_, M, hp.n_kv_heads, hp.head_dim, b.pos.data(), rope);
  }
  // Every entry's K/V goes into the cache first (in its stored type), so entries of one sequence
  // in this batch see each other (causally, through n_ctx = pos + 1).
  for (int64_t i = 0; i < M; ++i)
    kv.write(il, b.seq[i], b.pos[i], k_ + i * hp.kv_dim(), v_ + i * hp.kv_dim());
  for (int64_t i = 0; i < M; ++i) {
    views_[size_t(i)] = kv.view(il, b.seq[i]);
    n_ctx_[size_t(i)] = b.pos[i] + 1;
  }
  const AttentionShape shape{hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.attn_scale, hp.attn_softcap,
                             hp.layer_window(hp.first_layer + il), L.attn_sinks};
  be_.attention(q_, M, views_.data(), n_ctx_.data(), shape, attn_);
  residual_add(il, LoraSlot::O, attn_, M, L.wo, L.attn_post_norm, L.bo);  // x += [post_norm](attn · Woᵀ [+ bo])
}

// x += W_down · (act(W_gate · rmsnorm(x)) ⊙ W_up · rmsnorm(x)), act = SiLU or GELU (gemma2)
void Forward::ffn_block(int32_t il, int64_t M) {
  const HParams& hp = model_.hparams();
  const LayerWeights& L = w_.layers[size_t(il)];
  const float* in = pre_norm(L.ffn_norm, M);
  if (!L.experts.empty()) return moe_ffn(L, in, M);
  LoraDelta gu[2];
  if (lora_shrink(il, LoraInput::GateUp, in, hp.dim)) {
    gu[0] = lora_delta(il, LoraSlot::Gate);
    gu[1] = lora_delta(il, LoraSlot::Up);
  }
  // act(h·W_gateᵀ [+ gate delta]) ⊙ (h·W_upᵀ [+ up delta])
  be_.ffn_glu(in, M, L.w_gate, L.w_up, hp.ffn_act, gate_, gu[0].n || gu[1].n ? gu : nullptr);
  residual_add(il, LoraSlot::Down, gate_, M, L.w_down, L.ffn_post_norm, nullptr);  // x += [post_norm](that · W_downᵀ)
}

// Mixture of experts on h = `in` (rmsnorm(x), M x dim): each row's n_experts_used best experts by the
// router's logits h · W_routerᵀ (ties to the lower index), weighted by the softmax of those
// logits (llama.cpp's softmax over all experts, renormalised over the chosen: the same), and
// x += Σ w_e · W_down_e · (act(W_gate_e · h) ⊙ W_up_e · h). Each expert runs once over the rows
// routed to it (gathered); each row adds its experts' terms in expert order, so a row's result
// does not depend on the rest of the batch (chunking and batching change nothing).
void Forward::moe_ffn(const LayerWeights& L, const float* in, int64_t M) {
  const HParams& hp = model_.hparams();
  const int64_t E = hp.n_experts, K = hp.n_experts_used, D = hp.dim;
  be_.matmul(in, M, L.moe_router, moe_logits_.data());
  if (L.moe_router_b) be_.add_bias(moe_logits_.data(), M, E, L.moe_router_b);
  std::fill(moe_offsets_.begin(), moe_offsets_.end(), 0);
  for (int64_t m = 0; m < M; ++m) {
    const float* l = moe_logits_.data() + m * E;
    int32_t* c = moe_choice_.data() + m * K;
    float* w = moe_weight_.data() + m * K;
    for (int64_t j = 0; j < K; ++j) {  // selection of the K best (K is small: 2-8 of up to 256)
      int32_t best = -1;
      for (int32_t e = 0; e < E; ++e) {
        if (std::find(c, c + j, e) != c + j) continue;
        if (best < 0 || l[e] > l[best]) best = e;
      }
      c[j] = best;
    }
    // (c[0]'s logit is the largest: the softmax's shift) Over the chosen, or over all (qwen2moe).
    float sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += w[j] = std::exp(l[c[j]] - l[c[0]]);
    if (!hp.moe_renorm) {
      sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - l[c[0]]);
    }
    for (int64_t j = 0; j < K; ++j) {
      w[j] /= sum;
      ++moe_offsets_[size_t(c[j]) + 1];
    }
  }
  for (int64_t e = 0; e < E; ++e) moe_offsets_[size_t(e) + 1] += moe_offsets_[size_t(e)];
  // The rows of each expert, in row order, with their weights (moe_fill_: each expert's next slot).
  std::copy(moe_offsets_.begin(), moe_offsets_.end() - 1, moe_fill_.begin());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t slot = moe_fill_[size_t(moe_choice_[size_t(m * K + j)])]++;
      moe_rows_[size_t(slot)] = int32_t(m);
      moe_row_weight_[size_t(slot)] = moe_weight_[size_t(m * K + j)];
    }
  std::fill(moe_sum_.begin(), moe_sum_.begin() + M * D, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int32_t r0 = moe_offsets_[size_t(e)], n = moe_offsets_[size_t(e) + 1] - r0;
    if (n == 0) continue;
    for (int32_t j = 0; j < n; ++j)
      std::memcpy(moe_in_.data() + j * D, in + int64_t(moe_rows_[size_t(r0 + j)]) * D, size_t(D) * sizeof(float));
    const LayerWeights::Expert& ex = L.experts[size_t(e)];
    if (moe_up_.empty()) {  // act(gate) ⊙ up in the GEMM's epilogue
      be_.ffn_glu(moe_in_.data(), n, ex.gate, ex.up, hp.ffn_act, gate_);
    } else {  // gpt-oss: biases before the activation, which has no fused form
      const int64_t F = hp.expert_ffn_dim;
      const Backend::MatmulTarget t[2] = {{ex.gate, gate_, F, ex.gate_b}, {ex.up, moe_up_.data(), F, ex.up_b}};
      be_.matmul_multi(moe_in_.data(), n, t, 2);
      be_.glu(gate_, moe_up_.data(), hp.ffn_act, gate_, n, F);
    }
    if (ex.down_b) {
      const Backend::MatmulTarget down{ex.down, moe_out_.data(), D, ex.down_b};
      be_.matmul_multi(gate_, n, &down, 1);
    } else {
      be_.matmul(gate_, n, ex.down, moe_out_.data());
    }
    for (int32_t j = 0; j < n; ++j) {
      float* s = moe_sum_.data() + int64_t(moe_rows_[size_t(r0 + j)]) * D;
      const float* y = moe_out_.data() + j * D;
      const float w = moe_row_weight_[size_t(r0 + j)];
      for (int64_t d = 0; d < D; ++d) s[d] += w * y[d];
    }
  }
  if (L.w_gate_shexp.data) {  // qwen2moe: + sigmoid(h · g) W_down_s · (act(W_gate_s · h) ⊙ W_up_s · h)
    be_.ffn_glu(in, M, L.w_gate_shexp, L.w_up_shexp, hp.ffn_act, gate_);
    be_.matmul(gate_, M, L.w_down_shexp, moe_out_.data());
    for (int64_t m = 0; m < M; ++m) {
      const float* h = in + m * D;
      float logit = 0;
      for (int64_t d = 0; d < D; ++d) logit += h[d] * L.shexp_gate_inp[d];
      const float g = 1.0f / (1.0f + std::exp(-logit));
      float* s = moe_sum_.data() + m * D;
      const float* y = moe_out_.data() + m * D;
      for (int64_t d = 0; d < D; ++d) s[d] += g * y[d];
    }
  }
  if (L.ffn_post_norm) be_.rmsnorm(moe_sum_.data(), L.ffn_post_norm, moe_sum_.data(), M, D, hp.rms_eps);
  be_.add(x_, moe_sum_.data(), M, D);
}

// x += a · Wᵀ, fused into the GEMM's epilogue; with a post-norm (gemma2) x += rmsnorm(a · Wᵀ).
// (With LoRA: a · Wᵀ + the adapters' deltas of slot s, in the same epilogue.) A bias (gpt-oss's
// output projection) is added after the products: x += a · Wᵀ, then x += bias.
void Forward::residual_add(int32_t il, LoraSlot s, const float* a, int64_t M, const WeightView& W,
                           const float* post_norm, const float* bias) {
  const HParams& hp = model_.hparams();
  const LoraDelta d = lora_shrink(il, lora_input(s), a, W.n_cols) ? lora_delta(il, s) : LoraDelta{};
  if (!post_norm && !reduce_ && hp.residual_scale == 1.0f) {
    be_.matmul_add(a, M, W, x_, d);
    if (bias) be_.add_bias(x_, M, hp.dim, bias);
    return;
  }
  if (d.n == 0) {
    be_.matmul(a, M, W, h_);
  } else {  // (never with reduce_: enable_lora refuses it)
    Backend::MatmulTarget t{W, h_, W.n_rows};
    t.lora = d;
    be_.matmul_multi(a, M, &t, 1);
  }
  if (reduce_) reduce_->allreduce_sum(h_, M * hp.dim);  // tensor parallel: the ranks' partial sums
  if (bias) be_.add_bias(h_, M, hp.dim, bias);
  if (post_norm) be_.rmsnorm(h_, post_norm, h_, M, hp.dim, hp.rms_eps);  // (in place: row by row)
  if (hp.residual_scale != 1.0f) be_.scale(h_, M * hp.dim, hp.residual_scale);
  be_.add(x_, h_, M, hp.dim);
}

void Forward::run(const Batch& b, KVCache& kv, float* logits, float* hidden) {
  finish(begin(b, kv), logits, hidden);
}

Forward::Rows Forward::begin(const Batch& b, KVCache& kv) {
  validate(b, kv);
  lora_segments(b);
  const HParams& hp = model_.hparams();
  const ModelWeights& w = w_;
  const int64_t M = b.size();
  const int64_t D = hp.dim;
  be_.set_layer(-1);
  if (!link_ || link_->first_stage()) {
    be_.embed(w.token_embd, b.tokens.data(), M, x_);
    if (hp.embd_scale != 1.0f) be_.scale(x_, M * D, hp.embd_scale);
  } else {
    link_->recv_prev(x_, M * D);  // (the scale is the first stage's: x arrives scaled)
  }
  if (fused_rope_) be_.rope_table(b.pos.data(), M, rope_, rope_cs_.data());
  const bool yields = between_ && !link_ && !reduce_;
  for (int32_t il = 0; il < hp.n_layers; ++il) {
    be_.set_layer(hp.first_layer + il);
    attention_block(il, b, kv, M);
    if (link_) link_->progress();
    if (yields) {
      between_(double(2 * il + 1) / double(2 * hp.n_layers));
      be_.set_layer(hp.first_layer + il);  // (a step run there set its own)
    }
    ffn_block(il, M);
    if (link_) link_->progress();
    if (yields && il + 1 < hp.n_layers) between_(double(il + 1) / double(hp.n_layers));
  }
  be_.set_layer(-1);
  if (link_ && !link_->last_stage()) link_->send_next(x_, M * D);
  // Gather the output rows (logits rows, then hidden ones, each in batch order; the hidden
  // ones through h_, free now), then norm only those and project the logits rows.
  Rows rows;
  const bool here = !link_ || link_->last_stage();
  for (int64_t i = 0; i < M; ++i)
    if (b.want_logits[size_t(i)] == kOutHidden && here)
      std::memcpy(h_ + rows.hidden++ * D, x_ + i * D, size_t(D) * sizeof(float));
    else
      rows.hidden += b.want_logits[size_t(i)] == kOutHidden;
  for (int64_t i = 0; i < M; ++i) {
    if (b.want_logits[size_t(i)] != kOutLogits) continue;
    if (rows.logits != i && here) std::memcpy(x_ + rows.logits * D, x_ + i * D, size_t(D) * sizeof(float));
    ++rows.logits;
  }
  if (rows.hidden > 0 && here) std::memcpy(x_ + rows.logits * D, h_, size_t(rows.hidden * D) * sizeof(float));
  const int64_t n_out = rows.logits + rows.hidden;
  if (n_out > 0 && link_ && link_->last_stage()) link_->send_head(x_, n_out * D);  // (the last stage has no head)
  return rows;
}

void Forward::finish(Rows rows, float* logits, float* hidden) {
  const int64_t n_out = rows.logits + rows.hidden;
  if (n_out == 0 || (!logits && !hidden) || (link_ && link_->last_stage())) return;
  const HParams& hp = model_.hparams();
  const ModelWeights& w = w_;
  const int64_t D = hp.dim;
  if (link_) link_->recv_tail(x_, n_out * D);  // the last stage's output rows
  be_.rmsnorm(x_, w.output_norm, h_, n_out, D, hp.rms_eps);
  if (hidden && rows.hidden > 0) std::memcpy(hidden, h_ + rows.logits * D, size_t(rows.hidden * D) * sizeof(float));
  if (!logits || rows.logits == 0) return;
  be_.matmul(h_, rows.logits, w.output, logits);
  if (hp.logit_scale != 1.0f) be_.scale(logits, rows.logits * hp.n_vocab, 1.0f / hp.logit_scale);
  if (hp.final_softcap > 0) be_.softcap(logits, rows.logits * hp.n_vocab, hp.final_softcap);
}

}  // namespace ft
