// Block formats: hand-built blocks decode to independently computed values (bit-exact, with the
// same rounding steps as ggml), quantize->dequantize errors stay within per-format bounds, and
// the f16/bf16 scalar conversions round correctly.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "gguf/ggml_types.h"
#include "kernels/quant.h"
#include "test_util.h"

namespace ft {
namespace {

// Each step rounded to float separately, the way ggml's scalar code evaluates it.
float mul(float a, float b) {
  volatile float r = a * b;
  return r;
}
float sub(float a, float b) {
  volatile float r = a - b;
  return r;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

uint64_t fnv1a(const std::vector<uint8_t>& v) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : v) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}

void put_f16(uint8_t* p, uint16_t h) {
  p[0] = uint8_t(h & 0xFF);
  p[1] = uint8_t(h >> 8);
}

std::vector<float> random_row(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    // Portable uniform in [lo, hi) from the raw 32-bit output.
    x = lo + (hi - lo) * float(double(rng()) / 4294967296.0);
  }
  return v;
}

std::vector<uint8_t> quantize(GGMLType t, const std::vector<float>& x) {
  const auto bytes = row_bytes(t, x.size());
  EXPECT_TRUE(bytes.has_value());
  std::vector<uint8_t> q(bytes.value_or(0), 0xCD);
  quantize_row(t, x.data(), q.data(), int64_t(x.size()));
  return q;
}

std::vector<float> dequantize(GGMLType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(size_t(n), std::nanf(""));
  dequantize_row(t, q.data(), y.data(), n);
  return y;
}

// ------------------------------------------------------------------------------------------
// f16 / bf16 scalar conversions

TEST(Fp16, KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(0.5f), 0x3800);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);
}

TEST(Fp16, Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest half subnormal
  EXPECT_EQ(f16_to_f32(0x0001), tiny);
  EXPECT_EQ(f16_to_f32(0x03FF), 1023.0f * tiny);
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(f16_to_f32(0x8001), -tiny);
  EXPECT_EQ(f32_to_f16(tiny), 0x0001);
  EXPECT_EQ(f32_to_f16(1023.0f * tiny), 0x03FF);
  EXPECT_EQ(f32_to_f16(-5.0f * tiny), 0x8005);
  // Ties to even in the subnormal range, and underflow to (signed) zero.
  EXPECT_EQ(f32_to_f16(0.5f * tiny), 0x0000);
  EXPECT_EQ(f32_to_f16(1.5f * tiny), 0x0002);
  EXPECT_EQ(f32_to_f16(2.5f * tiny), 0x0002);
  EXPECT_EQ(f32_to_f16(0.5000001f * tiny), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.25f * tiny), 0x8000);
  EXPECT_EQ(f32_to_f16(1e-30f), 0x0000);
  // The largest subnormal plus half a unit rounds up into the normal range.
  EXPECT_EQ(f32_to_f16(1023.5f * tiny), 0x0400);
}

TEST(Fp16, InfNanOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16(inf), 0x7C00);
  EXPECT_EQ(f32_to_f16(-inf), 0xFC00);
  EXPECT_EQ(f16_to_f32(0x7C00), inf);
  EXPECT_EQ(f16_to_f32(0xFC00), -inf);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
  const uint16_t hn = f32_to_f16(std::nanf(""));
  EXPECT_EQ(hn & 0x7C00, 0x7C00);
  EXPECT_NE(hn & 0x03FF, 0);
  // A NaN whose payload lives only in the low float bits must stay NaN (not become inf).
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::bit_cast<float>(0x7F800001u)))));
  // 65520 is the midpoint between 65504 (odd mantissa) and 65536: rounds to inf.
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
}

TEST(Fp16, RoundingTies) {
  const float u = std::ldexp(1.0f, -10);  // half ulp at 1.0 is u/2
  EXPECT_EQ(f32_to_f16(1.0f + u / 2), 0x3C00);        // tie -> even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * u / 2), 0x3C02);    // tie -> even (up)
  EXPECT_EQ(f32_to_f16(1.0f + u / 2 + u / 1024), 0x3C01);  // just above the tie
  EXPECT_EQ(f32_to_f16(1.0f + u / 2 - u / 1024), 0x3C00);  // just below
  EXPECT_EQ(f32_to_f16(2047.0f / 1024.0f + u / 2), 0x4000);  // mantissa carry into exponent
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7C00, 0x7C00u);
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
    } else {
      ASSERT_EQ(f32_to_f16(f), h) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Fp16, RandomFloatsRoundToNearest) {
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    // Uniform over bit patterns in [2^-14, 65504): both neighbours are exact halves.
    const float f = std::bit_cast<float>(uint32_t(0x38800000u + rng() % (0x477FE000u - 0x38800000u)));
    const uint16_t h = f32_to_f16(f);
    const float r = f16_to_f32(h);
    const float other = f16_to_f32(uint16_t(r <= f ? h + 1 : h - 1));
    ASSERT_LE(std::fabs(r - f), std::fabs(other - f)) << f;
  }
}

TEST(Bf16, Conversions) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.5f), 0xC020);
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  const float u = std::ldexp(1.0f, -7);  // bf16 ulp at 1.0
  EXPECT_EQ(f32_to_bf16(1.0f + u / 2), 0x3F80);      // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * u / 2), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + u / 2 + u / 256), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflow rounds to inf
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_EQ(f32_to_bf16(std::ldexp(1.0f, -133)), 0x0001);  // bf16 subnormal
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Hand-built blocks

TEST(Quant, Q8_0HandBuilt) {
  uint8_t b[34];
  put_f16(b, 0xB800);  // d = -0.5
  for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(j * 8 - 127));
  std::vector<float> y(32);
  dequantize_row(GGMLType::Q8_0, b, y.data(), 32);
  EXPECT_EQ(y[0], 63.5f);    // -127 * -0.5
  EXPECT_EQ(y[16], -0.5f);   // 1 * -0.5
  EXPECT_EQ(y[31], -60.5f);  // 121 * -0.5
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], float(j * 8 - 127) * -0.5f);
}

TEST(Quant, Q4_0HandBuilt) {
  uint8_t b[18];
  put_f16(b, 0x4000);  // d = 2
  for (int j = 0; j < 16; ++j) b[2 + j] = uint8_t(j | ((15 - j) << 4));
  std::vector<float> y(32);
  dequantize_row(GGMLType::Q4_0, b, y.data(), 32);
  EXPECT_EQ(y[0], -16.0f);  // (0-8)*2
  EXPECT_EQ(y[15], 14.0f);  // (15-8)*2
  EXPECT_EQ(y[16], 14.0f);  // high nibble of byte 0 = 15
  EXPECT_EQ(y[31], -16.0f);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], float(j - 8) * 2.0f);
    EXPECT_EQ(y[j + 16], float(7 - j) * 2.0f);
  }
}

// Expected Q4_K values straight from the layout description: element e lies in 64-element chunk
// c = e/64; its first 32 elements are the low nibbles of qs[32c..32c+31] (sub-block 2c), the
// next 32 the high nibbles (sub-block 2c+1); x = (d*sc)*q - (dmin*m).
std::vector<float> decode_q4k_by_hand(const uint8_t* blk, const int* sc, const int* mn) {
  const float d = f16_to_f32(uint16_t(blk[0] | (blk[1] << 8)));
  const float dmin = f16_to_f32(uint16_t(blk[2] | (blk[3] << 8)));
  const uint8_t* qs = blk + 16;
  std::vector<float> y(256);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, r = e % 64, s = 2 * c + (r >= 32);
    const uint8_t byte = qs[32 * c + r % 32];
    const int q = r < 32 ? (byte & 0xF) : (byte >> 4);
    y[size_t(e)] = sub(mul(mul(d, float(sc[s])), float(q)), mul(dmin, float(mn[s])));
  }
  return y;
}

