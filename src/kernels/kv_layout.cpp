#include "kernels/kv_layout.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <string>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp16.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ft {

namespace {

constexpr GGMLType kKvTypes[] = {GGMLType::F16, GGMLType::BF16, GGMLType::Q8_0, GGMLType::F32};

// x (n,) -> q (n,) int8 with x ~= d * q; returns d = max|x| / 127 (0 for an all-zero block).
float quantize_block(const float* x, int32_t n, int8_t* q) {
  float amax = 0;
  for (int32_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  for (int32_t i = 0; i < n; ++i) q[i] = d > 0 ? int8_t(std::nearbyint(x[i] / d)) : int8_t(0);
  return d;
}

float to_f32(GGMLType t, const uint8_t* p) {
  uint16_t h;
  switch (t) {
    case GGMLType::F16: std::memcpy(&h, p, 2); return f16_to_f32(h);
    case GGMLType::BF16: std::memcpy(&h, p, 2); return bf16_to_f32(h);
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

void from_f32(GGMLType t, float x, uint8_t* p) {
  uint16_t h;
  switch (t) {
    case GGMLType::F16: h = f32_to_f16(x); std::memcpy(p, &h, 2); return;
    case GGMLType::BF16: h = f32_to_bf16(x); std::memcpy(p, &h, 2); return;
    default: std::memcpy(p, &x, 4); return;
  }
}

// out[i] = f32_to_f16(x[i]) for i < n, 8 at a time with F16C where the CPU has it (its round to
// nearest even gives the same bits for every input but NaN payloads). The KV cache's default
// type converts every K and V value of every layer as it is written: the scalar conversion made
// a 2,700-token prefill 9-11% slower with f16 KV than with f32.
#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* x, int32_t n, uint16_t* out) {
  int32_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = f32_to_f16(x[i]);
}
#endif
void f32_to_f16_row(const float* x, int32_t n, uint16_t* out) {
#if defined(__x86_64__)
  if (cpu_features().f16c) return f32_to_f16_f16c(x, n, out);
#endif
  for (int32_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

int32_t qblock_len(const KVGeometry& g, int32_t b) { return std::min(kKvQBlock, g.head_dim - b * kKvQBlock); }

}  // namespace

bool is_kv_type(GGMLType t) { return std::find(std::begin(kKvTypes), std::end(kKvTypes), t) != std::end(kKvTypes); }

GGMLType parse_kv_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  std::string known;
  for (GGMLType t : kKvTypes) {
    if (lower == kv_type_name(t)) return t;
    known += std::string(known.empty() ? "" : ", ") + std::string(kv_type_name(t));
  }
  fail("KV cache type '", name, "' is not one of ", known);
}

std::string_view kv_type_name(GGMLType t) { return type_traits(t).name; }

void KVGeometry::validate() const {
  if (!is_kv_type(type)) fail("KV cache: type ", type_traits(type).name, " cannot be stored (f16, bf16, q8_0, f32)");
  if (n_kv_heads <= 0 || head_dim <= 0 || block_size <= 0)
    fail("KV cache: invalid geometry (", n_kv_heads, " heads of ", head_dim, ", block size ", block_size, ")");
  if (block_size % kKvTile != 0)
    fail("KV cache: block size ", block_size, " is not a multiple of ", kKvTile, " (the K tile)");
  if (type == GGMLType::Q8_0 && head_dim % 4 != 0)
    fail("KV cache: q8_0 needs a head size that is a multiple of 4, got ", head_dim);
}

void kv_store(const KVGeometry& g, uint8_t* k_head, uint8_t* v_head, int32_t row, const float* k, const float* v) {
  const int32_t hd = g.head_dim, lane = row % kKvTile;
  uint8_t* tile = k_head + uint64_t(row / kKvTile) * g.k_tile_bytes();
  uint8_t* vr = v_head + uint64_t(row) * g.v_row_bytes();
  if (g.type == GGMLType::Q8_0) {
    int8_t kq[kKvQBlock];
    auto* ks = reinterpret_cast<int8_t*>(tile);
    auto* vq = reinterpret_cast<int8_t*>(vr);
    for (int32_t b = 0; b < g.q_blocks(); ++b) {
      const int32_t d0 = b * kKvQBlock, n = qblock_len(g, b);
      const float kd = quantize_block(k + d0, n, kq);
      for (int32_t i = 0; i < n; ++i) {
        const int32_t d = d0 + i;
        ks[(d / 4) * kKvTile * 4 + lane * 4 + d % 4] = kq[i];
      }
      std::memcpy(tile + uint64_t(hd) * kKvTile + (uint64_t(b) * kKvTile + uint64_t(lane)) * sizeof(float), &kd,
                  sizeof(float));
      const float vd = quantize_block(v + d0, n, vq + d0);
      std::memcpy(vr + uint64_t(hd) + uint64_t(b) * sizeof(float), &vd, sizeof(float));
    }
    return;
  }
  const uint64_t es = g.elem_bytes();
  if (g.type == GGMLType::F16) {  // V rows contiguous; K values strided into the tile's lane
    f32_to_f16_row(v, hd, reinterpret_cast<uint16_t*>(vr));
    uint16_t kh[64];
    for (int32_t d0 = 0; d0 < hd; d0 += 64) {
      const int32_t n = std::min(64, hd - d0);
      f32_to_f16_row(k + d0, n, kh);
      for (int32_t i = 0; i < n; ++i)
        std::memcpy(tile + (uint64_t(d0 + i) * kKvTile + uint64_t(lane)) * es, &kh[i], sizeof(uint16_t));
    }
    return;
  }
  for (int32_t d = 0; d < hd; ++d) {
    from_f32(g.type, k[d], tile + (uint64_t(d) * kKvTile + uint64_t(lane)) * es);
    from_f32(g.type, v[d], vr + uint64_t(d) * es);
  }
}

void kv_load_v_row(const KVGeometry& g, const uint8_t* p, float* v) {
  if (g.type == GGMLType::Q8_0) {
    const auto* q = reinterpret_cast<const int8_t*>(p);
    for (int32_t b = 0; b < g.q_blocks(); ++b) {
      float d;
      std::memcpy(&d, p + uint64_t(g.head_dim) + uint64_t(b) * sizeof(float), sizeof(float));
      for (int32_t i = b * kKvQBlock; i < b * kKvQBlock + qblock_len(g, b); ++i) v[i] = d * float(q[i]);
    }
    return;
  }
  for (int32_t d = 0; d < g.head_dim; ++d) v[d] = to_f32(g.type, p + uint64_t(d) * g.elem_bytes());
}

void kv_load(const KVGeometry& g, const uint8_t* k_head, const uint8_t* v_head, int32_t row, float* k, float* v) {
  if (v) kv_load_v_row(g, v_head + uint64_t(row) * g.v_row_bytes(), v);
  if (!k) return;
  const int32_t lane = row % kKvTile;
  const uint8_t* tile = k_head + uint64_t(row / kKvTile) * g.k_tile_bytes();
  if (g.type == GGMLType::Q8_0) {
    const auto* ks = reinterpret_cast<const int8_t*>(tile);
    for (int32_t b = 0; b < g.q_blocks(); ++b) {
      float d;
      std::memcpy(&d, tile + uint64_t(g.head_dim) * kKvTile + (uint64_t(b) * kKvTile + uint64_t(lane)) * sizeof(float),
                  sizeof(float));
      for (int32_t i = b * kKvQBlock; i < b * kKvQBlock + qblock_len(g, b); ++i)
        k[i] = d * float(ks[(i / 4) * kKvTile * 4 + lane * 4 + i % 4]);
    }
    return;
  }
  for (int32_t d = 0; d < g.head_dim; ++d)
    k[d] = to_f32(g.type, tile + (uint64_t(d) * kKvTile + uint64_t(lane)) * g.elem_bytes());
}

void kv_quantize_query(const float* q, int32_t head_dim, float scale, int8_t* qq, float* qd, int32_t* qsum) {
  float tmp[kKvQBlock];
  for (int32_t b = 0; b * kKvQBlock < head_dim; ++b) {
    const int32_t d0 = b * kKvQBlock, n = std::min(kKvQBlock, head_dim - d0);
    for (int32_t i = 0; i < n; ++i) tmp[i] = q[d0 + i] * scale;
    qd[b] = quantize_block(tmp, n, qq + d0);
    int32_t s = 0;
    for (int32_t i = 0; i < n; ++i) s += qq[d0 + i];
    qsum[b] = s;
  }
}

}  // namespace ft
