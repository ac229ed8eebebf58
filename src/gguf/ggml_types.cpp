#include "gguf/ggml_types.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace ft {

namespace {
struct Entry {
  uint32_t id;
  TypeTraits traits;
};
// From ggml's type table (block size, bytes per block).
constexpr std::array<Entry, 34> kTypes = {{
    {0, {"f32", 1, 4, true}},        {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 18, true}},     {3, {"q4_1", 32, 20, true}},
    {6, {"q5_0", 32, 22, true}},     {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},     {9, {"q8_1", 32, 36, true}},
    {10, {"q2_k", 256, 84, true}},   {11, {"q3_k", 256, 110, true}},
    {12, {"q4_k", 256, 144, true}},  {13, {"q5_k", 256, 176, true}},
    {14, {"q6_k", 256, 210, true}},  {15, {"q8_k", 256, 292, true}},
    {16, {"iq2_xxs", 256, 66, true}}, {17, {"iq2_xs", 256, 74, true}},
    {18, {"iq3_xxs", 256, 98, true}}, {19, {"iq1_s", 256, 50, true}},
    {20, {"iq4_nl", 32, 18, true}},  {21, {"iq3_s", 256, 110, true}},
    {22, {"iq2_s", 256, 82, true}},  {23, {"iq4_xs", 256, 136, true}},
    {24, {"i8", 1, 1, true}},        {25, {"i16", 1, 2, true}},
    {26, {"i32", 1, 4, true}},       {27, {"i64", 1, 8, true}},
    {28, {"f64", 1, 8, true}},       {29, {"iq1_m", 256, 56, true}},
    {30, {"bf16", 1, 2, true}},      {34, {"tq1_0", 256, 54, true}},
    {35, {"tq2_0", 256, 66, true}},  {39, {"mxfp4", 32, 17, true}},
    {4, {"q4_2(removed)", 0, 0, false}}, {5, {"q4_3(removed)", 0, 0, false}},
}};
}  // namespace

TypeTraits type_traits(uint32_t type_id) {
  for (const auto& e : kTypes)
    if (e.id == type_id) return e.traits;
  return {"unknown", 0, 0, false};
}

namespace {
constexpr GGMLType kSupported[] = {
    GGMLType::F32,  GGMLType::F16,  GGMLType::BF16, GGMLType::Q8_0, GGMLType::Q4_0,
    GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q2_K, GGMLType::Q3_K,
    GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::IQ4_NL, GGMLType::IQ4_XS,
    GGMLType::MXFP4, GGMLType::IQ2_XXS, GGMLType::IQ2_XS, GGMLType::IQ2_S, GGMLType::IQ3_XXS,
    GGMLType::IQ3_S, GGMLType::IQ1_S, GGMLType::IQ1_M, GGMLType::TQ1_0, GGMLType::TQ2_0,
};
}  // namespace

bool is_supported_weight_type(GGMLType t) {
  return std::find(std::begin(kSupported), std::end(kSupported), t) != std::end(kSupported);
}

std::string supported_weight_type_names() {
  std::string out;
  for (GGMLType t : kSupported) out += std::string(out.empty() ? "" : ", ") + std::string(type_traits(t).name);
  return out;
}

std::optional<GGMLType> parse_type_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  for (const auto& e : kTypes)
    if (e.traits.known && e.traits.name == lower) return GGMLType(e.id);
  return std::nullopt;
}

std::optional<uint64_t> row_bytes(GGMLType t, uint64_t n) {
  const TypeTraits tr = type_traits(t);
  if (!tr.known || tr.block_size == 0 || n % tr.block_size != 0) return std::nullopt;
  return n / tr.block_size * tr.type_size;
}

}  // namespace ft