// Packs 6-bit scales/mins as ggml's get_scale_min_k4 unpacks them: bytes 0-3 hold scales 0-3 in
// their low 6 bits and the top 2 bits of scales 4-7; bytes 4-7 the same for mins; bytes 8-11
// hold the low 4 bits of scale j+4 (low nibble) and min j+4 (high nibble).
void pack_k4_by_hand(const int* sc, const int* mn, uint8_t* out12) {
  for (int j = 0; j < 4; ++j) {
    out12[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out12[j + 4] = uint8_t((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    out12[j + 8] = uint8_t((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

TEST(Quant, Q4_KHandBuilt) {
  const int sc[8] = {1, 5, 17, 33, 47, 63, 2, 40};
  const int mn[8] = {3, 0, 63, 20, 9, 31, 50, 16};
  uint8_t blk[144];
  put_f16(blk, 0x3800);      // d = 0.5
  put_f16(blk + 2, 0x3400);  // dmin = 0.25
  pack_k4_by_hand(sc, mn, blk + 4);
  for (int k = 0; k < 128; ++k) blk[16 + k] = uint8_t(k * 37 + 11);

  std::vector<float> y(256);
  dequantize_row(GGMLType::Q4_K, blk, y.data(), 256);
  // A few values by hand. qs[0] = 11 = 0x0B -> elem 0 q=11 (sub 0), elem 32 q=0 (sub 1).
  EXPECT_EQ(y[0], 4.75f);  // 0.5*1*11 - 0.25*3
  EXPECT_EQ(y[32], 0.0f);  // 0.5*5*0 - 0.25*0
  // qs[32*2 + 5] = (69*37+11) & 255 = 0x04 -> elem 133 q=4 (sub 4), elem 165 q=0 (sub 5).
  EXPECT_EQ(y[133], 91.75f);  // 0.5*47*4 - 0.25*9
  EXPECT_EQ(y[165], -7.75f);  // 0.5*63*0 - 0.25*31
  // qs[96+31] = (127*37+11) & 255 = 0x66 -> elem 223 q=6 (sub 6), elem 255 q=6 (sub 7).
  EXPECT_EQ(y[223], -6.5f);  // 0.5*2*6 - 0.25*50
  EXPECT_EQ(y[255], 116.0f);  // 0.5*40*6 - 0.25*16
  const auto ref = decode_q4k_by_hand(blk, sc, mn);
  for (int e = 0; e < 256; ++e) ASSERT_EQ(bits(y[size_t(e)]), bits(ref[size_t(e)])) << e;
}

TEST(Quant, Q4_KFullMantissaScales) {
  // d and dmin with full 11-bit mantissas and large scales/levels use every bit of the float
  // products; the subtraction must round exactly once, as in ggml.
  const int sc[8] = {63, 61, 59, 57, 55, 53, 51, 49};
  const int mn[8] = {62, 60, 58, 56, 54, 52, 50, 48};
  uint8_t blk[144];
  put_f16(blk, 0x2E67);      // d ~= 0.1
  put_f16(blk + 2, 0x2A67);  // dmin ~= 0.05
  pack_k4_by_hand(sc, mn, blk + 4);
  for (int k = 0; k < 128; ++k) blk[16 + k] = uint8_t(k * 73 + 5);
  std::vector<float> y(256);
  dequantize_row(GGMLType::Q4_K, blk, y.data(), 256);
  const auto ref = decode_q4k_by_hand(blk, sc, mn);
  for (int e = 0; e < 256; ++e) ASSERT_EQ(bits(y[size_t(e)]), bits(ref[size_t(e)])) << e;
}

// Expected Q6_K values from the layout description: element e in half h = e/128, row = (e%128)/32,
// l = e%32; low 4 bits from ql[64h + l + 32*(row&1)] (low nibble for rows 0,1, high for 2,3),
// high 2 bits from qh[32h + l] >> 2*row; scale scales[8h + 2*row + l/16]; x = (d*sc)*(q-32).
std::vector<float> decode_q6k_by_hand(const uint8_t* blk) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = f16_to_f32(uint16_t(blk[208] | (blk[209] << 8)));
  std::vector<float> y(256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, row = (e % 128) / 32, l = e % 32;
    const uint8_t lo_byte = ql[64 * h + l + 32 * (row & 1)];
    const int lo = row < 2 ? (lo_byte & 0xF) : (lo_byte >> 4);
    const int hi = (qh[32 * h + l] >> (2 * row)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    y[size_t(e)] = mul(mul(d, float(scales[8 * h + 2 * row + l / 16])), float(q));
  }
  return y;
}

TEST(Quant, Q6_KHandBuilt) {
  uint8_t blk[210];
  for (int k = 0; k < 128; ++k) blk[k] = uint8_t(k * 29 + 7);         // ql
  for (int k = 0; k < 64; ++k) blk[128 + k] = uint8_t(k * 53 + 100);  // qh
  const int8_t scales[16] = {-128, 127, 1, -1, 64, -64, 3, 100, -7, 9, 33, -33, 0, 12, -90, 77};
  std::memcpy(blk + 192, scales, 16);
  put_f16(blk + 208, 0x3400);  // d = 0.25
  std::vector<float> y(256);
  dequantize_row(GGMLType::Q6_K, blk, y.data(), 256);
  // elem 0: ql[0]=7 low=7, qh[0]=100=0b01100100 bits0-1=0 -> q=7-32=-25, scale -128.
  EXPECT_EQ(y[0], 800.0f);  // 0.25 * -128 * -25
  // elem 17: ql[17]=(17*29+7)&255=0xF4 low=4, qh[17]=(17*53+100)&255=0xE9 bits0-1=1
  //          -> q=(4|16)-32=-12, scale[1]=127.
  EXPECT_EQ(y[17], -381.0f);  // 0.25 * 127 * -12
  // elem 64+5 (row 2): ql[5]=152=0x98 high=9, qh[5]=109=0b01101101 bits4-5=2 -> q=41-32=9,
  //                    scale[4]=64.
  EXPECT_EQ(y[69], 144.0f);  // 0.25 * 64 * 9
  // elem 128+96+31 (h=1,row 3,l=31): ql[64+32+31]=ql[127]=(127*29+7)&255=0x6A high=6,
  //   qh[32+31]=(63*53+100)&255=0x6F bits6-7=1 -> q=(6|16)-32=-10, scale[8+6+1]=77.
  EXPECT_EQ(y[255], -192.5f);  // 0.25 * 77 * -10
  const auto ref = decode_q6k_by_hand(blk);
  for (int e = 0; e < 256; ++e) ASSERT_EQ(bits(y[size_t(e)]), bits(ref[size_t(e)])) << e;
}

// ------------------------------------------------------------------------------------------
// The other ggml block types (Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS): random blocks
// decoded by hand from ggml's struct layouts (byte offsets, written here independently of
// quant.cpp: Q3_K's scales through ggml's 32-bit mask arithmetic), each float step rounded as
// ggml's scalar dequantize_row_* rounds it, compared bit for bit.

float h16(const uint8_t* p) { return f16_to_f32(uint16_t(p[0] | (p[1] << 8))); }

const int kIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int kMX[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};  // E2M1 doubled

std::vector<float> decode_by_hand(GGMLType t, const uint8_t* b) {
  std::vector<float> y;
  switch (t) {
    case GGMLType::Q4_1:  // d @0, m @2, qs @4
      for (int e = 0; e < 32; ++e) {
        const int q = (b[4 + e % 16] >> (e < 16 ? 0 : 4)) & 15;
        y.push_back(mul(float(q), h16(b)) + h16(b + 2));
      }
      break;
    case GGMLType::Q5_0:  // d @0, qh @2 (u32), qs @6
    case GGMLType::Q5_1: {  // d @0, m @2, qh @4, qs @8
      const int off = t == GGMLType::Q5_0 ? 2 : 4;
      const uint32_t qh = uint32_t(b[off]) | uint32_t(b[off + 1]) << 8 | uint32_t(b[off + 2]) << 16 | uint32_t(b[off + 3]) << 24;
      for (int e = 0; e < 32; ++e) {
        const int q = ((b[off + 4 + e % 16] >> (e < 16 ? 0 : 4)) & 15) + 16 * int((qh >> e) & 1);
        y.push_back(t == GGMLType::Q5_0 ? mul(float(q - 16), h16(b)) : mul(float(q), h16(b)) + h16(b + 2));
      }
      break;
    }
    case GGMLType::IQ4_NL:  // d @0, qs @2
      for (int e = 0; e < 32; ++e) y.push_back(mul(h16(b), float(kIQ4[(b[2 + e % 16] >> (e < 16 ? 0 : 4)) & 15])));
      break;
    case GGMLType::Q2_K: {  // scales @0 (16), qs @16 (64), d @80, dmin @82
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, j = (e % 128) / 32, l = e % 32, s = b[8 * h + 2 * j + l / 16];
        const int q = (b[16 + 32 * h + l] >> (2 * j)) & 3;
        y.push_back(sub(mul(mul(h16(b + 80), float(s & 15)), float(q)), mul(h16(b + 82), float(s >> 4))));
      }
      break;
    }
    case GGMLType::Q3_K: {  // hmask @0 (32), qs @32 (64), scales @96 (12), d @108
      uint32_t aux[4];
      std::memcpy(aux, b + 96, 12);
      const uint32_t tmp = aux[2], k1 = 0x03030303, k2 = 0x0f0f0f0f;
      aux[2] = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4);
      aux[3] = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4);
      aux[0] = (aux[0] & k2) | (((tmp >> 0) & k1) << 4);
      aux[1] = (aux[1] & k2) | (((tmp >> 2) & k1) << 4);
      const auto* sc = reinterpret_cast<const int8_t*>(aux);
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, j = (e % 128) / 32, l = e % 32;
        const int q = ((b[32 + 32 * h + l] >> (2 * j)) & 3) - ((b[l] >> (4 * h + j)) & 1 ? 0 : 4);
        y.push_back(mul(mul(h16(b + 108), float(sc[8 * h + 2 * j + l / 16] - 32)), float(q)));
      }
      break;
    }
    case GGMLType::Q5_K: {  // d @0, dmin @2, scales @4 (12), qh @16 (32), qs @48 (128)
      for (int e = 0; e < 256; ++e) {
        const int c = e / 64, r = e % 64, s = 2 * c + (r >= 32);
        // get_scale_min_k4, from the 12 bytes (see pack_k4_by_hand).
        const uint8_t* q = b + 4;
        const int sc = s < 4 ? q[s] & 63 : (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
        const int mn = s < 4 ? q[s + 4] & 63 : (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
        const uint8_t byte = b[48 + 32 * c + r % 32];
        const int v = (r < 32 ? byte & 15 : byte >> 4) + ((b[16 + r % 32] >> s) & 1) * 16;
        y.push_back(sub(mul(mul(h16(b), float(sc)), float(v)), mul(h16(b + 2), float(mn))));
      }
      break;
    }
    case GGMLType::MXFP4: {  // e @0, qs @1; x = kvalues_mxfp4[q] * 2^(e - 128)
      const float d = std::ldexp(1.0f, int(b[0]) - 128);  // (2^-128, 2^-127 subnormal: exact)
      for (int e = 0; e < 32; ++e) y.push_back(mul(float(kMX[(b[1 + e % 16] >> (e < 16 ? 0 : 4)) & 15]), d));
      break;
    }
    case GGMLType::IQ4_XS: {  // d @0, scales_h @2 (u16), scales_l @4 (4), qs @8 (128)
      const int sh = b[2] | (b[3] << 8);
      for (int e = 0; e < 256; ++e) {
        const int s = e / 32, r = e % 32;
        const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4);
        const int q = (b[8 + 16 * s + r % 16] >> (r < 16 ? 0 : 4)) & 15;
        y.push_back(mul(mul(h16(b), float(ls - 32)), float(kIQ4[q])));
      }
      break;
    }
    default: ADD_FAILURE() << "no hand decoder for " << type_traits(t).name;
  }
  return y;
}

constexpr GGMLType kOtherTypes[] = {GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q2_K,
                                    GGMLType::Q3_K, GGMLType::Q5_K, GGMLType::IQ4_NL, GGMLType::IQ4_XS,
                                    GGMLType::MXFP4};

// Byte offsets of a block's f16 fields (random f16 bits there could be NaN/inf: keep them finite
// with full 11-bit mantissas, where the products use every bit).
std::vector<int> f16_offsets(GGMLType t) {
  switch (t) {
    case GGMLType::Q4_1: case GGMLType::Q5_1: case GGMLType::Q5_K: return {0, 2};
    case GGMLType::Q2_K: return {80, 82};
    case GGMLType::Q3_K: return {108};
    case GGMLType::MXFP4: return {};  // (its E8M0 byte takes every value: 0 and 1 the subnormal scales)
    default: return {0};
  }
}

TEST(Quant, OtherTypesRandomBlocksBitExact) {
  std::mt19937 rng(123);
  for (GGMLType t : kOtherTypes) {
    const TypeTraits tr = type_traits(t);
    const int nb = 64;
    std::vector<uint8_t> blocks(size_t(nb) * tr.type_size);
    for (auto& v : blocks) v = uint8_t(rng());
    for (int i = 0; i < nb; ++i)
      for (int off : f16_offsets(t)) {
        // sign, exponent 5..24 (2^-10 .. 2^9), random mantissa
        const uint16_t h = uint16_t((rng() & 0x8000) | ((5 + rng() % 20) << 10) | (rng() & 0x3FF));
        put_f16(blocks.data() + size_t(i) * tr.type_size + off, h);
      }
    const int64_t n = int64_t(nb) * tr.block_size;
    const auto y = dequantize(t, blocks, n);
    for (int i = 0; i < nb; ++i) {
      const auto ref = decode_by_hand(t, blocks.data() + size_t(i) * tr.type_size);
      ASSERT_EQ(ref.size(), tr.block_size);
      for (uint32_t e = 0; e < tr.block_size; ++e)
        ASSERT_EQ(bits(y[size_t(i) * tr.block_size + e]), bits(ref[e])) << tr.name << " block " << i << " elem " << e;
    }
  }
}

// Quantize -> dequantize on uniform rows in [-1, 1): the error stays within one step of the
// format's grid over that range (max), and its RMS within step / sqrt(12) (uniform rounding
// error) plus 20% (the scales are themselves quantized, and the fits minimise weighted, not
// plain, squared error). Steps: 2/15 (4-bit with min), 2/31 (5-bit), 2/15.5 and 2/31 (the
// symmetric Q4-like grids), 24/127 (IQ4's widest gap between levels), 2/7 (Q3_K), 2/3 (Q2_K).
TEST(Quant, OtherTypesRoundTrip) {
  struct Case {
    GGMLType t;
    double step;
  };
  for (const Case& c : {Case{GGMLType::Q4_1, 2.0 / 15}, Case{GGMLType::Q5_0, 2.0 / 31},
                        Case{GGMLType::Q5_1, 2.0 / 31}, Case{GGMLType::Q5_K, 2.0 / 31},
                        Case{GGMLType::IQ4_NL, 24.0 / 127}, Case{GGMLType::IQ4_XS, 24.0 / 127},
                        Case{GGMLType::Q3_K, 2.0 / 7}, Case{GGMLType::Q2_K, 2.0 / 3},
                        // MXFP4: amax in [0.5, 1) gives the scale 2^-4, whose top level 12 * 2^-4
                        // = 0.75 clips (ggml's rule): errors up to 0.25.
                        Case{GGMLType::MXFP4, 0.25}}) {
    const auto x = random_row(4096, 99);  // uniform in [-1, 1)
    const auto y = dequantize(c.t, quantize(c.t, x), int64_t(x.size()));
    double worst = 0, sq = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      worst = std::max(worst, double(std::fabs(y[i] - x[i])));
      sq += double(y[i] - x[i]) * double(y[i] - x[i]);
    }
    const double rms = std::sqrt(sq / double(x.size()));
    EXPECT_LE(worst, c.step) << type_traits(c.t).name;
    EXPECT_LE(rms, 1.2 * c.step / std::sqrt(12.0)) << type_traits(c.t).name;
    EXPECT_GT(rms, 0.0) << type_traits(c.t).name;
    std::printf("[ %s: max err %.4f, rms %.4f ]\n", type_traits(c.t).name.data(), worst, rms);
  }
}

// ------------------------------------------------------------------------------------------
// The i-quants on grids. Their codebooks and bit layouts are ggml's, so the truth is ggml's own
// dequantize_row_iq*: the reference build's libggml-base.so (../shared/reference, opened with
// dlopen; the test skips where it is absent).

constexpr GGMLType kGridTypes[] = {GGMLType::IQ2_XXS, GGMLType::IQ2_XS, GGMLType::IQ2_S, GGMLType::IQ3_XXS,
                                   GGMLType::IQ3_S,   GGMLType::IQ1_S,  GGMLType::IQ1_M};

// nb random blocks of grid or ternary type t whose f16 d is finite with a full mantissa (IQ1_M
// keeps it in the top nibbles of its four scale words, bytes 48-55; the ternary types last).
std::vector<uint8_t> random_grid_blocks(GGMLType t, int nb, std::mt19937& rng) {
  const uint32_t bb = type_traits(t).type_size;
  std::vector<uint8_t> blocks(size_t(nb) * bb);
  for (auto& v : blocks) v = uint8_t(rng());
  for (int i = 0; i < nb; ++i) {
    uint8_t* b = blocks.data() + size_t(i) * bb;
    const uint16_t h = uint16_t((rng() & 0x8000) | ((5 + rng() % 20) << 10) | (rng() & 0x3FF));
    if (t != GGMLType::IQ1_M) {
      put_f16(b + (t == GGMLType::TQ1_0 || t == GGMLType::TQ2_0 ? bb - 2 : 0), h);
      continue;
    }
    for (int w = 0; w < 4; ++w) {
      uint8_t* s = b + 48 + 2 * w;
      s[1] = uint8_t((s[1] & 0x0F) | (((h >> (4 * w)) & 0xF) << 4));
    }
  }
  return blocks;
}

class ReferenceLibrary {
 public:
  ReferenceLibrary() {
    const std::string p = test::shared_file("reference/libggml-base.so");
    if (!p.empty()) h_ = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h_) return;
    // ggml_init fills ggml's f16 -> f32 table, which its dequantizers read: a context of no
    // memory, freed at once.
    struct InitParams {
      size_t mem_size;
      void* mem_buffer;
      bool no_alloc;
    };
    auto init = reinterpret_cast<void* (*)(InitParams)>(dlsym(h_, "ggml_init"));
    auto free_ctx = reinterpret_cast<void (*)(void*)>(dlsym(h_, "ggml_free"));
    if (init && free_ctx) free_ctx(init(InitParams{0, nullptr, true}));
  }
  ~ReferenceLibrary() {
    if (h_) dlclose(h_);
  }
  ReferenceLibrary(const ReferenceLibrary&) = delete;
  ReferenceLibrary& operator=(const ReferenceLibrary&) = delete;
  bool ok() const { return h_ != nullptr; }
  using Dequantize = void (*)(const void*, float*, int64_t);
  Dequantize dequantize(GGMLType t) const {
    return reinterpret_cast<Dequantize>(dlsym(h_, ("dequantize_row_" + std::string(type_traits(t).name)).c_str()));
  }
  // quantize_*(src, dst, rows, per_row, importance) of a type needing no ggml_quantize_init.
  using Quantize = size_t (*)(const float*, void*, int64_t, int64_t, const float*);
  Quantize quantize(GGMLType t) const {
    return reinterpret_cast<Quantize>(dlsym(h_, ("quantize_" + std::string(type_traits(t).name)).c_str()));
  }

 private:
  void* h_ = nullptr;
};

TEST(Quant, IQTypesDecodeAsTheReferenceLibrary) {
  const ReferenceLibrary ref;
  if (!ref.ok()) GTEST_SKIP() << "no reference build (../shared/reference/libggml-base.so)";
  std::mt19937 rng(2024);
  for (GGMLType t : kGridTypes) {
    const auto deq = ref.dequantize(t);
    ASSERT_NE(deq, nullptr) << type_traits(t).name;
    const int nb = 256;
    const auto blocks = random_grid_blocks(t, nb, rng);
    const int64_t n = int64_t(nb) * 256;
    std::vector<float> want(size_t(n), std::nanf(""));
    deq(blocks.data(), want.data(), n);
    const auto got = dequantize(t, blocks, n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(bits(got[size_t(i)]), bits(want[size_t(i)])) << type_traits(t).name << " block " << i / 256 << " elem " << i % 256;
    // And the blocks our quantizer writes (Gaussian rows): every field where ggml reads it.
    std::normal_distribution<float> gauss(0.0f, 0.02f);
    std::vector<float> x(size_t(64) * 256);
    for (auto& v : x) v = gauss(rng);
    const auto q = quantize(t, x);
    std::vector<float> want_q(x.size());
    deq(q.data(), want_q.data(), int64_t(x.size()));
    const auto got_q = dequantize(t, q, int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits(got_q[i]), bits(want_q[i])) << type_traits(t).name << " at " << i;
  }
}

// Our quantizer (quant_iq.cpp; not llama-quantize's search) on Gaussian rows: the RMS error over
// the RMS of x stays within a bound per type (this quantizer's measured error plus ~10%), fewer
// bits never do better than more, and a block of zeros stays zeros. ggml's own quantize_iq*
// (uniform importance) on these rows, called once through the reference library (17 s, too slow
// to repeat here): 0.485, 0.449, 0.345, 0.300, 0.248, 0.181, 0.137 in the order below; ours
// 0.483, 0.434, 0.359, 0.303, 0.258, 0.193, 0.147 (0.97-1.08x).
TEST(Quant, IQTypesRoundTrip) {
  struct Case {
    GGMLType t;
    double bound;
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> x(size_t(64) * 256);
  for (auto& v : x) v = gauss(rng);
  double xx = 0;
  for (float v : x) xx += double(v) * v;
  double prev = INFINITY;  // (the cases in order of bits per weight: 1.56 .. 3.44)
  auto rel_error = [&](const std::vector<uint8_t>& q, GGMLType t) {
    const auto y = dequantize(t, q, int64_t(x.size()));
    double ee = 0;
    for (size_t i = 0; i < x.size(); ++i) ee += double(y[i] - x[i]) * double(y[i] - x[i]);
    return std::sqrt(ee / xx);
  };
  for (const Case& c : {Case{GGMLType::IQ1_S, 0.53}, Case{GGMLType::IQ1_M, 0.48}, Case{GGMLType::IQ2_XXS, 0.40},
                        Case{GGMLType::IQ2_XS, 0.34}, Case{GGMLType::IQ2_S, 0.29}, Case{GGMLType::IQ3_XXS, 0.215},
                        Case{GGMLType::IQ3_S, 0.165}}) {
    const double rel = rel_error(quantize(c.t, x), c.t);
    std::printf("[ %s: rms error %.4f of rms x", type_traits(c.t).name.data(), rel);
    std::printf(" ]\n");
    EXPECT_LE(rel, c.bound) << type_traits(c.t).name;
    EXPECT_LT(rel, prev) << type_traits(c.t).name;
    prev = rel;
    const std::vector<float> zeros(256, 0.0f);
    for (float v : dequantize(c.t, quantize(c.t, zeros), 256)) ASSERT_EQ(v, 0.0f) << type_traits(c.t).name;
    std::vector<float> bad(256, 0.5f);
    bad[77] = std::nanf("");
    EXPECT_THROW(quantize(c.t, bad), Error) << type_traits(c.t).name;
  }
}

// Random blocks' decode as a hash, recorded from ggml's own dequantize_row_iq* (the reference
// library, 2026-12-06; compared again wherever it is at hand): the layouts are checked where
// the library is absent too.
uint64_t hash_floats(const std::vector<float>& y) {
  std::vector<uint8_t> b(y.size() * 4);
  std::memcpy(b.data(), y.data(), b.size());
  return fnv1a(b);
}

// The ternary types (TQ1_0, TQ2_0): ggml's decode of random blocks (its library where at hand,
// and hashes recorded from it), ggml's quantizer byte for byte (where at hand), and the round
// trip within half a step (d = amax: every |error| <= amax / 2, plus d's f16 rounding).
TEST(Quant, TernaryTypesAsTheReference) {
  const ReferenceLibrary ref;
  std::mt19937 rng(77);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  const std::pair<GGMLType, uint64_t> recorded[] = {{GGMLType::TQ1_0, 0x1ebe1f15caaa54d9ull},
                                                    {GGMLType::TQ2_0, 0xff2e2ca744f00ad6ull}};
  for (const auto& [t, want] : recorded) {
    const int64_t n = 32 * 256;
    const auto blocks = random_grid_blocks(t, 32, rng);
    const auto y = dequantize(t, blocks, n);
    EXPECT_EQ(hash_floats(y), want) << type_traits(t).name;
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = gauss(rng);
    const auto q = quantize(t, x);
    if (ref.ok()) {
      std::vector<float> yr(static_cast<size_t>(n));
      ref.dequantize(t)(blocks.data(), yr.data(), n);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits(y[i]), bits(yr[i])) << type_traits(t).name << " at " << i;
      std::vector<uint8_t> qr(q.size());
      ref.quantize(t)(x.data(), qr.data(), n / 256, 256, nullptr);
      EXPECT_EQ(q, qr) << type_traits(t).name << ": our quantizer's bytes";
    }
    const auto back = dequantize(t, q, n);
    for (int64_t b = 0; b < n / 256; ++b) {
      float amax = 0;
      for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[size_t(256 * b + j)]));
      for (int j = 0; j < 256; ++j)
        ASSERT_LE(std::fabs(back[size_t(256 * b + j)] - x[size_t(256 * b + j)]), amax * (0.5f + 0x1p-11f))
            << type_traits(t).name << " at " << 256 * b + j;
    }
  }
}

TEST(Quant, IQTypesDecodeAsRecordedFromTheReference) {
  const std::pair<GGMLType, uint64_t> recorded[] = {
      {GGMLType::IQ2_XXS, 0xc6d7647bdca40e3cull}, {GGMLType::IQ2_XS, 0xe72967b19e85d6e3ull},
      {GGMLType::IQ2_S, 0xbb52f993dc7bec51ull},   {GGMLType::IQ3_XXS, 0xd987fb1707060062ull},
      {GGMLType::IQ3_S, 0xa1d9967f35787c7aull},   {GGMLType::IQ1_S, 0x8b1f0fc1602ec462ull},
      {GGMLType::IQ1_M, 0x614f57cf14826801ull}};
  const ReferenceLibrary ref;
  std::mt19937 rng(31);
  for (const auto& [t, want] : recorded) {
    const auto blocks = random_grid_blocks(t, 32, rng);
    const int64_t n = 32 * 256;
    const auto hash = hash_floats;
    EXPECT_EQ(hash(dequantize(t, blocks, n)), want) << type_traits(t).name;
    if (ref.ok()) {
      std::vector<float> y(static_cast<size_t>(n));
      ref.dequantize(t)(blocks.data(), y.data(), n);
      EXPECT_EQ(hash(y), want) << type_traits(t).name << " (the reference library)";
    }
  }
}

// ------------------------------------------------------------------------------------------
// Quantize -> dequantize

TEST(Quant, F32IsExact) {
  const auto x = random_row(96, 1);
  const auto y = dequantize(GGMLType::F32, quantize(GGMLType::F32, x), 96);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(bits(x[i]), bits(y[i]));
}

TEST(Quant, F16AndBF16RoundTrip) {
  std::mt19937 rng(3);
  std::vector<float> xh(1000), xb(1000);
  for (size_t i = 0; i < xh.size(); ++i) {
    uint16_t h;
    do h = uint16_t(rng()); while ((h & 0x7C00) == 0x7C00);  // finite halves
    xh[i] = f16_to_f32(h);
    uint16_t b;
    do b = uint16_t(rng()); while ((b & 0x7F80) == 0x7F80);  // finite bf16
    xb[i] = bf16_to_f32(b);
  }
  const auto yh = dequantize(GGMLType::F16, quantize(GGMLType::F16, xh), 1000);
  const auto yb = dequantize(GGMLType::BF16, quantize(GGMLType::BF16, xb), 1000);
  for (size_t i = 0; i < xh.size(); ++i) {
    ASSERT_EQ(bits(xh[i]), bits(yh[i]));
    ASSERT_EQ(bits(xb[i]), bits(yb[i]));
  }
  // Non-representable values: within half an ulp (relative 2^-11 for f16, 2^-8 for bf16).
  const auto x = random_row(256, 4, -100.0f, 100.0f);
  const auto h = dequantize(GGMLType::F16, quantize(GGMLType::F16, x), 256);
  const auto b = dequantize(GGMLType::BF16, quantize(GGMLType::BF16, x), 256);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) < 1e-3f) continue;
    EXPECT_LE(std::fabs(h[i] - x[i]), std::fabs(x[i]) * 0x1p-11f);
    EXPECT_LE(std::fabs(b[i] - x[i]), std::fabs(x[i]) * 0x1p-8f);
  }
}

