// GGUF reader/writer: round trips of every value type and several tensor types, and malformed
// files (truncated at every byte, bad headers, absurd counts and dims, bad offsets, bad types,
// duplicates, bad alignment, random corruption). Every bad file must throw ft::Error whose
// message names the file and what is wrong; nothing may crash or allocate absurdly (run under
// ASan/UBSan: FT_SANITIZE=ON).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "test_util.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using VT = GGUFValueType;

// ---------------------------------------------------------------------------------------------
// Helpers

using test::TempFile;

void write_bytes(const std::string& path, const uint8_t* p, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(p), std::streamsize(n));
  ASSERT_TRUE(f.good()) << path;
}

// Integer value of any integer type with both views (u, i) filled the way the reader fills them.
GGUFValue int_value(VT t, int64_t v) {
  GGUFValue x;
  x.type = t;
  x.i = v;
  x.u = uint64_t(v);
  return x;
}
GGUFValue f64_value(double v) {
  GGUFValue x;
  x.type = VT::FLOAT64;
  x.f = v;
  return x;
}

// Compares two values field by field for their type; returns "" or a description of the difference.
std::string diff(const GGUFValue& a, const GGUFValue& b, const std::string& where) {
  if (a.type != b.type)
    return cat(where, ": type ", value_type_name(a.type), " vs ", value_type_name(b.type));
  switch (a.type) {
    case VT::FLOAT32:
      if (float(a.f) != float(b.f)) return cat(where, ": ", a.f, " vs ", b.f);
      return "";
    case VT::FLOAT64:
      if (a.f != b.f) return cat(where, ": ", a.f, " vs ", b.f);
      return "";
    case VT::BOOL:
      return a.b == b.b ? "" : cat(where, ": bool differs");
    case VT::STRING:
      return a.str == b.str ? "" : cat(where, ": '", a.str, "' vs '", b.str, "'");
    case VT::ARRAY:
      if (a.elem_type != b.elem_type) return cat(where, ": element type differs");
      if (a.array.size() != b.array.size())
        return cat(where, ": ", a.array.size(), " vs ", b.array.size(), " elements");
      for (size_t k = 0; k < a.array.size(); ++k)
        if (auto d = diff(a.array[k], b.array[k], cat(where, "[", k, "]")); !d.empty()) return d;
      return "";
    default:  // integers: both views must agree
      if (a.u != b.u || a.i != b.i) return cat(where, ": ", a.i, "/", a.u, " vs ", b.i, "/", b.u);
      return "";
  }
}

// Deterministic, non-zero, varied floats.
std::vector<float> values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Quantizes x (rows of ne0) to type t.
std::vector<uint8_t> encode(GGMLType t, const std::vector<float>& x, uint64_t ne0) {
  const uint64_t rb = *row_bytes(t, ne0);
  const uint64_t rows = x.size() / ne0;
  std::vector<uint8_t> out(rb * rows);
  for (uint64_t r = 0; r < rows; ++r)
    quantize_row(t, x.data() + r * ne0, out.data() + r * rb, int64_t(ne0));
  return out;
}

struct TensorSpec {
  std::string name;
  GGMLType type;
  std::vector<uint64_t> ne;
};

// Tensors of several types and ranks; the last one ends exactly on a 64-byte boundary so the
// file has no trailing padding (then every proper prefix is truncated).
const std::vector<TensorSpec>& tensor_specs() {
  static const std::vector<TensorSpec> s = {
      {"tok.f32", GGMLType::F32, {8, 3}},
      {"blk.0.f16", GGMLType::F16, {16, 2, 2}},
      {"blk.0.bf16", GGMLType::BF16, {5}},
      {"blk.0.q8_0", GGMLType::Q8_0, {64, 3}},
      {"blk.0.q4_0", GGMLType::Q4_0, {32, 1, 2, 2}},
      {"blk.0.q6_k", GGMLType::Q6_K, {256, 1}},
      {"blk.0.q4_k", GGMLType::Q4_K, {256, 4}},  // 4 x 144 = 576 = 9 x 64 bytes
  };
  return s;
}

