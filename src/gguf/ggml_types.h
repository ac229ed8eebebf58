// ggml tensor element types as stored in GGUF, with their block geometry.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ft {

enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct TypeTraits {
  std::string_view name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
  bool known;           // a type id ggml defines (we may still not compute with it)
};

// Geometry of any type id ggml defines; known=false for ids it does not.
TypeTraits type_traits(uint32_t type_id);
inline TypeTraits type_traits(GGMLType t) { return type_traits(uint32_t(t)); }

// Types the engine can compute with (dequantize / matmul).
bool is_supported_weight_type(GGMLType t);
// Their names, comma-separated, for error messages ("f32, f16, ...").
std::string supported_weight_type_names();

// Parses "f32", "q4_k", "Q8_0", ... (case-insensitive).
std::optional<GGMLType> parse_type_name(std::string_view name);

// Bytes of a row of n elements; nullopt when n is not a multiple of the block size.
std::optional<uint64_t> row_bytes(GGMLType t, uint64_t n);

}  // namespace ft