TEST(Quant, Q8_0RoundTrip) {
  for (int64_t n : {32, 96, 1024}) {
    const auto x = random_row(n, uint32_t(n), -3.0f, 2.0f);
    const auto q = quantize(GGMLType::Q8_0, x);
    const auto y = dequantize(GGMLType::Q8_0, q, n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(b * 32 + j)]));
      const float d = amax / 127;
      const float d16 = f16_to_f32(uint16_t(q[size_t(b * 34)] | (q[size_t(b * 34 + 1)] << 8)));
      // Rounding to the grid of the exact d is within d/2; storing d as f16 moves a level q by
      // at most 127*|d - d16|.
      const float bound = d / 2 + 127 * std::fabs(d - d16) + 1e-6f * amax;
      for (int j = 0; j < 32; ++j) {
        const size_t i = size_t(b * 32 + j);
        ASSERT_LE(std::fabs(y[i] - x[i]), bound) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(Quant, Q4_0RoundTrip) {
  for (int64_t n : {32, 96, 1024}) {
    const auto x = random_row(n, uint32_t(n) + 1, -2.0f, 3.0f);
    const auto q = quantize(GGMLType::Q4_0, x);
    const auto y = dequantize(GGMLType::Q4_0, q, n);
    double sq = 0, step2 = 0;
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(b * 32 + j)]));
      const float d = amax / 8;  // |max / -8|
      const float d16 = std::fabs(f16_to_f32(uint16_t(q[size_t(b * 18)] | (q[size_t(b * 18 + 1)] << 8))));
      // Levels -8..7 times d: values above 7.5*d clip to 7*d (error up to d), others within d/2.
      const float bound = d + 8 * std::fabs(d - d16) + 1e-6f * amax;
      for (int j = 0; j < 32; ++j) {
        const size_t i = size_t(b * 32 + j);
        const float err = std::fabs(y[i] - x[i]);
        ASSERT_LE(err, bound) << "n=" << n << " i=" << i;
        if (x[i] * (-d16) < 7.4f * d * d) {  // not in the clipped range
          ASSERT_LE(err, d / 2 + 8 * std::fabs(d - d16) + 1e-6f * amax) << i;
        }
        sq += double(err) * err;
        step2 += double(d) * d;
      }
      // The element of largest magnitude is exact (up to the f16 rounding of d).
    }
    EXPECT_LT(std::sqrt(sq / step2), 0.4);  // uniform rounding noise is step/sqrt(12) = 0.29
  }
}