// Metadata of every value type, including empty and nested arrays.
std::vector<std::pair<std::string, GGUFValue>> all_metadata() {
  std::vector<std::pair<std::string, GGUFValue>> kv;
  kv.emplace_back("general.alignment", GGUFValue::of_u32(64));
  kv.emplace_back("t.u8", int_value(VT::UINT8, 200));
  kv.emplace_back("t.i8", int_value(VT::INT8, -100));
  kv.emplace_back("t.u16", int_value(VT::UINT16, 65535));
  kv.emplace_back("t.i16", int_value(VT::INT16, -30000));
  kv.emplace_back("t.u32", GGUFValue::of_u32(4000000000u));
  kv.emplace_back("t.i32", GGUFValue::of_i32(-2000000000));
  kv.emplace_back("t.u64", GGUFValue::of_u64(std::numeric_limits<uint64_t>::max()));
  kv.emplace_back("t.i64", int_value(VT::INT64, std::numeric_limits<int64_t>::min()));
  kv.emplace_back("t.f32", GGUFValue::of_f32(-1.5e-7f));
  kv.emplace_back("t.f64", f64_value(3.141592653589793));
  kv.emplace_back("t.bool_t", GGUFValue::of_bool(true));
  kv.emplace_back("t.bool_f", GGUFValue::of_bool(false));
  kv.emplace_back("t.str", GGUFValue::of_str("h\xC3\xA9llo w\xC3\xB6rld"));  // non-ASCII
  kv.emplace_back("t.str_nul", GGUFValue::of_str(std::string("a\0b", 3)));
  kv.emplace_back("t.str_empty", GGUFValue::of_str(""));
  kv.emplace_back("t.arr_str", GGUFValue::of_str_array({"<unk>", "", "\xE2\x96\x81the"}));
  kv.emplace_back("t.arr_f32", GGUFValue::of_f32_array({0.5f, -2.0f, 1e30f}));
  kv.emplace_back("t.arr_i32", GGUFValue::of_i32_array({1, -2, 2147483647}));
  kv.emplace_back("t.arr_u8", GGUFValue::of_array(VT::UINT8, {int_value(VT::UINT8, 7), int_value(VT::UINT8, 255)}));
  kv.emplace_back("t.arr_i64", GGUFValue::of_array(VT::INT64, {int_value(VT::INT64, -5)}));
  kv.emplace_back("t.arr_f64", GGUFValue::of_array(VT::FLOAT64, {f64_value(1e-300), f64_value(-2.5)}));
  kv.emplace_back("t.arr_bool", GGUFValue::of_array(VT::BOOL, {GGUFValue::of_bool(true), GGUFValue::of_bool(false)}));
  kv.emplace_back("t.arr_empty", GGUFValue::of_array(VT::UINT32, {}));
  // Nested: [[1, 2], [], [3]] and [["a"], ["b", "c"]].
  kv.emplace_back("t.nested_i32", GGUFValue::of_array(VT::ARRAY, {GGUFValue::of_i32_array({1, 2}),
                                                                  GGUFValue::of_i32_array({}),
                                                                  GGUFValue::of_i32_array({3})}));
  kv.emplace_back("t.nested_str", GGUFValue::of_array(VT::ARRAY, {GGUFValue::of_str_array({"a"}),
                                                                  GGUFValue::of_str_array({"b", "c"})}));
  // 8 levels: the deepest the reader accepts.
  GGUFValue deep = GGUFValue::of_array(VT::UINT8, {int_value(VT::UINT8, 42)});
  for (int d = 1; d < 8; ++d) deep = GGUFValue::of_array(VT::ARRAY, {deep});
  kv.emplace_back("t.nested8", deep);
  return kv;
}

struct Valid {
  std::vector<std::pair<std::string, GGUFValue>> kv;
  std::vector<std::vector<uint8_t>> data;  // per tensor_specs() entry
  GGUFWriter writer;
};

Valid make_valid() {
  Valid v;
  v.kv = all_metadata();
  for (const auto& [k, val] : v.kv) v.writer.set(k, val);
  uint32_t seed = 1;
  for (const auto& t : tensor_specs()) {
    uint64_t n = 1;
    for (uint64_t d : t.ne) n *= d;
    v.data.push_back(encode(t.type, values(n, seed++), t.ne[0]));
    v.writer.add_tensor(t.name, t.type, t.ne, v.data.back());
  }
  return v;
}

const std::vector<uint8_t>& valid_image() {
  static const std::vector<uint8_t> b = make_valid().writer.to_bytes();
  return b;
}

