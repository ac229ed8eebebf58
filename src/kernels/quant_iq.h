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
// The scale under which 32-block ib (< 8) of block blk holds integers (value = scale * v exactly,
// |v| <= 127): d itself where the products fit (IQ3_S's steps up to 3, IQ1's d / 8 up to 6),
// else the block's own step; 0 where its halves have different steps that do not fit (IQ2_XS,
// IQ2_S, IQ1_M).
float block32_scale(GGMLType t, const uint8_t* blk, int ib);

}  // namespace ft::iq