// Independent Q4_K decoder over a whole row (scales unpacked from the bytes by the layout rule).
std::vector<float> decode_q4k_row(const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y;
  for (int64_t b = 0; b < n / 256; ++b) {
    const uint8_t* blk = q.data() + b * 144;
    int sc[8], mn[8];
    for (int j = 0; j < 4; ++j) {
      sc[j] = blk[4 + j] & 63;
      mn[j] = blk[8 + j] & 63;
      sc[j + 4] = (blk[12 + j] & 15) | ((blk[4 + j] >> 6) << 4);
      mn[j + 4] = (blk[12 + j] >> 4) | ((blk[8 + j] >> 6) << 4);
    }
    const auto yb = decode_q4k_by_hand(blk, sc, mn);
    y.insert(y.end(), yb.begin(), yb.end());
  }
  return y;
}

TEST(Quant, Q4_KRoundTrip) {
  for (int64_t n : {256, 512, 1280}) {
    // Mixed offsets per sub-block so the min term matters (some sub-blocks all positive).
    auto x = random_row(n, uint32_t(n) + 2, -1.0f, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] += 0.3f * float((i / 32) % 5) - 0.2f;
    const auto q = quantize(GGMLType::Q4_K, x);
    const auto y = dequantize(GGMLType::Q4_K, q, n);
    const auto ref = decode_q4k_row(q, n);
    double sq = 0, var = 0;
    for (int64_t s = 0; s < n / 32; ++s) {  // per sub-block of 32
      float lo = 0, hi = x[size_t(s * 32)];
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[size_t(s * 32 + j)]);
        hi = std::max(hi, x[size_t(s * 32 + j)]);
      }
      // 15 steps span [min(x,0), max(x)]; with 6-bit scale/min rounding and clipping the
      // worst element may be off by up to one step, never more.
      const float step = (hi - lo) / 15;
      for (int j = 0; j < 32; ++j) {
        const size_t i = size_t(s * 32 + j);
        ASSERT_EQ(bits(y[i]), bits(ref[i])) << "layout mismatch at " << i;
        const float err = std::fabs(y[i] - x[i]);
        ASSERT_LE(err, step) << "n=" << n << " i=" << i;
        sq += double(err) * err;
        var += double(step) * step;
      }
    }
    EXPECT_LT(std::sqrt(sq / var), 0.4) << n;  // about step/sqrt(12) expected
  }
}

