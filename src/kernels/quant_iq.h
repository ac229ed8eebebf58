// ggml's i-quants on grids: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (layouts in
// quant_blocks.h, codebooks in iq_grids.h), 256 elements a block. Dequantization performs ggml's
// float operations in its order (bit-identical); the quantizer is our own (quant_iq.cpp), not
// llama-quantize's: these files decode the same in llama.cpp, their bytes differ.
#pragma once
#include <cstdint>

#include "gguf/ggml_types.h"

namespace ft::iq {

bool is_grid_type(GGMLType t);
// nb blocks of type t (256 elements each) -> y (256 * nb).
void dequantize(GGMLType t, const uint8_t* src, float* y, int64_t nb);
// x (256 * nb) -> nb blocks of type t.
void quantize(GGMLType t, const float* x, uint8_t* dst, int64_t nb);

// The grid types with one scale per 32-block (IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S): each value is d
// (2s + 1) unit v exactly (11 + 5 + 7 significant bits at most), v an integer level: grid x sign
// (IQ1_S: 8 (grid +- 1/8)), among level_values (16 int8, padded with zeros), which the CPU
// kernels index by a nibble (packed.h, the levels layout; IQ2_XXS and IQ1_S, with 6 levels, by
// 3 bits: the levels3 layout).
bool has_level_form(GGMLType t);
// 2s + 1 of 32-block ib (< 8) of block blk (a type with has_level_form).
int step32(GGMLType t, const uint8_t* blk, int ib);
// The grid types with one scale per 16 elements (IQ2_XS, IQ2_S, IQ1_M): each value is d (2s + 1)
// unit v exactly, s that of its 16, v among level_values (IQ2_XS and IQ2_S: IQ2_XXS's levels;
// IQ1_M: IQ1_S's), unit 1/8 (the CPU kernels' levels layout with a scale per 16, packed.h).
bool has_level16_form(GGMLType t);
// 2s + 1 of 16-element block i16 (< 16) of block blk (a type with has_level16_form).
int step16(GGMLType t, const uint8_t* blk, int i16);
// Block blk (of a type with has_level_form or has_level16_form) with d = 1: into one (its size).
void with_unit_d(GGMLType t, const uint8_t* blk, uint8_t* one);
inline constexpr int8_t kLevelsIQ2XXS[16] = {-43, -25, -8, 8, 25, 43};  // (grid bytes 8, 25, 43)
inline constexpr int8_t kLevelsIQ3XXS[16] = {-62, -52, -44, -36, -28, -20, -12, -4,
                                             4,   12,  20,  28,  36,  44,  52,  62};
inline constexpr int8_t kLevelsIQ3S[16] = {-15, -13, -11, -9, -7, -5, -3, -1, 1, 3, 5, 7, 9, 11, 13, 15};
inline constexpr int8_t kLevelsIQ1S[16] = {-9, -7, -1, 1, 7, 9};  // (8 (grid +- 1/8), grid in -1, 0, 1)
// The levels v and unit of a type with has_level_form or has_level16_form (value = d (2s + 1)
// unit v).
constexpr const int8_t* level_values(GGMLType t) {
  return t == GGMLType::IQ2_XXS || t == GGMLType::IQ2_XS || t == GGMLType::IQ2_S ? kLevelsIQ2XXS
         : t == GGMLType::IQ3_XXS                                                ? kLevelsIQ3XXS
         : t == GGMLType::IQ3_S                                                  ? kLevelsIQ3S
                                                                                 : kLevelsIQ1S;
}
// (IQ2_XXS, IQ2_XS, IQ2_S: (0.5 + s) / 4; IQ3_XXS: (0.5 + s) / 2; IQ1_S, IQ1_M: 8 (grid +- 1/8).)
constexpr float level_unit(GGMLType t) {
  return t == GGMLType::IQ3_XXS ? 0.25f : t == GGMLType::IQ3_S ? 1.0f : 0.125f;
}

}  // namespace ft::iq
