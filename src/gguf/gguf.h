// GGUF v2/v3 reader (mmap, zero-copy tensor views, strict validation) and writer.
//
// Layout (little endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
// n_kv x (string key, u32 value type, value), n_tensors x (string name, u32 n_dims,
// n_dims x u64 ne, u32 type, u64 offset), padding to general.alignment (default 32), data.
// Every offset, count and size is checked against the file before it is used; a bad file
// throws ft::Error "FILE: what is wrong (at byte N | key K | tensor T)".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gguf/ggml_types.h"

namespace ft {

enum class GGUFValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view value_type_name(GGUFValueType t);
// A tensor's shape (ne, innermost first) as errors print it: "[4096, 32000]".
std::string shape_str(const std::vector<uint64_t>& ne);

// One metadata value; arrays may nest. Integers keep their exact value in i (signed types)
// or u (unsigned types).
struct GGUFValue {
  GGUFValueType type = GGUFValueType::UINT32;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string str;
  GGUFValueType elem_type = GGUFValueType::UINT8;  // arrays only
  std::vector<GGUFValue> array;

  bool is_integer() const;
  bool is_float() const { return type == GGUFValueType::FLOAT32 || type == GGUFValueType::FLOAT64; }

  // Constructors for the writer and tests.
  static GGUFValue of_u32(uint32_t v);
  static GGUFValue of_i32(int32_t v);
  static GGUFValue of_u64(uint64_t v);
  static GGUFValue of_f32(float v);
  static GGUFValue of_bool(bool v);
  static GGUFValue of_str(std::string v);
  static GGUFValue of_array(GGUFValueType elem, std::vector<GGUFValue> items);
  static GGUFValue of_str_array(const std::vector<std::string>& items);
  static GGUFValue of_f32_array(const std::vector<float>& items);
  static GGUFValue of_i32_array(const std::vector<int32_t>& items);
};

struct GGUFTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] is the innermost (contiguous) dimension
  GGMLType type = GGMLType::F32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
};

class GGUFFile {
 public:
  // Maps and validates the whole file. Throws ft::Error.
  static std::unique_ptr<GGUFFile> open(const std::string& path);
  // Parses an in-memory image (kept by reference: `bytes` must outlive the object).
  static std::unique_ptr<GGUFFile> parse(const uint8_t* bytes, uint64_t size, std::string name);
  ~GGUFFile();
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }

  const GGUFValue* find(std::string_view key) const;
  const GGUFTensorInfo* find_tensor(std::string_view name) const;

  // Typed getters: nullopt-like defaults when absent; a present key of the wrong type throws
  // ft::Error naming the key, the expected and the actual type.
  bool has(std::string_view key) const { return find(key) != nullptr; }
  uint64_t get_u64(std::string_view key, uint64_t dflt) const;
  uint64_t require_u64(std::string_view key) const;
  int64_t get_i64(std::string_view key, int64_t dflt) const;
  double get_f64(std::string_view key, double dflt) const;
  bool get_bool(std::string_view key, bool dflt) const;
  std::string get_str(std::string_view key, std::string dflt) const;
  std::string require_str(std::string_view key) const;
  // Array getters: throw if present with another element type; empty when absent.
  std::vector<std::string> get_str_array(std::string_view key) const;
  std::vector<float> get_f32_array(std::string_view key) const;
  std::vector<int32_t> get_i32_array(std::string_view key) const;

 private:
  GGUFFile() = default;
  void parse_all();
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;  // non-null when we own an mmap
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::vector<GGUFTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;  // name -> tensors_ index (find_tensor)
};

// Builds a GGUF v3 file in memory or on disk.
class GGUFWriter {
 public:
  void set(std::string key, GGUFValue value);  // replaces an existing key
  // data must hold exactly row_bytes(type, ne[0]) * prod(ne[1..]) bytes.
  void add_tensor(std::string name, GGMLType type, std::vector<uint64_t> ne,
                  std::vector<uint8_t> data);
  std::vector<uint8_t> to_bytes() const;
  void write(const std::string& path) const;  // throws ft::Error

 private:
  struct Tensor {
    std::string name;
    GGMLType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace ft