TEST(Quant, Q6_KRoundTrip) {
  for (int64_t n : {256, 768}) {
    auto x = random_row(n, uint32_t(n) + 3, -1.0f, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] *= 0.5f + float((i / 16) % 7) * 0.25f;
    const auto q = quantize(GGMLType::Q6_K, x);
    const auto y = dequantize(GGMLType::Q6_K, q, n);
    double sq = 0, var = 0;
    for (int64_t b = 0; b < n / 256; ++b) {
      const auto ref = decode_q6k_by_hand(q.data() + b * 210);
      for (int s = 0; s < 16; ++s) {
        float amax = 0;
        for (int j = 0; j < 16; ++j) amax = std::max(amax, std::fabs(x[size_t(b * 256 + s * 16 + j)]));
        // 6-bit signed levels: step ~ amax/32; scales are int8 relative to the block maximum.
        const float step = amax / 32;
        for (int j = 0; j < 16; ++j) {
          const size_t i = size_t(b * 256 + s * 16 + j);
          ASSERT_EQ(bits(y[i]), bits(ref[size_t(s * 16 + j)])) << "layout mismatch at " << i;
          const float err = std::fabs(y[i] - x[i]);
          ASSERT_LE(err, step) << "n=" << n << " i=" << i;
          sq += double(err) * err;
          var += double(step) * step;
        }
      }
    }
    EXPECT_LT(std::sqrt(sq / var), 0.4) << n;
  }
}

