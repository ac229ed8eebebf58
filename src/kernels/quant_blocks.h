// Byte images of the ggml block formats (all members byte arrays: no padding, any alignment).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"

namespace ft::blocks {

constexpr int QK8_0 = 32;
constexpr int QK4_0 = 32;
constexpr int QK_K = 256;

struct Q8_0 {
  uint8_t d[2];  // f16
  int8_t qs[QK8_0];
};
struct Q4_0 {
  uint8_t d[2];           // f16
  uint8_t qs[QK4_0 / 2];  // elem j in the low nibble of qs[j], elem j+16 in the high nibble
};
struct Q4_K {
  uint8_t d[2];          // f16 super-block scale of the 6-bit scales
  uint8_t dmin[2];       // f16 super-block scale of the 6-bit mins
  uint8_t scales[12];    // 8 scales + 8 mins, 6 bits each (see scale_min_k4)
  uint8_t qs[QK_K / 2];  // per 64 elems: 32 bytes, low nibbles = first 32, high = next 32
};
struct Q6_K {
  uint8_t ql[QK_K / 2];      // low 4 bits
  uint8_t qh[QK_K / 4];      // high 2 bits
  int8_t scales[QK_K / 16];  // one per 16 elems
  uint8_t d[2];              // f16
};
// Activation format for K-quant dot products: float scale, int8 values, sums of 16.
struct Q8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};
static_assert(sizeof(Q8_0) == 34 && sizeof(Q4_0) == 18);
static_assert(sizeof(Q4_K) == 144 && sizeof(Q6_K) == 210 && sizeof(Q8_K) == 292);

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Scale j (0..7) and min of a Q4_K block from its 12 packed bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace ft::blocks