// Parses a copy of exactly these bytes (so ASan sees any read past the end).
std::unique_ptr<GGUFFile> parse_copy(const std::vector<uint8_t>& bytes, size_t n, const std::string& name,
                                     std::vector<uint8_t>& keep) {
  keep.assign(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
  return GGUFFile::parse(keep.data(), keep.size(), name);
}

// The ft::Error message of parsing `bytes`, or "" (with a test failure) when it parses.
std::string parse_error(const std::vector<uint8_t>& bytes, const std::string& name = "bad.gguf") {
  std::vector<uint8_t> keep = bytes;
  try {
    GGUFFile::parse(keep.data(), keep.size(), name);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed without error";
  return "";
}

#define EXPECT_HAS(msg, sub) EXPECT_NE((msg).find(sub), std::string::npos) << "message: " << (msg)

// Hand-assembled GGUF for malformed files: every field written explicitly.
class Raw {
 public:
  Raw& u8(uint8_t v) { return put(v); }
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& str(const std::string& s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    for (char c : {'G', 'G', 'U', 'F'}) b.push_back(uint8_t(c));
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(uint32_t(VT::UINT32)).u32(v); }
  // A tensor info: name, dims, type, offset.
  Raw& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset) {
    str(name).u32(uint32_t(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Raw& pad(uint64_t alignment) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
  Raw& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
  size_t size() const { return b.size(); }
  std::vector<uint8_t> b;

 private:
  template <class T>
  Raw& put(T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
};

// A minimal valid file: one key, one f32 tensor [4] at offset 0.
Raw minimal_ok() {
  Raw r;
  r.header(3, 1, 1).kv_u32("k", 7).tensor("w", {4}, 0, 0).pad(32).zeros(16);
  return r;
}

// ---------------------------------------------------------------------------------------------
// Round trips

void expect_matches_valid(const GGUFFile& f, const uint8_t* base) {
  const Valid v = make_valid();
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.metadata().size(), v.kv.size());
  for (size_t k = 0; k < v.kv.size(); ++k) {
    EXPECT_EQ(f.metadata()[k].first, v.kv[k].first);
    EXPECT_EQ(diff(f.metadata()[k].second, v.kv[k].second, v.kv[k].first), "");
  }
  ASSERT_EQ(f.tensors().size(), tensor_specs().size());
  uint64_t expect_offset = 0;
  for (size_t k = 0; k < tensor_specs().size(); ++k) {
    const TensorSpec& s = tensor_specs()[k];
    const GGUFTensorInfo& t = f.tensors()[k];
    SCOPED_TRACE(s.name);
    EXPECT_EQ(t.name, s.name);
    EXPECT_EQ(t.ne, s.ne);
    EXPECT_EQ(t.type, s.type);
    EXPECT_EQ(t.offset, expect_offset);
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(uint64_t(t.data - base) % 64, 0u) << "data not aligned to general.alignment in the file";
    uint64_t n = 1;
    for (uint64_t d : s.ne) n *= d;
    EXPECT_EQ(t.n_elements, n);
    ASSERT_EQ(t.n_bytes, v.data[k].size());
    EXPECT_EQ(std::memcmp(t.data, v.data[k].data(), t.n_bytes), 0);
    EXPECT_EQ(f.find_tensor(s.name), &t);
    expect_offset = (t.offset + t.n_bytes + 63) / 64 * 64;
  }
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(GGUFRoundTrip, ParseInMemory) {
  const auto& img = valid_image();
  const auto f = GGUFFile::parse(img.data(), img.size(), "mem.gguf");
  EXPECT_EQ(f->path(), "mem.gguf");
  expect_matches_valid(*f, img.data());
}

TEST(GGUFRoundTrip, WriteAndOpen) {
  TempFile tmp("roundtrip.gguf");
  make_valid().writer.write(tmp.path());
  EXPECT_FALSE(fs::exists(tmp.path() + ".tmp"));
  const std::string on_disk = test::read_file(tmp.path());
  ASSERT_EQ(on_disk.size(), valid_image().size());
  EXPECT_EQ(std::memcmp(on_disk.data(), valid_image().data(), on_disk.size()), 0)
      << "write() and to_bytes() disagree";
  const auto f = GGUFFile::open(tmp.path());
  EXPECT_EQ(f->path(), tmp.path());
  // The mapping's base, from where the in-memory parse puts the first tensor.
  const auto& img = valid_image();
  const auto g = GGUFFile::parse(img.data(), img.size(), "mem.gguf");
  const uint8_t* base = f->tensors()[0].data - (g->tensors()[0].data - img.data());
  expect_matches_valid(*f, base);
}

TEST(GGUFRoundTrip, DequantizedDataSurvives) {
  // The q8_0 tensor read back dequantizes close to its source floats (the bytes are the right ones
  // at the right offset, not merely the same length).
  const auto& img = valid_image();
  const auto f = GGUFFile::parse(img.data(), img.size(), "mem.gguf");
  const GGUFTensorInfo* t = f->find_tensor("blk.0.q8_0");
  ASSERT_NE(t, nullptr);
  const std::vector<float> src = values(64 * 3, 4);  // seed 4: the 4th spec
  std::vector<float> back(64);
  for (int r = 0; r < 3; ++r) {
    dequantize_row(GGMLType::Q8_0, t->data + r * 68, back.data(), 64);
    for (int k = 0; k < 64; ++k) EXPECT_NEAR(back[size_t(k)], src[size_t(r * 64 + k)], 0.03f);
  }
}

TEST(GGUFRoundTrip, DefaultAlignmentIs32) {
  GGUFWriter w;
  w.set("a", GGUFValue::of_u32(1));
  w.add_tensor("x", GGMLType::F32, {3}, std::vector<uint8_t>(12, 1));
  w.add_tensor("y", GGMLType::F32, {5}, std::vector<uint8_t>(20, 2));
  const auto b = w.to_bytes();
  const auto f = GGUFFile::parse(b.data(), b.size(), "a32.gguf");
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->tensors()[1].offset, 32u);
  EXPECT_EQ(uint64_t(f->tensors()[0].data - b.data()) % 32, 0u);
  EXPECT_EQ(f->tensors()[1].data[0], 2);
}

TEST(GGUFRoundTrip, NoTensorsNoMetadata) {
  GGUFWriter w;
  const auto b = w.to_bytes();
  const auto f = GGUFFile::parse(b.data(), b.size(), "empty.gguf");
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GGUFRoundTrip, Version2Accepted) {
  std::vector<uint8_t> b = valid_image();
  b[4] = 2;  // v2 differs from v3 only in the version field (both use 64-bit counts)
  const auto f = GGUFFile::parse(b.data(), b.size(), "v2.gguf");
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->tensors().size(), tensor_specs().size());
}

// ---------------------------------------------------------------------------------------------
// Typed getters

class GGUFGetters : public ::testing::Test {
 protected:
  void SetUp() override { f = GGUFFile::parse(valid_image().data(), valid_image().size(), "get.gguf"); }
  std::string err(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }
  std::unique_ptr<GGUFFile> f;
};

TEST_F(GGUFGetters, Integers) {
  EXPECT_EQ(f->get_u64("t.u8", 0), 200u);
  EXPECT_EQ(f->get_u64("t.u16", 0), 65535u);
  EXPECT_EQ(f->get_u64("t.u32", 0), 4000000000u);
  EXPECT_EQ(f->get_u64("t.u64", 0), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->require_u64("general.alignment"), 64u);
  EXPECT_EQ(f->get_u64("absent", 17), 17u);
  EXPECT_EQ(f->get_i64("t.i8", 0), -100);
  EXPECT_EQ(f->get_i64("t.i16", 0), -30000);
  EXPECT_EQ(f->get_i64("t.i32", 0), -2000000000);
  EXPECT_EQ(f->get_i64("t.i64", 0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->get_i64("t.u32", 0), 4000000000);
  EXPECT_EQ(f->get_i64("absent", -3), -3);
}

TEST_F(GGUFGetters, FloatsBoolsStrings) {
  EXPECT_FLOAT_EQ(float(f->get_f64("t.f32", 0)), -1.5e-7f);
  EXPECT_DOUBLE_EQ(f->get_f64("t.f64", 0), 3.141592653589793);
  EXPECT_DOUBLE_EQ(f->get_f64("t.i16", 0), -30000.0);
  EXPECT_DOUBLE_EQ(f->get_f64("t.u64", 0), 18446744073709551615.0);  // not -1
  EXPECT_DOUBLE_EQ(f->get_f64("absent", 2.5), 2.5);
  EXPECT_TRUE(f->get_bool("t.bool_t", false));
  EXPECT_FALSE(f->get_bool("t.bool_f", true));
  EXPECT_TRUE(f->get_bool("absent", true));
  EXPECT_EQ(f->get_str("t.str_nul", "x"), std::string("a\0b", 3));
  EXPECT_EQ(f->require_str("t.str_empty"), "");
  EXPECT_EQ(f->get_str("absent", "dflt"), "dflt");
  EXPECT_TRUE(f->has("t.str"));
  EXPECT_FALSE(f->has("t.st"));
}

TEST_F(GGUFGetters, Arrays) {
  EXPECT_EQ(f->get_str_array("t.arr_str"), (std::vector<std::string>{"<unk>", "", "\xE2\x96\x81the"}));
  EXPECT_EQ(f->get_f32_array("t.arr_f32"), (std::vector<float>{0.5f, -2.0f, 1e30f}));
  EXPECT_EQ(f->get_f32_array("t.arr_f64"), (std::vector<float>{float(1e-300), -2.5f}));
  EXPECT_EQ(f->get_i32_array("t.arr_i32"), (std::vector<int32_t>{1, -2, 2147483647}));
  EXPECT_EQ(f->get_i32_array("t.arr_u8"), (std::vector<int32_t>{7, 255}));
  EXPECT_EQ(f->get_i32_array("t.arr_i64"), (std::vector<int32_t>{-5}));
  EXPECT_TRUE(f->get_i32_array("t.arr_empty").empty());
  EXPECT_TRUE(f->get_str_array("absent").empty());
}

TEST_F(GGUFGetters, WrongTypeErrorsNameKeyAndTypes) {
  std::string m = err([&] { f->get_u64("t.str", 0); });
  EXPECT_HAS(m, "get.gguf");
  EXPECT_HAS(m, "'t.str'");
  EXPECT_HAS(m, "integer");
  EXPECT_HAS(m, "got string");
  m = err([&] { f->get_u64("t.i8", 0); });
  EXPECT_HAS(m, "'t.i8'");
  EXPECT_HAS(m, "negative");
  m = err([&] { f->get_i64("t.u64", 0); });
  EXPECT_HAS(m, "'t.u64'");
  EXPECT_HAS(m, "out of range");
  m = err([&] { f->get_f64("t.bool_t", 0); });
  EXPECT_HAS(m, "'t.bool_t'");
  EXPECT_HAS(m, "got bool");
  m = err([&] { f->get_bool("t.u8", false); });
  EXPECT_HAS(m, "expected bool, got uint8");
  m = err([&] { f->get_str("t.arr_i32", ""); });
  EXPECT_HAS(m, "'t.arr_i32'");
  EXPECT_HAS(m, "expected string, got array of int32");
  m = err([&] { f->get_str_array("t.arr_f32"); });
  EXPECT_HAS(m, "expected array of string, got array of float32");
  m = err([&] { f->get_f32_array("t.arr_str"); });
  EXPECT_HAS(m, "got array of string");
  m = err([&] { f->get_i32_array("t.arr_f32"); });
  EXPECT_HAS(m, "got array of float32");
  m = err([&] { f->get_i32_array("t.u32"); });
  EXPECT_HAS(m, "got uint32");
  m = err([&] { f->require_u64("missing.key"); });
  EXPECT_HAS(m, "missing required key 'missing.key'");
  m = err([&] { f->require_str("missing.str"); });
  EXPECT_HAS(m, "'missing.str'");
}

TEST(GGUFGettersRange, I32ArrayOutOfRange) {
  GGUFWriter w;
  w.set("big", GGUFValue::of_array(VT::INT64, {int_value(VT::INT64, int64_t(1) << 40)}));
  w.set("huge_u64", GGUFValue::of_array(VT::UINT64, {GGUFValue::of_u64(~uint64_t(0))}));
  const auto b = w.to_bytes();
  const auto f = GGUFFile::parse(b.data(), b.size(), "r.gguf");
  for (const char* key : {"big", "huge_u64"}) {
    try {
      f->get_i32_array(key);
      ADD_FAILURE() << key << ": no error";
    } catch (const Error& e) {
      EXPECT_HAS(std::string(e.what()), "out of int32 range");
      EXPECT_HAS(std::string(e.what()), key);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Writer errors

TEST(GGUFWriterErrors, RejectsInconsistentInput) {
  auto expect_err = [](const std::function<void()>& fn, const std::string& sub) {
    try {
      fn();
      ADD_FAILURE() << "no error, wanted: " << sub;
    } catch (const Error& e) {
      EXPECT_HAS(std::string(e.what()), sub);
    }
  };
  GGUFWriter w;
  w.add_tensor("ok", GGMLType::F32, {2}, std::vector<uint8_t>(8, 1));
  expect_err([&] { w.add_tensor("ok", GGMLType::F32, {2}, std::vector<uint8_t>(8)); }, "duplicate tensor 'ok'");
  expect_err([&] { w.add_tensor("short", GGMLType::F32, {3}, std::vector<uint8_t>(8)); }, "'short'");
  expect_err([&] { w.add_tensor("q", GGMLType::Q8_0, {33}, std::vector<uint8_t>(34)); }, "'q'");
  expect_err([&] { w.add_tensor("nodims", GGMLType::F32, {}, {}); }, "'nodims'");
  expect_err([&] { w.add_tensor("d5", GGMLType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)); }, "'d5'");
  for (const GGUFValue& bad : {GGUFValue::of_u32(0), GGUFValue::of_u32(48), GGUFValue::of_str("32"),
                               GGUFValue::of_u64(32)}) {
    GGUFWriter a;
    a.set("general.alignment", bad);
    a.add_tensor("x", GGMLType::F32, {1}, std::vector<uint8_t>(4));
    expect_err([&] { a.to_bytes(); }, "general.alignment");
  }
  GGUFWriter mixed;
  mixed.set("m", GGUFValue::of_array(VT::INT32, {GGUFValue::of_i32(1), GGUFValue::of_u32(2)}));
  expect_err([&] { mixed.to_bytes(); }, "array element of type uint32");
  GGUFWriter empty_key;
  empty_key.set("", GGUFValue::of_u32(1));
  expect_err([&] { empty_key.to_bytes(); }, "empty metadata key");
}

// ---------------------------------------------------------------------------------------------
// Malformed files

TEST(GGUFMalformed, TruncatedAtEveryByte) {
  const auto& img = valid_image();
  // Bytes past the end of the last tensor's data are padding: cuts there still parse.
  const auto full = GGUFFile::parse(img.data(), img.size(), "x");
  const GGUFTensorInfo& last = full->tensors().back();
  const uint64_t end = uint64_t(last.data - img.data()) + last.n_bytes;
  ASSERT_EQ(end, img.size()) << "the fixture is meant to end without padding";
  std::vector<uint8_t> keep;
  for (size_t cut = 0; cut < img.size(); ++cut) {
    try {
      parse_copy(img, cut, "cut.gguf", keep);
      ADD_FAILURE() << "prefix of " << cut << " bytes parsed";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("cut.gguf: ", 0), 0u) << m;
      EXPECT_HAS(m, "truncated");
    }
  }
}

TEST(GGUFMalformed, TruncatedFilesOnDisk) {
  const auto& img = valid_image();
  TempFile tmp("trunc.gguf");
  for (size_t cut : {size_t(0), size_t(3), size_t(23), size_t(24), size_t(100), img.size() / 2, img.size() - 1}) {
    write_bytes(tmp.path(), img.data(), cut);
    try {
      GGUFFile::open(tmp.path());
      ADD_FAILURE() << "prefix of " << cut << " bytes opened";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_HAS(m, tmp.path());
      EXPECT_HAS(m, "truncated");
    }
  }
}

TEST(GGUFMalformed, OpenMissingFileAndDirectory) {
  try {
    GGUFFile::open("/nonexistent/dir/model.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "/nonexistent/dir/model.gguf");
    EXPECT_HAS(std::string(e.what()), "cannot open");
  }
  try {
    GGUFFile::open(fs::temp_directory_path().string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "not a regular file");
  }
  // A FIFO with no writer (POST /v1/load_lora_adapter names any path): refused at once, where a
  // blocking open waited for a writer, holding a server thread.
  const std::string fifo = (fs::temp_directory_path() / ("ft-fifo-" + std::to_string(getpid()))).string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  try {
    GGUFFile::open(fifo);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "not a regular file");
  }
  fs::remove(fifo);
}

TEST(GGUFMalformed, MinimalFixtureIsValid) {
  // The malformed cases below each change one field of this file.
  const Raw r = minimal_ok();
  const auto f = GGUFFile::parse(r.b.data(), r.b.size(), "ok.gguf");
  EXPECT_EQ(f->get_u64("k", 0), 7u);
  EXPECT_EQ(f->tensors().at(0).n_bytes, 16u);
}

TEST(GGUFMalformed, BadMagic) {
  std::vector<uint8_t> b = valid_image();
  std::memcpy(b.data(), "GGML", 4);
  std::string m = parse_error(b);
  EXPECT_HAS(m, "bad.gguf: ");
  EXPECT_HAS(m, "bad magic 'GGML'");
  EXPECT_HAS(m, "at byte 0");
  b[0] = 0x00;
  b[1] = 0xff;
  m = parse_error(b);
  EXPECT_HAS(m, "magic");
  EXPECT_HAS(m, "\\x0");
}

TEST(GGUFMalformed, UnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    Raw r;
    r.header(v, 0, 0);
    const std::string m = parse_error(r.b);
    EXPECT_HAS(m, cat("unsupported GGUF version ", v));
    EXPECT_HAS(m, "at byte 4");
  }
}

TEST(GGUFMalformed, AbsurdCounts) {
  Raw t;
  t.header(3, uint64_t(1) << 63, 0).zeros(64);
  std::string m = parse_error(t.b);
  EXPECT_HAS(m, "tensor count 9223372036854775808");
  EXPECT_HAS(m, "at byte 8");
  Raw k;
  k.header(3, 0, uint64_t(1) << 63).zeros(64);
  m = parse_error(k.b);
  EXPECT_HAS(m, "metadata count 9223372036854775808");
  EXPECT_HAS(m, "at byte 16");
  Raw both;
  both.header(3, ~uint64_t(0), ~uint64_t(0));
  EXPECT_HAS(parse_error(both.b), "count");
  // Counts that are merely too many for the bytes present.
  Raw few;
  few.header(3, 0, 3).kv_u32("a", 1);
  EXPECT_HAS(parse_error(few.b), "metadata count 3");
}

TEST(GGUFMalformed, AbsurdStringLengths) {
  Raw key;
  key.header(3, 0, 1).u64(~uint64_t(0)).zeros(32);
  std::string m = parse_error(key.b);
  EXPECT_HAS(m, "metadata key length 18446744073709551615");
  EXPECT_HAS(m, "at byte 24");
  Raw val;
  val.header(3, 0, 1).str("s").u32(uint32_t(VT::STRING)).u64(~uint64_t(0)).zeros(32);
  m = parse_error(val.b);
  EXPECT_HAS(m, "string value length 18446744073709551615");
  EXPECT_HAS(m, "at byte 37");
  Raw name;
  name.header(3, 1, 0).u64(uint64_t(1) << 62).zeros(64);
  EXPECT_HAS(parse_error(name.b), "tensor name length");
}

TEST(GGUFMalformed, AbsurdArrayCounts) {
  for (VT et : {VT::UINT8, VT::UINT64, VT::STRING, VT::ARRAY}) {
    Raw r;
    r.header(3, 0, 1).str("arr").u32(uint32_t(VT::ARRAY)).u32(uint32_t(et)).u64(uint64_t(1) << 62).zeros(64);
    const std::string m = parse_error(r.b);
    EXPECT_HAS(m, "key 'arr': array of 4611686018427387904 ");
    EXPECT_HAS(m, value_type_name(et));
    EXPECT_HAS(m, "at byte 39");
  }
}

TEST(GGUFMalformed, ArrayElementBudget) {
  // A count that fits the bytes present (as a corrupt count in a multi-GB model would, by
  // swallowing tensor data) but exceeds the 2^24 metadata elements a file may hold: rejected
  // before any element is parsed (each would cost ~100 bytes of memory).
  const uint64_t n = (uint64_t(1) << 24) + 1;
  Raw r;
  r.header(3, 0, 1).str("big").u32(uint32_t(VT::ARRAY)).u32(uint32_t(VT::UINT8)).u64(n).zeros(size_t(n));
  const std::string m = parse_error(r.b);
  EXPECT_HAS(m, "key 'big': array of 16777217 elements exceeds the limit");
  EXPECT_HAS(m, "at byte 39");
}

// A key whose value is `levels` nested arrays around one uint8.
Raw nested(int levels) {
  Raw r;
  r.header(3, 0, 1).str("deep").u32(uint32_t(VT::ARRAY));
  for (int l = 0; l < levels; ++l) r.u32(uint32_t(l + 1 < levels ? VT::ARRAY : VT::UINT8)).u64(1);
  r.u8(5);
  return r;
}

TEST(GGUFMalformed, NestingDepth) {
  const Raw ok = nested(8);
  const auto f = GGUFFile::parse(ok.b.data(), ok.b.size(), "deep.gguf");
  const GGUFValue* v = f->find("deep");
  for (int l = 0; l < 8; ++l) {
    ASSERT_EQ(v->type, VT::ARRAY);
    ASSERT_EQ(v->array.size(), 1u);
    v = &v->array[0];
  }
  EXPECT_EQ(v->u, 5u);
  for (int levels : {9, 100}) {
    const std::string m = parse_error(nested(levels).b);
    EXPECT_HAS(m, "key 'deep'");
    EXPECT_HAS(m, "nested deeper than 8");
  }
}

TEST(GGUFMalformed, InvalidValueTypes) {
  Raw r;
  r.header(3, 0, 1).str("v").u32(13).u32(0);
  std::string m = parse_error(r.b);
  EXPECT_HAS(m, "key 'v': invalid value type 13");
  EXPECT_HAS(m, "at byte 33");
  Raw big;
  big.header(3, 0, 1).str("v").u32(0x80000000u).u32(0);
  EXPECT_HAS(parse_error(big.b), "invalid value type 2147483648");
  Raw a;
  a.header(3, 0, 1).str("arr").u32(uint32_t(VT::ARRAY)).u32(99).u64(1).u32(0);
  m = parse_error(a.b);
  EXPECT_HAS(m, "key 'arr': invalid array element type 99");
}

TEST(GGUFMalformed, BoolNotZeroOrOne) {
  Raw r;
  r.header(3, 0, 1).str("flag").u32(uint32_t(VT::BOOL)).u8(2).zeros(8);
  std::string m = parse_error(r.b);
  EXPECT_HAS(m, "key 'flag': bool value 2 is not 0 or 1");
  EXPECT_HAS(m, "at byte 40");
  Raw a;
  a.header(3, 0, 1).str("flags").u32(uint32_t(VT::ARRAY)).u32(uint32_t(VT::BOOL)).u64(2).u8(1).u8(255);
  EXPECT_HAS(parse_error(a.b), "key 'flags': bool value 255");
}

TEST(GGUFMalformed, EmptyAndDuplicateKeys) {
  Raw e;
  e.header(3, 0, 1).kv_u32("", 1);
  EXPECT_HAS(parse_error(e.b), "empty key");
  Raw d;
  d.header(3, 0, 2).kv_u32("general.name", 1).kv_u32("general.name", 2);
  const std::string m = parse_error(d.b);
  EXPECT_HAS(m, "duplicate metadata key 'general.name'");
  EXPECT_HAS(m, "at byte 52");
}

// One tensor info (after one key) followed by enough zero data; error message for it.
std::string tensor_error(const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset, size_t data = 256) {
  Raw r;
  r.header(3, 1, 1).kv_u32("k", 1).tensor("blk.0.w", ne, type, offset).pad(32).zeros(data);
  return parse_error(r.b);
}

TEST(GGUFMalformed, BadDimensionCounts) {
  for (uint32_t n : {0u, 5u, 1000000u}) {
    Raw r;
    r.header(3, 1, 0).str("w").u32(n).zeros(128);
    const std::string m = parse_error(r.b);
    EXPECT_HAS(m, cat("tensor 'w': ", n, " dimensions (must be 1..4)"));
    EXPECT_HAS(m, "at byte 33");
  }
}

TEST(GGUFMalformed, BadDims) {
  std::string m = tensor_error({4, 0}, 0, 0);
  EXPECT_HAS(m, "tensor 'blk.0.w': dimension 1 = 0");
  EXPECT_HAS(m, "at byte");
  // 2^32 * 2^32 overflows uint64; 2^62 * 2 exceeds int64.
  m = tensor_error({uint64_t(1) << 32, uint64_t(1) << 32}, 0, 0);
  EXPECT_HAS(m, "tensor 'blk.0.w': dimension 1 = 4294967296");
  m = tensor_error({uint64_t(1) << 62, 2}, 0, 0);
  EXPECT_HAS(m, "dimension 1 = 2");
  m = tensor_error({~uint64_t(0)}, 0, 0);
  EXPECT_HAS(m, "dimension 0 = 18446744073709551615");
  // Large but representable element count: fails on the data size instead.
  m = tensor_error({uint64_t(1) << 40}, 0, 0);
  EXPECT_HAS(m, "tensor 'blk.0.w'");
  EXPECT_HAS(m, "past the end");
}

TEST(GGUFMalformed, UnknownTensorTypes) {
  std::string m = tensor_error({32}, 99, 0);
  EXPECT_HAS(m, "tensor 'blk.0.w': unknown type id 99");
  EXPECT_HAS(m, "at byte");
  m = tensor_error({32}, 4, 0);  // q4_2: removed from ggml, no geometry
  EXPECT_HAS(m, "unknown type id 4");
  EXPECT_HAS(m, "q4_2");
  EXPECT_HAS(tensor_error({32}, 0xffffffffu, 0), "unknown type id 4294967295");
}

TEST(GGUFMalformed, RowNotWholeBlocks) {
  const std::string m = tensor_error({33, 2}, uint32_t(GGMLType::Q8_0), 0);
  EXPECT_HAS(m, "tensor 'blk.0.w': row length 33 is not a multiple of the q8_0 block size 32");
  EXPECT_HAS(tensor_error({128}, uint32_t(GGMLType::Q4_K), 0), "q4_k block size 256");
}

TEST(GGUFMalformed, BadOffsets) {
  std::string m = tensor_error({4}, 0, 4);
  EXPECT_HAS(m, "tensor 'blk.0.w': data offset 4 is not a multiple of the alignment 32");
  EXPECT_HAS(m, "at byte");
  // Aligned offsets past the end, including ones whose sum with the data start overflows.
  for (uint64_t off : {uint64_t(256), uint64_t(1) << 40, ~uint64_t(0) - 31}) {
    m = tensor_error({4}, 0, off);
    EXPECT_HAS(m, "tensor 'blk.0.w'");
    EXPECT_HAS(m, cat("offset ", off));
    EXPECT_HAS(m, "past the end of the file");
  }
  // Offset in range, size not: 64 floats at offset 0 with 128 bytes of data.
  m = tensor_error({64}, 0, 0, 128);
  EXPECT_HAS(m, "(256 bytes)");
  EXPECT_HAS(m, "past the end");
  // Ends exactly at the end of the file: fine.
  Raw r;
  r.header(3, 1, 0).tensor("w", {64}, 0, 0).pad(32).zeros(256);
  EXPECT_NO_THROW(GGUFFile::parse(r.b.data(), r.b.size(), "edge.gguf"));
  // Two tensors whose bytes overlap (each would be packed apart: a small file, a large load), in
  // either order; adjacent ones and ones with a gap are fine.
  for (const auto& [off_a, off_b, ok] : {std::tuple{0u, 32u, false}, std::tuple{32u, 0u, false}, std::tuple{0u, 0u, false},
                                         std::tuple{0u, 64u, true}, std::tuple{128u, 0u, true}}) {
    Raw t;
    t.header(3, 2, 0).tensor("a", {16}, 0, off_a).tensor("b", {16}, 0, off_b).pad(32).zeros(256);
    if (ok) {
      EXPECT_NO_THROW(GGUFFile::parse(t.b.data(), t.b.size(), "disjoint.gguf")) << off_a << " " << off_b;
    } else {
      m = parse_error(t.b);
      EXPECT_HAS(m, "overlap");
    }
  }
}

TEST(GGUFMalformed, DataSectionStartsPastEnd) {
  Raw r;
  r.header(3, 1, 0).tensor("w", {1}, 0, 0);
  while (r.size() % 32 == 0) r.u8(0);  // header not ending on the alignment boundary
  const std::string m = parse_error(r.b);
  EXPECT_HAS(m, "truncated");
}

TEST(GGUFMalformed, DuplicateTensorNames) {
  Raw r;
  r.header(3, 2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad(32).zeros(64);
  const std::string m = parse_error(r.b);
  EXPECT_HAS(m, "duplicate tensor name 'w'");
  EXPECT_HAS(m, "at byte 57");
}

TEST(GGUFMalformed, BadAlignment) {
  auto with_alignment = [](uint32_t type, uint32_t value) {
    Raw r;
    r.header(3, 1, 1).str("general.alignment").u32(type).u32(value).tensor("w", {4}, 0, 0).pad(64).zeros(64);
    return r.b;
  };
  for (uint32_t a : {0u, 48u, 3u, 0x80000001u}) {
    const std::string m = parse_error(with_alignment(uint32_t(VT::UINT32), a));
    EXPECT_HAS(m, "general.alignment");
    EXPECT_HAS(m, cat(a, " is not a power of two"));
  }
  for (VT t : {VT::INT32, VT::FLOAT32}) {
    const std::string m = parse_error(with_alignment(uint32_t(t), 32));
    EXPECT_HAS(m, "general.alignment");
    EXPECT_HAS(m, cat("expected uint32, got ", value_type_name(t)));
  }
  Raw s;
  s.header(3, 0, 1).str("general.alignment").u32(uint32_t(VT::STRING)).str("32");
  EXPECT_HAS(parse_error(s.b), "got string");
  // Alignment 1 and a large power of two are legal.
  for (uint32_t a : {1u, 256u}) {
    Raw r;
    r.header(3, 1, 1).kv_u32("general.alignment", a).tensor("w", {4}, 0, 0).pad(a).zeros(16);
    const auto f = GGUFFile::parse(r.b.data(), r.b.size(), "a.gguf");
    EXPECT_EQ(f->alignment(), a);
  }
}

// ---------------------------------------------------------------------------------------------
// Random corruption

TEST(GGUFFuzz, RandomCorruptionParsesOrThrows) {
  const auto& img = valid_image();
  const auto f0 = GGUFFile::parse(img.data(), img.size(), "x");
  const uint64_t header_end = uint64_t(f0->tensors()[0].data - img.data());
  std::mt19937_64 rng(20240601);
  int parsed = 0, rejected = 0;
  std::vector<uint8_t> b;
  for (int it = 0; it < 4000; ++it) {
    b = img;
    const int n_edits = 1 + int(rng() % 6);
    for (int e = 0; e < n_edits; ++e) {
      // Mostly in the header, where corruption changes structure; sometimes anywhere.
      const uint64_t at = rng() % 4 ? rng() % std::min<uint64_t>(header_end, b.size()) : rng() % b.size();
      switch (rng() % 4) {
        case 0: b[at] ^= uint8_t(1u << (rng() % 8)); break;     // bit flip
        case 1: b[at] = uint8_t(rng()); break;                  // random byte
        case 2: b[at] = 0xff; break;                            // towards huge values
        case 3: b.resize(at); break;                            // truncate
      }
      if (b.empty()) break;
    }
    // Exact-size heap copy: ASan flags any read past the end.
    std::vector<uint8_t> exact(b.begin(), b.end());
    try {
      const auto f = GGUFFile::parse(exact.data(), exact.size(), "fuzz.gguf");
      // Touch every tensor byte: the views must lie inside the image.
      unsigned sum = 0;
      for (const auto& t : f->tensors()) {
        ASSERT_GE(t.data, exact.data());
        ASSERT_LE(t.data + t.n_bytes, exact.data() + exact.size());
        for (uint64_t k = 0; k < t.n_bytes; ++k) sum += t.data[k];
      }
      (void)sum;
      ++parsed;
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).rfind("fuzz.gguf: ", 0), 0u) << e.what();
      ++rejected;
    }
    // Anything else (std::bad_alloc, std::length_error, a crash) fails the test.
  }
  // Both outcomes must occur, or the fuzzing is not exercising the reader.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace ft