// The quantizers reproduce ggml's quantize_row_*_ref byte for byte. The hashes were produced by
// ggml's reference code (ggml-quants.c, evaluated without FMA contraction) on this input, which
// needs no libm so it is identical everywhere.
TEST(Quant, MatchesGgmlReferenceBytes) {
  const int64_t n = 1024;
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    x[size_t(i)] = float((i * 7919) % 1000 - 500) / 250.0f * float((i / 32) % 3 + 1) +
                   float((i / 64) % 4) * 0.5f;
  }
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q4_0, x)), 0xcb99f2990831de49ull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q8_0, x)), 0xac84915a9241b0fdull);
  const auto q4k = quantize(GGMLType::Q4_K, x);
  EXPECT_EQ(fnv1a(q4k), 0xf65332c8908fc267ull);
  const std::vector<uint8_t> head = {0x2e, 0x22, 0x72, 0x2d, 0x95, 0xea, 0x7d, 0x95, 0x97, 0xee};
  EXPECT_EQ(std::vector<uint8_t>(q4k.begin(), q4k.begin() + 10), head);
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q6_K, x)), 0xd0f13cf7d061e4c3ull);
  // The other types: ggml_quantize_chunk without an importance matrix (llama-quantize's path:
  // the *_ref quantizers, IQ4 with 7 scale trials) of llama.cpp b4748, same input.
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q4_1, x)), 0xf99464bb70703e4dull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q5_0, x)), 0xfc33ddf4446aec0dull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q5_1, x)), 0x11f4d74f7bb36eb3ull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q2_K, x)), 0x9af24801bc8a90f7ull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q3_K, x)), 0x53379aac63e8c143ull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::Q5_K, x)), 0x6d289eb2f4bbb332ull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::IQ4_NL, x)), 0xad1913bb63d8dbfeull);
  EXPECT_EQ(fnv1a(quantize(GGMLType::IQ4_XS, x)), 0x80b2ee4f59db44d7ull);
}

