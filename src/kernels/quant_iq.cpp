// The i-quants on grids (quant_iq.h): ggml's dequantizers' arithmetic, and a quantizer of our own.
//
// Dequantization: every product is exact in float (f16 d: 11 significant bits, times a 5-bit
// scale factor and a grid value of at most 6 bits), as in ggml's dequantize_row_iq*, so the
// results are ggml's bit for bit (Quant.IQTypesDecodeAsTheReferenceLibrary checks them against
// ggml's own functions where the reference build is at hand).
//
// Quantization (make-model and tests, not llama-quantize's search with an importance matrix):
// signs first (for the types with 7 stored sign bits an odd count of minus signs flips the
// smallest |x|, as ggml does); then per scale unit (32 or 16 elements) each group takes the
// grid entry nearest its elements rounded to the grid's levels (a table over every tuple of
// levels: Codebook::nearest), at 9 trial scales around amax / top level, each refitted by least
// squares; the block's d is the largest unit scale over the top scale step, and each unit then
// takes the scale step (and IQ1's delta signs) of least squared error. Quant.IQTypesRoundTrip
// bounds its error per type.
#include "kernels/quant_iq.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/iq_grids.h"
#include "kernels/quant_blocks.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace ft::iq {
namespace {

using blocks::load_f16;

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
// Byte j of grid entry e (a magnitude; IQ1's grid: an int8 value).
template <class T>
uint8_t gb(const T* grid, int e, int j) {
  return uint8_t(grid[e] >> (8 * j));
}
float sign_of(uint8_t signs, int j) { return signs & (1u << j) ? -1.f : 1.f; }
// IQ2's scale of step s under d, as ggml computes it (exact: 11 + 5 significant bits).
float iq2_step(float d, unsigned s) { return d * (0.5f + float(s)) * 0.25f; }

// ---------------------------------------------------------------------------------------------
// Dequantization (ggml's dequantize_row_iq*: the same operations in the same order)

void dequant_iq2_xxs(const blocks::IQ2_XXS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q = b[i].qs + 8 * ib;
      const uint32_t aux = u32_at(q + 4);
      const float db = iq2_step(d, aux >> 28);
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = blocks::iq_signs7((aux >> (7 * l)) & 127);
        for (int j = 0; j < 8; ++j) y[j] = db * float(gb(blocks::kIQ2XXSGrid, q[l], j)) * sign_of(signs, j);
      }
    }
  }
}

void dequant_iq2_xs(const blocks::IQ2_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {iq2_step(d, b[i].scales[ib] & 0xf), iq2_step(d, b[i].scales[ib] >> 4)};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t q = u16_at(b[i].qs + 2 * (4 * ib + l));
        const uint8_t signs = blocks::iq_signs7(q >> 9);
        for (int j = 0; j < 8; ++j) y[j] = db[l / 2] * float(gb(blocks::kIQ2XSGrid, q & 511, j)) * sign_of(signs, j);
      }
    }
  }
}

void dequant_iq2_s(const blocks::IQ2_S* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {iq2_step(d, b[i].scales[ib] & 0xf), iq2_step(d, b[i].scales[ib] >> 4)};
      for (int l = 0; l < 4; ++l, y += 8) {
        const int e = b[i].qs[4 * ib + l] | ((b[i].qh[ib] << (8 - 2 * l)) & 0x300);
        for (int j = 0; j < 8; ++j)
          y[j] = db[l / 2] * float(gb(blocks::kIQ2SGrid, e, j)) * sign_of(b[i].signs[4 * ib + l], j);
      }
    }
  }
}

void dequant_iq3_xxs(const blocks::IQ3_XXS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t aux = u32_at(b[i].scales_signs + 4 * ib);
      const float db = d * (0.5f + float(aux >> 28)) * 0.5f;
      const uint8_t* q = b[i].qs + 8 * ib;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = blocks::iq_signs7((aux >> (7 * l)) & 127);
        for (int j = 0; j < 4; ++j) {
          y[j + 0] = db * float(gb(blocks::kIQ3XXSGrid, q[2 * l + 0], j)) * sign_of(signs, j + 0);
          y[j + 4] = db * float(gb(blocks::kIQ3XXSGrid, q[2 * l + 1], j)) * sign_of(signs, j + 4);
        }
      }
    }
  }
}

