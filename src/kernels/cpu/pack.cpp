// Repacking GGUF rows into the panel layout (packed.h), and its portable unpacker.
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/cpu/packed.h"
#include "kernels/quant_blocks.h"

namespace ft::cpu {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
float f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

// Element e (< block_len) of a Q4_K block: its 4-bit q and 32-wide sub-block.
int q4k_q(const blocks::Q4_K& b, int e) {
  const uint8_t byte = b.qs[(e / 64) * 32 + e % 32];
  return (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
}
// Element e of a Q6_K block: its unsigned 6-bit q (ggml's layout, see dequant_q6_k).
int q6k_q(const blocks::Q6_K& b, int e) {
  const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
  const uint8_t lo = b.ql[half * 64 + (quarter & 1) * 32 + l];
  const int nib = quarter < 2 ? (lo & 0xF) : (lo >> 4);
  const int hi = (b.qh[half * 32 + l] >> (2 * quarter)) & 3;
  return nib | (hi << 4);
}

}  // namespace

int64_t block_len(GGMLType t) {
  if (!is_supported_weight_type(t)) fail("panel layout: unsupported weight type ", int(t));
  return int64_t(type_traits(t).block_size);
}

uint64_t packed_block_bytes(GGMLType t) {
  switch (t) {
    case GGMLType::F32: return 16 * 4;
    case GGMLType::F16: case GGMLType::BF16: return 16 * 2;
    case GGMLType::Q8_0: return 32 + 32 * 16;
    case GGMLType::Q4_0: return 32 + 32 * 8;
    case GGMLType::Q4_K: return 32 + 32 + 8 * 16 + 8 * 16 + 256 * 8;
    case GGMLType::Q6_K: return 32 + 16 * 16 + 256 * 8 + 256 * 4;
    default: fail("panel layout: unsupported weight type ", int(t));
  }
}

void pack_rows(GGMLType t, const uint8_t* rows, uint64_t row_bytes, int64_t n_rows, int64_t K,
               uint8_t* out) {
  const int64_t bl = block_len(t);
  if (K % bl != 0) fail("panel layout: K = ", K, " is not a multiple of the block length ", bl);
  const uint64_t bb = packed_block_bytes(t), gb = group_bytes(t, K);
  const int64_t G = n_groups(n_rows), nb = K / bl;
  std::memset(out, 0, size_t(gb * uint64_t(G)));
  for (int64_t g = 0; g < G; ++g) {
    for (int r = 0; r < kGroup; ++r) {
      const int64_t n = g * kGroup + r;
      if (n >= n_rows) break;  // padding rows stay zero (their outputs are never stored)
      const uint8_t* row = rows + uint64_t(n) * row_bytes;
      for (int64_t ib = 0; ib < nb; ++ib) {
        uint8_t* blk = out + uint64_t(g) * gb + uint64_t(ib) * bb;
        const int nib_shift = r < 8 ? 0 : 4;
        const int byte_j = r % 8;
        switch (t) {
          case GGMLType::F32:
            std::memcpy(blk + 4 * r, row + 4 * ib, 4);
            break;
          case GGMLType::F16: case GGMLType::BF16:
            std::memcpy(blk + 2 * r, row + 2 * ib, 2);
            break;
          case GGMLType::Q8_0: {
            const auto& b = reinterpret_cast<const blocks::Q8_0*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            for (int k = 0; k < 32; ++k) blk[32 + k * 16 + r] = uint8_t(b.qs[k]);
            break;
          }
          case GGMLType::Q4_0: {
            const auto& b = reinterpret_cast<const blocks::Q4_0*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            for (int k = 0; k < 32; ++k) {
              const int q = k < 16 ? (b.qs[k] & 0xF) : (b.qs[k - 16] >> 4);
              blk[32 + k * 8 + byte_j] |= uint8_t(q << nib_shift);
            }
            break;
          }
          case GGMLType::Q4_K: {
            const auto& b = reinterpret_cast<const blocks::Q4_K*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            std::memcpy(blk + 32 + 2 * r, b.dmin, 2);
            for (int s = 0; s < 8; ++s) {
              uint8_t sc, m;
              blocks::scale_min_k4(s, b.scales, sc, m);
              blk[64 + s * 16 + r] = sc;
              blk[64 + 128 + s * 16 + r] = m;
            }
            uint8_t* q = blk + 64 + 256;
            for (int k = 0; k < 256; ++k) q[k * 8 + byte_j] |= uint8_t(q4k_q(b, k) << nib_shift);
            break;
          }
          case GGMLType::Q6_K: {
            const auto& b = reinterpret_cast<const blocks::Q6_K*>(row)[ib];
            std::memcpy(blk + 2 * r, b.d, 2);
            for (int s = 0; s < 16; ++s) blk[32 + s * 16 + r] = uint8_t(b.scales[s]);
            uint8_t* ql = blk + 32 + 256;
            uint8_t* qh = ql + 256 * 8;
            for (int k = 0; k < 256; ++k) {
              const int q = q6k_q(b, k);
              ql[k * 8 + byte_j] |= uint8_t((q & 0xF) << nib_shift);
              uint32_t h;
              std::memcpy(&h, qh + 4 * k, 4);
              h |= uint32_t(q >> 4) << (2 * r);
              std::memcpy(qh + 4 * k, &h, 4);
            }
            break;
          }
          default:
            fail("panel layout: unsupported weight type ", int(t));
        }
      }
    }
  }
}

void unpack_group(GGMLType t, const uint8_t* group, int64_t k0, int64_t len, float* Wp) {
  const int64_t bl = block_len(t);
  const uint64_t bb = packed_block_bytes(t);
  for (int64_t k = k0; k < k0 + len; ++k) {
    const uint8_t* blk = group + uint64_t(k / bl) * bb;
    const int e = int(k % bl);
    float* w = Wp + (k - k0) * kGroup;
    for (int r = 0; r < kGroup; ++r) {
      const int nib_shift = r < 8 ? 0 : 4, byte_j = r % 8;
      switch (t) {
        case GGMLType::F32: std::memcpy(&w[r], blk + 4 * r, 4); break;
        case GGMLType::F16: w[r] = f16(blk + 2 * r); break;
        case GGMLType::BF16: w[r] = bf16_to_f32(load_u16(blk + 2 * r)); break;
        case GGMLType::Q8_0: w[r] = float(int8_t(blk[32 + e * 16 + r])) * f16(blk + 2 * r); break;
        case GGMLType::Q4_0: {
          const int q = (blk[32 + e * 8 + byte_j] >> nib_shift) & 0xF;
          w[r] = float(q - 8) * f16(blk + 2 * r);
          break;
        }
        case GGMLType::Q4_K: {
          const int s = e / 32;
          const float d1 = f16(blk + 2 * r) * float(blk[64 + s * 16 + r]);
          const float m1 = f16(blk + 32 + 2 * r) * float(blk[64 + 128 + s * 16 + r]);
          const int q = (blk[64 + 256 + e * 8 + byte_j] >> nib_shift) & 0xF;
          w[r] = d1 * float(q) - m1;
          break;
        }
        case GGMLType::Q6_K: {
          const uint8_t* ql = blk + 32 + 256;
          uint32_t h;
          std::memcpy(&h, ql + 256 * 8 + 4 * e, 4);
          const int q = ((ql[e * 8 + byte_j] >> nib_shift) & 0xF) | int(((h >> (2 * r)) & 3) << 4);
          w[r] = f16(blk + 2 * r) * float(int8_t(blk[32 + (e / 16) * 16 + r])) * float(q - 32);
          break;
        }
        default:
          fail("panel layout: unsupported weight type ", int(t));
      }
    }
  }
}

}  // namespace ft::cpu