TEST(Quant, ZeroBlocksStayZero) {
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::Q5_0,
                     GGMLType::Q5_K, GGMLType::Q3_K, GGMLType::Q2_K, GGMLType::IQ4_NL, GGMLType::IQ4_XS,
                     GGMLType::MXFP4}) {
    std::vector<float> x(512, 0.0f);
    x[300] = 0.75f;  // one non-zero element in the second super-block
    const auto y = dequantize(t, quantize(t, x), 512);
    for (size_t i = 0; i < 256; ++i) ASSERT_EQ(y[i], 0.0f) << type_traits(t).name << " " << i;
    EXPECT_NEAR(y[300], 0.75f, 0.01f) << type_traits(t).name;
  }
}

// MXFP4's quantizer (ggml's quantize_row_mxfp4_ref) on hand-made blocks: e = floor(log2(amax))
// - 2 + 127 (0 for an all-zero block), each value the index of its nearest level kvalues[i] *
// 2^(e - 128), the first index (0..15) on a tie; byte j = idx(x[j]) | idx(x[j + 16]) << 4.
struct MxBlock {
  uint8_t e;
  int idx[32];
};
MxBlock mx_quantize(const std::vector<float>& x) {
  EXPECT_EQ(x.size(), 32u);
  const auto q = quantize(GGMLType::MXFP4, x);
  EXPECT_EQ(q.size(), 17u);
  MxBlock b{q[0], {}};
  for (int j = 0; j < 16; ++j) {
    b.idx[j] = q[size_t(1 + j)] & 15;
    b.idx[j + 16] = q[size_t(1 + j)] >> 4;
  }
  return b;
}