void dequant_iq3_s(const blocks::IQ3_S* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db = d * float(1 + 2 * ((b[i].scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
      const uint8_t* q = b[i].qs + 8 * ib;
      const int qh = b[i].qh[ib];
      for (int l = 0; l < 4; ++l, y += 8) {
        const int e1 = q[2 * l + 0] | ((qh << (8 - 2 * l)) & 256);
        const int e2 = q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
        const uint8_t signs = b[i].signs[4 * ib + l];
        for (int j = 0; j < 4; ++j) {
          y[j + 0] = db * float(gb(blocks::kIQ3SGrid, e1, j)) * sign_of(signs, j + 0);
          y[j + 4] = db * float(gb(blocks::kIQ3SGrid, e2, j)) * sign_of(signs, j + 4);
        }
      }
    }
  }
}

void dequant_iq1_s(const blocks::IQ1_S* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = load_f16(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = u16_at(b[i].qh + 2 * ib);
      const float dl = d * float(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -blocks::kIQ1Delta : blocks::kIQ1Delta;
      for (int l = 0; l < 4; ++l, y += 8) {
        const int e = b[i].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
        for (int j = 0; j < 8; ++j) y[j] = dl * (float(int8_t(gb(blocks::kIQ1SGrid, e, j))) + delta);
      }
    }
  }
}

void dequant_iq1_m(const blocks::IQ1_M* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    uint16_t sc[4];
    std::memcpy(sc, b[i].scales, 8);
    const float d = f16_to_f32(blocks::iq1m_d_bits(b[i]));
    for (int ib = 0; ib < 8; ++ib) {
      const float dl[2] = {d * float(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1),
                           d * float(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1)};
      const uint8_t* qs = b[i].qs + 4 * ib;
      const uint8_t* qh = b[i].qh + 2 * ib;
      for (int l = 0; l < 4; ++l, y += 8) {
        const int nib = (qh[l / 2] >> (4 * (l % 2))) & 0xf;
        const int e = qs[l] | ((nib & 7) << 8);
        const float delta = nib & 8 ? -blocks::kIQ1Delta : blocks::kIQ1Delta;
        for (int j = 0; j < 8; ++j) y[j] = dl[l / 2] * (float(int8_t(gb(blocks::kIQ1SGrid, e, j))) + delta);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Quantization

// A grid's entries as small integers (magnitudes; IQ1's: -1, 0, 1), its distinct levels, and
// for every tuple of levels (a base-L number over the dim elements of a group, element 0 the
// lowest digit) the entry nearest it in squared distance, the lowest index on ties. The entries
// are themselves tuples of levels and the distance is a sum over elements, so a min-plus pass
// per element over the tuples (from the entries, at distance 0) finds every nearest entry in
// dim * L^(dim+1) steps instead of L^dim * entries * dim.
struct Codebook {
  int dim = 0, n = 0;
  std::vector<int8_t> val;  // (n, dim)
  std::vector<float> levels;
  std::vector<uint16_t> nearest;
};

template <class T, size_t N>
Codebook make_codebook(const T (&grid)[N], int dim) {
  Codebook c;
  c.dim = dim;
  c.n = int(N);
  c.val.resize(N * size_t(dim));
  std::vector<int> lv;
  for (int e = 0; e < c.n; ++e)
    for (int j = 0; j < dim; ++j) {
      const int8_t v = int8_t(gb(grid, e, j));
      c.val[size_t(e * dim + j)] = v;
      if (std::find(lv.begin(), lv.end(), int(v)) == lv.end()) lv.push_back(v);
    }
  std::sort(lv.begin(), lv.end());
  for (int v : lv) c.levels.push_back(float(v));
  const int L = int(lv.size());
  int codes = 1;
  for (int j = 0; j < dim; ++j) codes *= L;
  constexpr int kFar = 1 << 30;
  std::vector<int> dist(size_t(codes), kFar), nd;
  std::vector<uint16_t> arg(size_t(codes), 0), na;
  for (int e = c.n - 1; e >= 0; --e) {  // (downwards: a repeated tuple keeps its lowest entry)
    int code = 0;
    for (int j = dim - 1; j >= 0; --j)
      code = code * L + int(std::find(lv.begin(), lv.end(), int(c.val[size_t(e * dim + j)])) - lv.begin());
    dist[size_t(code)] = 0;
    arg[size_t(code)] = uint16_t(e);
  }
  for (int j = 0, stride = 1; j < dim; ++j, stride *= L) {
    nd = dist;
    na = arg;
    for (int code = 0; code < codes; ++code) {
      const int tj = (code / stride) % L, base = code - tj * stride;
      for (int a = 0; a < L; ++a) {
        const size_t from = size_t(base + a * stride);
        if (dist[from] == kFar) continue;
        const int d = dist[from] + (lv[size_t(tj)] - lv[size_t(a)]) * (lv[size_t(tj)] - lv[size_t(a)]);
        if (d < nd[size_t(code)] || (d == nd[size_t(code)] && arg[from] < na[size_t(code)])) {
          nd[size_t(code)] = d;
          na[size_t(code)] = arg[from];
        }
      }
    }
    dist.swap(nd);
    arg.swap(na);
  }
  c.nearest = std::move(arg);
  return c;
}

// How a type's values are made (quant_blocks.h).
struct Spec {
  int dim;        // elements per grid entry
  int unit;       // elements per scale
  int n_steps;    // scale steps s (4 or 3 bits)
  int sign_bits;  // stored sign bits per 8 elements: 7 (the 8th their parity), 8, or 0 (IQ1's signed grid)
  int delta;      // IQ1's +-1/8: one sign per 32 elements (IQ1_S), per 8 (IQ1_M), or none (0)
  float (*mult)(int s);  // scale of step s, in units of d
};

Spec spec(GGMLType t) {
  auto iq2 = +[](int s) { return (0.5f + float(s)) * 0.25f; };
  auto iq1 = +[](int s) { return float(2 * s + 1); };
  switch (t) {
    case GGMLType::IQ2_XXS: return {8, 32, 16, 7, 0, iq2};
    case GGMLType::IQ2_XS: return {8, 16, 16, 7, 0, iq2};
    case GGMLType::IQ2_S: return {8, 16, 16, 8, 0, iq2};
    case GGMLType::IQ3_XXS: return {4, 32, 16, 7, 0, +[](int s) { return (0.5f + float(s)) * 0.5f; }};
    case GGMLType::IQ3_S: return {4, 32, 16, 8, 0, iq1};
    case GGMLType::IQ1_S: return {8, 32, 8, 0, 32, iq1};
    case GGMLType::IQ1_M: return {8, 16, 8, 0, 8, iq1};
    default: fail("i-quant: not a grid type: ", type_traits(t).name);
  }
}

const Codebook& codebook(GGMLType t) {
  switch (t) {
    case GGMLType::IQ2_XXS: { static const Codebook c = make_codebook(blocks::kIQ2XXSGrid, 8); return c; }
    case GGMLType::IQ2_XS: { static const Codebook c = make_codebook(blocks::kIQ2XSGrid, 8); return c; }
    case GGMLType::IQ2_S: { static const Codebook c = make_codebook(blocks::kIQ2SGrid, 8); return c; }
    case GGMLType::IQ3_XXS: { static const Codebook c = make_codebook(blocks::kIQ3XXSGrid, 4); return c; }
    case GGMLType::IQ3_S: { static const Codebook c = make_codebook(blocks::kIQ3SGrid, 4); return c; }
    case GGMLType::IQ1_S: case GGMLType::IQ1_M: { static const Codebook c = make_codebook(blocks::kIQ1SGrid, 8); return c; }
    default: fail("i-quant: not a grid type: ", type_traits(t).name);
  }
}

// The index of the level nearest v (the lower on ties).
int nearest_level(const std::vector<float>& levels, float v) {
  int best = 0;
  for (int k = 1; k < int(levels.size()); ++k)
    if (std::fabs(levels[size_t(k)] - v) < std::fabs(levels[size_t(best)] - v)) best = k;
  return best;
}

// One 256-block's choices: d (f16 bits), a scale step per unit, an entry per group, 8 sign bits
// per 8 elements (magnitude grids) and a delta sign per 8 elements (IQ1).
struct Choice {
  uint16_t d = 0;
  std::array<uint8_t, 16> step{};
  std::array<uint16_t, 64> entry{};
  std::array<uint8_t, 32> signs{};
  std::array<uint8_t, 32> delta_neg{};
};

class BlockQuantizer {
 public:
  BlockQuantizer(GGMLType t) : sp_(spec(t)), cb_(codebook(t)) {}

  Choice run(const float* x) {
    Choice c;
    // Signs: u = x with its stored sign taken off (>= 0 but where parity flipped a sign).
    for (int g = 0; g < 32; ++g) {
      const float* xg = x + 8 * g;
      uint8_t bits = 0;
      if (sp_.sign_bits > 0) {
        for (int j = 0; j < 8; ++j) bits |= uint8_t((xg[j] < 0) << j);
        if (sp_.sign_bits == 7 && std::popcount(unsigned(bits)) % 2 == 1) {
          int jmin = 0;
          for (int j = 1; j < 8; ++j)
            if (std::fabs(xg[j]) < std::fabs(xg[jmin])) jmin = j;
          bits ^= uint8_t(1u << jmin);
        }
      }
      c.signs[size_t(g)] = bits;
      for (int j = 0; j < 8; ++j) u_[size_t(8 * g + j)] = bits & (1u << j) ? -xg[j] : xg[j];
    }
    // Each unit's own best scale.
    const int n_units = 256 / sp_.unit;
    const float top = std::max(std::fabs(cb_.levels.front()), std::fabs(cb_.levels.back())) +
                      (sp_.delta ? blocks::kIQ1Delta : 0.0f);
    float cmax = 0;
    for (int k = 0; k < n_units; ++k) {
      const float* uk = u_.data() + k * sp_.unit;
      float amax = 0, uu = 0;
      for (int i = 0; i < sp_.unit; ++i) {
        if (!std::isfinite(uk[i])) fail("i-quant: a block holds a value that is not finite");
        amax = std::max(amax, std::fabs(uk[i]));
        uu += uk[i] * uk[i];
      }
      float best_err = INFINITY, best_c = 0;
      for (int f = 0; amax > 0 && f < 9; ++f) {
        const float c0 = amax / top * (0.6f + 0.1f * float(f));
        const Fit fit = fit_unit(k, c0, scratch_);
        if (fit.sqq <= 0 || fit.sxq <= 0) continue;
        const float cls = float(fit.sxq / fit.sqq);
        const float err = float(double(uu) - fit.sxq * fit.sxq / fit.sqq);
        if (err < best_err) {
          best_err = err;
          best_c = cls;
        }
      }
      cmax = std::max(cmax, best_c);
    }
    c.d = f32_to_f16(std::min(cmax / sp_.mult(sp_.n_steps - 1), 65504.0f));  // (beyond f16: its largest)
    const float d = f16_to_f32(c.d);
    if (!(d > 0)) {  // an all-zero block (or one below f16): d = 0
      c.d = 0;
      return c;
    }
    // Each unit's scale step.
    for (int k = 0; k < n_units; ++k) {
      double best_err = INFINITY;
      for (int s = 0; s < sp_.n_steps; ++s) {
        const float cs = d * sp_.mult(s);
        const Fit fit = fit_unit(k, cs, scratch_);
        const double err = -2.0 * double(cs) * fit.sxq + double(cs) * double(cs) * fit.sqq;
        if (err < best_err) {
          best_err = err;
          c.step[size_t(k)] = uint8_t(s);
          const int g0 = k * sp_.unit / sp_.dim, n = sp_.unit / sp_.dim;
          for (int g = 0; g < n; ++g) c.entry[size_t(g0 + g)] = scratch_.entry[size_t(g)];
          for (int g = 0; g < sp_.unit / 8; ++g)
            c.delta_neg[size_t(k * sp_.unit / 8 + g)] = scratch_.delta_neg[size_t(g)];
        }
      }
    }
    return c;
  }

 private:
  struct Fit {
    double sxq = 0, sqq = 0;
  };
  struct Scratch {
    std::array<uint16_t, 8> entry{};     // per group of the unit
    std::array<uint8_t, 4> delta_neg{};  // per 8 elements of the unit
  };

  // The entries (and deltas) of unit k at scale c, and sum u q, sum q^2 over its elements.
  Fit fit_unit(int k, float c, Scratch& out) const {
    const float* uk = u_.data() + k * sp_.unit;
    if (!sp_.delta) {
      Fit f;
      for (int g = 0; g < sp_.unit / sp_.dim; ++g) {
        const int e = nearest_entry(uk + g * sp_.dim, c, 0.0f);
        out.entry[size_t(g)] = uint16_t(e);
        accumulate(f, uk + g * sp_.dim, e, 0.0f);
      }
      return f;
    }
    // IQ1: groups of 8 at delta +1/8 or -1/8, one sign per unit (IQ1_S) or per group (IQ1_M).
    Fit best;
    double best_err = INFINITY;
    const int n_choices = sp_.delta == 8 ? 1 : 2;
    for (int choice = 0; choice < n_choices; ++choice) {
      Fit f;
      Scratch s;
      for (int g = 0; g < sp_.unit / 8; ++g) {
        const float* ug = uk + 8 * g;
        double gerr = INFINITY;
        for (int neg = 0; neg < 2; ++neg) {
          if (sp_.delta == 32 && neg != choice) continue;
          const float delta = neg ? -blocks::kIQ1Delta : blocks::kIQ1Delta;
          const int e = nearest_entry(ug, c, delta);
          Fit fg;
          accumulate(fg, ug, e, delta);
          const double err = -2.0 * double(c) * fg.sxq + double(c) * double(c) * fg.sqq;
          if (err < gerr) {
            gerr = err;
            s.entry[size_t(g)] = uint16_t(e);
            s.delta_neg[size_t(g)] = uint8_t(neg);
          }
        }
        Fit fg;
        accumulate(fg, ug, s.entry[size_t(g)], s.delta_neg[size_t(g)] ? -blocks::kIQ1Delta : blocks::kIQ1Delta);
        f.sxq += fg.sxq;
        f.sqq += fg.sqq;
      }
      const double err = -2.0 * double(c) * f.sxq + double(c) * double(c) * f.sqq;
      if (err < best_err) {
        best_err = err;
        best = f;
        out = s;
      }
    }
    return best;
  }

  int nearest_entry(const float* ug, float c, float delta) const {
    const int L = int(cb_.levels.size());
    int code = 0;
    for (int j = cb_.dim - 1; j >= 0; --j) code = code * L + nearest_level(cb_.levels, ug[j] / c - delta);
    return cb_.nearest[size_t(code)];
  }

  void accumulate(Fit& f, const float* ug, int e, float delta) const {
    for (int j = 0; j < cb_.dim; ++j) {
      const double q = double(cb_.val[size_t(e * cb_.dim + j)]) + double(delta);
      f.sxq += double(ug[j]) * q;
      f.sqq += q * q;
    }
  }

  Spec sp_;
  const Codebook& cb_;
  std::array<float, 256> u_{};
  Scratch scratch_;
};

void encode(GGMLType t, const Choice& c, uint8_t* out) {
  switch (t) {
    case GGMLType::IQ2_XXS: {
      auto& b = *reinterpret_cast<blocks::IQ2_XXS*>(out);
      put_u16(b.d, c.d);
      for (int ib = 0; ib < 8; ++ib) {
        uint32_t aux = uint32_t(c.step[size_t(ib)]) << 28;
        for (int l = 0; l < 4; ++l) {
          b.qs[8 * ib + l] = uint8_t(c.entry[size_t(4 * ib + l)]);
          aux |= uint32_t(c.signs[size_t(4 * ib + l)] & 127) << (7 * l);
        }
        put_u32(b.qs + 8 * ib + 4, aux);
      }
      break;
    }
    case GGMLType::IQ2_XS: {
      auto& b = *reinterpret_cast<blocks::IQ2_XS*>(out);
      put_u16(b.d, c.d);
      for (int g = 0; g < 32; ++g) put_u16(b.qs + 2 * g, uint16_t(c.entry[size_t(g)] | ((c.signs[size_t(g)] & 127) << 9)));
      for (int ib = 0; ib < 8; ++ib) b.scales[ib] = uint8_t(c.step[size_t(2 * ib)] | (c.step[size_t(2 * ib + 1)] << 4));
      break;
    }
    case GGMLType::IQ2_S: {
      auto& b = *reinterpret_cast<blocks::IQ2_S*>(out);
      put_u16(b.d, c.d);
      std::memset(b.qh, 0, sizeof b.qh);
      for (int g = 0; g < 32; ++g) {
        b.qs[g] = uint8_t(c.entry[size_t(g)]);
        b.qh[g / 4] |= uint8_t((c.entry[size_t(g)] >> 8) << (2 * (g % 4)));
        b.signs[g] = c.signs[size_t(g)];
      }
      for (int ib = 0; ib < 8; ++ib) b.scales[ib] = uint8_t(c.step[size_t(2 * ib)] | (c.step[size_t(2 * ib + 1)] << 4));
      break;
    }
    case GGMLType::IQ3_XXS: {
      auto& b = *reinterpret_cast<blocks::IQ3_XXS*>(out);
      put_u16(b.d, c.d);
      for (int k = 0; k < 64; ++k) b.qs[k] = uint8_t(c.entry[size_t(k)]);
      for (int ib = 0; ib < 8; ++ib) {
        uint32_t aux = uint32_t(c.step[size_t(ib)]) << 28;
        for (int l = 0; l < 4; ++l) aux |= uint32_t(c.signs[size_t(4 * ib + l)] & 127) << (7 * l);
        put_u32(b.scales_signs + 4 * ib, aux);
      }
      break;
    }
    case GGMLType::IQ3_S: {
      auto& b = *reinterpret_cast<blocks::IQ3_S*>(out);
      put_u16(b.d, c.d);
      std::memset(b.qh, 0, sizeof b.qh);
      std::memset(b.scales, 0, sizeof b.scales);
      for (int k = 0; k < 64; ++k) {
        b.qs[k] = uint8_t(c.entry[size_t(k)]);
        b.qh[k / 8] |= uint8_t(((c.entry[size_t(k)] >> 8) & 1) << (k % 8));
      }
      for (int g = 0; g < 32; ++g) b.signs[g] = c.signs[size_t(g)];
      for (int ib = 0; ib < 8; ++ib) b.scales[ib / 2] |= uint8_t(c.step[size_t(ib)] << (4 * (ib % 2)));
      break;
    }
    case GGMLType::IQ1_S: {
      auto& b = *reinterpret_cast<blocks::IQ1_S*>(out);
      put_u16(b.d, c.d);
      for (int ib = 0; ib < 8; ++ib) {
        uint16_t qh = uint16_t((c.step[size_t(ib)] << 12) | (c.delta_neg[size_t(4 * ib)] << 15));
        for (int l = 0; l < 4; ++l) {
          const uint16_t e = c.entry[size_t(4 * ib + l)];
          b.qs[4 * ib + l] = uint8_t(e);
          qh = uint16_t(qh | (((e >> 8) & 7) << (3 * l)));
        }
        put_u16(b.qh + 2 * ib, qh);
      }
      break;
    }
    case GGMLType::IQ1_M: {
      auto& b = *reinterpret_cast<blocks::IQ1_M*>(out);
      std::memset(b.qh, 0, sizeof b.qh);
      uint16_t sc[4] = {0, 0, 0, 0};
      for (int g = 0; g < 32; ++g) {
        const uint16_t e = c.entry[size_t(g)];
        b.qs[g] = uint8_t(e);
        const int nib = ((e >> 8) & 7) | (c.delta_neg[size_t(g)] << 3);
        b.qh[g / 2] |= uint8_t(nib << (4 * (g % 2)));
      }
      for (int k = 0; k < 16; ++k) sc[k / 4] = uint16_t(sc[k / 4] | (c.step[size_t(k)] << (3 * (k % 4))));
      for (int i = 0; i < 4; ++i) sc[i] = uint16_t(sc[i] | (((c.d >> (4 * i)) & 0xf) << 12));
      std::memcpy(b.scales, sc, 8);
      break;
    }
    default: fail("i-quant: not a grid type: ", type_traits(t).name);
  }
}

}  // namespace

bool has_level_form(GGMLType t) {
  return t == GGMLType::IQ2_XXS || t == GGMLType::IQ3_XXS || t == GGMLType::IQ3_S || t == GGMLType::IQ1_S;
}

int step32(GGMLType t, const uint8_t* blk, int ib) {
  switch (t) {
    case GGMLType::IQ2_XXS: return 2 * int(u32_at(reinterpret_cast<const blocks::IQ2_XXS*>(blk)->qs + 8 * ib + 4) >> 28) + 1;
    case GGMLType::IQ3_XXS:
      return 2 * int(u32_at(reinterpret_cast<const blocks::IQ3_XXS*>(blk)->scales_signs + 4 * ib) >> 28) + 1;
    case GGMLType::IQ3_S: return 2 * ((reinterpret_cast<const blocks::IQ3_S*>(blk)->scales[ib / 2] >> (4 * (ib % 2))) & 0xf) + 1;
    case GGMLType::IQ1_S: return 2 * ((u16_at(reinterpret_cast<const blocks::IQ1_S*>(blk)->qh + 2 * ib) >> 12) & 7) + 1;
    default: fail("i-quant: ", type_traits(t).name, " has no single scale per 32-block");
  }
}

bool has_level16_form(GGMLType t) {
  return t == GGMLType::IQ2_XS || t == GGMLType::IQ2_S || t == GGMLType::IQ1_M;
}

int step16(GGMLType t, const uint8_t* blk, int i16) {
  switch (t) {
    case GGMLType::IQ2_XS: case GGMLType::IQ2_S: {
      const uint8_t s = t == GGMLType::IQ2_XS ? reinterpret_cast<const blocks::IQ2_XS*>(blk)->scales[i16 / 2]
                                              : reinterpret_cast<const blocks::IQ2_S*>(blk)->scales[i16 / 2];
      return 2 * ((s >> (4 * (i16 % 2))) & 0xf) + 1;
    }
    case GGMLType::IQ1_M: {  // (u16 i16 / 4, bits 3 (i16 % 4): dequant_iq1_m's order)
      const int ib = i16 / 2;
      return 2 * ((u16_at(reinterpret_cast<const blocks::IQ1_M*>(blk)->scales + 2 * (ib / 2)) >> (6 * (ib % 2) + 3 * (i16 % 2))) & 7) + 1;
    }
    default: fail("i-quant: ", type_traits(t).name, " has no scale per 16 elements");
  }
}

void with_unit_d(GGMLType t, const uint8_t* blk, uint8_t* one) {
  if (!has_level_form(t) && !has_level16_form(t)) fail("i-quant: with_unit_d of ", type_traits(t).name);
  std::memcpy(one, blk, type_traits(t).type_size);
  constexpr uint16_t kOne = 0x3C00;  // f16 1.0
  if (t != GGMLType::IQ1_M) {
    std::memcpy(one, &kOne, 2);  // (d at byte 0)
    return;
  }
  auto& b = *reinterpret_cast<blocks::IQ1_M*>(one);  // (d's bits 4i .. 4i + 3 at bits 12-15 of u16 i)
  for (int i = 0; i < 4; ++i) {
    uint16_t u = u16_at(b.scales + 2 * i);
    u = uint16_t((u & 0x0fff) | ((kOne >> (4 * i)) & 0xf) << 12);
    std::memcpy(b.scales + 2 * i, &u, 2);
  }
}

bool is_grid_type(GGMLType t) {
  switch (t) {
    case GGMLType::IQ2_XXS: case GGMLType::IQ2_XS: case GGMLType::IQ2_S: case GGMLType::IQ3_XXS:
    case GGMLType::IQ3_S: case GGMLType::IQ1_S: case GGMLType::IQ1_M:
      return true;
    default:
      return false;
  }
}

void dequantize(GGMLType t, const uint8_t* src, float* y, int64_t nb) {
  switch (t) {
    case GGMLType::IQ2_XXS: dequant_iq2_xxs(reinterpret_cast<const blocks::IQ2_XXS*>(src), y, nb); break;
    case GGMLType::IQ2_XS: dequant_iq2_xs(reinterpret_cast<const blocks::IQ2_XS*>(src), y, nb); break;
    case GGMLType::IQ2_S: dequant_iq2_s(reinterpret_cast<const blocks::IQ2_S*>(src), y, nb); break;
    case GGMLType::IQ3_XXS: dequant_iq3_xxs(reinterpret_cast<const blocks::IQ3_XXS*>(src), y, nb); break;
    case GGMLType::IQ3_S: dequant_iq3_s(reinterpret_cast<const blocks::IQ3_S*>(src), y, nb); break;
    case GGMLType::IQ1_S: dequant_iq1_s(reinterpret_cast<const blocks::IQ1_S*>(src), y, nb); break;
    case GGMLType::IQ1_M: dequant_iq1_m(reinterpret_cast<const blocks::IQ1_M*>(src), y, nb); break;
    default: fail("i-quant: not a grid type: ", type_traits(t).name);
  }
}

void quantize(GGMLType t, const float* x, uint8_t* dst, int64_t nb) {
  BlockQuantizer q(t);
  const uint64_t bb = type_traits(t).type_size;
  for (int64_t i = 0; i < nb; ++i) encode(t, q.run(x + 256 * i), dst + uint64_t(i) * bb);
}

}  // namespace ft::iq