TEST(Quant, Mxfp4QuantizerHandMadeBlocks) {
  {  // all zero (and negative zero): e = 0, every index 0 (-0 ties 0 at index 0)
    std::vector<float> x(32, 0.0f);
    x[5] = -0.0f;
    const auto q = quantize(GGMLType::MXFP4, x);
    EXPECT_EQ(q, std::vector<uint8_t>(17, 0));
  }
  {  // amax exactly 4 = 2^2: e = 127, d = 1/2; index: level 0: 0, 1: .5, 2: 1, 3: 1.5, 4: 2, 5: 3,
     // 6: 4, 7: 6, 8: -0, 9: -.5, 10: -1, 11: -1.5, 12: -2, 13: -3, 14: -4, 15: -6
    std::vector<float> x(32, 0.0f);
    const float v[] = {4.0f, 2.5f, -2.5f, 0.25f, -0.25f, 3.5f, -3.5f, 0.75f, 1.25f, -1.75f, 0.5f, -0.5f,
                       1.0f, -4.0f, 0.1f, -0.3f, 2.0f, -3.0f, 3.0f, 1.5f, -1.5f, -1.0f};
    for (size_t j = 0; j < std::size(v); ++j) x[j] = v[j];
    const MxBlock b = mx_quantize(x);
    EXPECT_EQ(b.e, 127);
    // Ties go to the first index: 2.5 -> 4 (2), not 5 (3); -2.5 -> 12 (-2), not 13; 0.25 -> 0,
    // not 1; -0.25 -> 0 (+0), not 8 (-0) or 9 (-.5); 3.5 -> 5; -3.5 -> 13; .75 -> 1; 1.25 -> 2;
    // -1.75 -> 11.
    const int want[] = {6, 4, 12, 0, 0, 5, 13, 1, 2, 11, 1, 9, 2, 14, 0, 9, 4, 13, 5, 3, 11, 10};
    for (size_t j = 0; j < std::size(want); ++j) EXPECT_EQ(b.idx[j], want[j]) << "x = " << v[j];
    for (size_t j = std::size(want); j < 32; ++j) EXPECT_EQ(b.idx[j], 0) << j;
  }
  {  // amax just below a power of two, negative: -(4 - 2^-22) -> floor(log2) = 1, e = 126, d = 1/4
    std::vector<float> x(32, 0.0f);
    x[0] = -std::nextafter(4.0f, 0.0f);
    x[31] = 1.0f;
    const MxBlock b = mx_quantize(x);
    EXPECT_EQ(b.e, 126);
    EXPECT_EQ(b.idx[0], 15);   // -12 * 1/4 = -3, the most negative level (clipped from ~-4)
    EXPECT_EQ(b.idx[31], 4);   // 4 * 1/4
  }
  {  // amax exactly 8 = 2^3, from a negative value: e = 128, d = 1 (the levels themselves)
    std::vector<float> x(32, 0.0f);
    const float v[] = {-8.0f, -7.0f, 7.0f, -0.5f, 0.5f, -5.0f, 5.0f, -3.0f, 6.0f};
    for (size_t j = 0; j < std::size(v); ++j) x[j] = v[j];
    const MxBlock b = mx_quantize(x);
    EXPECT_EQ(b.e, 128);
    // -7 ties -6 (13) and -8 (14); 7 ties 6 (5) and 8 (6); +-0.5 tie 0 (0) and +-1; -5 ties -4
    // (12) and -6 (13); 5 ties 4 (4) and 6 (5): the first each time.
    const int want[] = {14, 13, 5, 0, 0, 12, 4, 11, 5};
    for (size_t j = 0; j < std::size(want); ++j) EXPECT_EQ(b.idx[j], want[j]) << "x = " << v[j];
  }
  {  // the second half's indices in the high nibbles
    std::vector<float> x(32, 0.0f);
    x[3] = 1.0f;    // e = 125, d = 1/8: 1 = 8 d at index 6
    x[19] = -0.5f;  // -4 d at index 12
    const auto q = quantize(GGMLType::MXFP4, x);
    EXPECT_EQ(q[0], 125);
    EXPECT_EQ(q[1 + 3], 6 | (12 << 4));
  }
  {  // tiny amax: 2^-125 -> e = 0, d = 2^-128 (a subnormal scale): 2^-125 = 8 d at index 6
    std::vector<float> x(32, 0.0f);
    x[0] = std::ldexp(1.0f, -125);
    x[1] = -std::ldexp(3.0f, -128);  // -3 d at index 11
    const MxBlock b = mx_quantize(x);
    EXPECT_EQ(b.e, 0);
    EXPECT_EQ(b.idx[0], 6);
    EXPECT_EQ(b.idx[1], 11);
    const auto y = dequantize(GGMLType::MXFP4, quantize(GGMLType::MXFP4, x), 32);
    EXPECT_EQ(y[0], x[0]);
    EXPECT_EQ(y[1], x[1]);
  }
  // Below 2^-125, ggml's (uint8_t)(floorf(log2f(amax)) - 2 + 127) converts a negative float
  // (undefined behaviour; x86 wraps it modulo 256): amax = 2^-126 gives -1 -> 255 (NaN in the MX
  // format: a block the loader refuses), 2^-149 (the least subnormal) -24 -> 232 (scale 2^104,
  // every value 0). Ours clamps to e = 0 (scale 2^-128), never 255 for a nonzero finite block:
  // 2^-126 = 4 x 2^-128 round-trips exactly, 2^-149 (2^-21 of the scale) becomes index 0 (+0).
  {
    std::vector<float> x(32, 0.0f);
    x[2] = -std::ldexp(1.0f, -126);
    x[3] = std::ldexp(1.0f, -127);  // 2 d at index 2
    const MxBlock b = mx_quantize(x);
    EXPECT_EQ(b.e, 0);
    EXPECT_EQ(b.idx[2], 12);  // -4 d
    EXPECT_EQ(b.idx[3], 2);
    const auto y = dequantize(GGMLType::MXFP4, quantize(GGMLType::MXFP4, x), 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(bits(y[size_t(j)]), bits(x[size_t(j)])) << j;
  }
  {
    std::vector<float> x(32, 0.0f);
    x[7] = std::ldexp(1.0f, -149);
    ASSERT_GT(x[7], 0.0f);
    const MxBlock b = mx_quantize(x);
    EXPECT_EQ(b.e, 0);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(b.idx[j], 0) << j;
    for (float v : dequantize(GGMLType::MXFP4, quantize(GGMLType::MXFP4, x), 32)) EXPECT_EQ(bits(v), 0u);
  }
  // Every power of two and its neighbours down to the subnormals: e never 255, and it is ggml's
  // (log2f as the code computes it) wherever that is defined (>= 0).
  for (int p = -149; p <= 127; ++p)
    for (const float a : {std::ldexp(1.0f, p), std::nextafter(std::ldexp(1.0f, p), 0.0f),
                          std::nextafter(std::ldexp(1.0f, p), INFINITY)}) {
      if (!(a > 0.0f) || !std::isfinite(a)) continue;
      std::vector<float> x(32, 0.0f);
      x[0] = a;
      const MxBlock b = mx_quantize(x);
      const float f = std::floor(log2f(a)) - 2 + 127;
      ASSERT_NE(int(b.e), 255) << a;
      ASSERT_EQ(int(b.e), f >= 0.0f ? int(f) : 0) << a;
    }
}

// Dequantization at the extremes of the E8M0 scale: e = 0 and 1 are the f32 subnormals 2^-128
// and 2^-127 (ggml's special case), e = 254 the largest normal scale, e = 255 overflows 12 x.
TEST(Quant, Mxfp4DequantScales) {
  struct Case {
    uint8_t e;
    float d;
  };
  for (const Case c : {Case{0, std::ldexp(1.0f, -128)}, Case{1, std::ldexp(1.0f, -127)},
                       Case{2, std::ldexp(1.0f, -126)}, Case{104, std::ldexp(1.0f, -24)},
                       Case{128, 1.0f}, Case{143, 32768.0f}, Case{254, std::ldexp(1.0f, 126)}}) {
    std::vector<uint8_t> blk(17);
    blk[0] = c.e;
    for (int j = 0; j < 16; ++j) blk[size_t(1 + j)] = uint8_t(j | ((15 - j) << 4));
    const auto y = dequantize(GGMLType::MXFP4, blk, 32);
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(bits(y[size_t(j)]), bits(float(kMX[j]) * c.d)) << int(c.e) << " " << j;
      EXPECT_EQ(bits(y[size_t(j + 16)]), bits(float(kMX[15 - j]) * c.d)) << int(c.e) << " " << j;
    }
    EXPECT_EQ(y[1], c.d) << int(c.e);  // level 1 is the scale itself, exactly
  }
  EXPECT_GT(std::ldexp(1.0f, -128), 0.0f);
  std::vector<uint8_t> blk(17, 0);
  blk[0] = 255;
  blk[1] = 7;  // 12 * 2^127
  EXPECT_TRUE(std::isinf(dequantize(GGMLType::MXFP4, blk, 32)[0]));
}

// The quantizer on random rows: every index is a nearest level (no other level strictly closer,
// in exact arithmetic: the level products are exact), and e follows amax.
TEST(Quant, Mxfp4QuantizerPicksNearestLevels) {
  for (const float scale : {1.0f, 1e-3f, 37.0f, 1e-30f}) {
    const auto x = random_row(32 * 64, 7, -scale, scale);
    const auto q = quantize(GGMLType::MXFP4, x);
    for (int b = 0; b < 64; ++b) {
      const uint8_t* blk = q.data() + 17 * b;
      double amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double(x[size_t(32 * b + j)])));
      // (float log2f as the quantizer computes it: near a power of two it may round up where the
      // double log2 would not)
      const float famax = float(amax);
      ASSERT_EQ(int(blk[0]), std::max(0, int(std::floor(log2f(famax)) - 2 + 127))) << scale << " " << b;
      const double d = std::ldexp(1.0, int(blk[0]) - 128);
      for (int j = 0; j < 32; ++j) {
        const double v = x[size_t(32 * b + j)];
        const int i = (blk[1 + j % 16] >> (j < 16 ? 0 : 4)) & 15;
        const double err = std::fabs(kMX[i] * d - v);
        for (int k = 0; k < 16; ++k) ASSERT_LE(err, std::fabs(kMX[k] * d - v)) << scale << " " << b << " " << j;
      }
    }
  }
}

TEST(Quant, UnsupportedTypeThrows) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buf(4096);
  for (GGMLType t : {GGMLType::Q8_K, GGMLType::I8, GGMLType::F64, GGMLType::I32}) {
    const std::string name(type_traits(t).name);
    try {
      dequantize_row(t, buf.data(), x.data(), 256);
      ADD_FAILURE() << "dequantize " << name << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    EXPECT_THROW(quantize_row(t, x.data(), buf.data(), 256), Error) << name;
  }
  EXPECT_THROW(dequantize_row(GGMLType(99), buf.data(), x.data(), 256), Error);
}

TEST(Quant, PartialBlockThrows) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> buf(4096);
  EXPECT_THROW(quantize_row(GGMLType::Q4_K, x.data(), buf.data(), 128), Error);
  EXPECT_THROW(dequantize_row(GGMLType::Q8_0, buf.data(), x.data(), 33), Error);
}

}  // namespace
}  // namespace ft
