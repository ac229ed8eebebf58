#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "gguf/gguf.h"

namespace ft {

namespace {

class ByteSink {
 public:
  std::vector<uint8_t> bytes;
  template <class T>
  void put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    bytes.insert(bytes.end(), raw, raw + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
  }
};

void put_value(ByteSink& out, const GGUFValue& v) {
  switch (v.type) {
    case GGUFValueType::UINT8: out.put<uint8_t>(uint8_t(v.u)); break;
    case GGUFValueType::INT8: out.put<int8_t>(int8_t(v.i)); break;
    case GGUFValueType::UINT16: out.put<uint16_t>(uint16_t(v.u)); break;
    case GGUFValueType::INT16: out.put<int16_t>(int16_t(v.i)); break;
    case GGUFValueType::UINT32: out.put<uint32_t>(uint32_t(v.u)); break;
    case GGUFValueType::INT32: out.put<int32_t>(int32_t(v.i)); break;
    case GGUFValueType::UINT64: out.put<uint64_t>(v.u); break;
    case GGUFValueType::INT64: out.put<int64_t>(v.i); break;
    case GGUFValueType::FLOAT32: out.put<float>(float(v.f)); break;
    case GGUFValueType::FLOAT64: out.put<double>(v.f); break;
    case GGUFValueType::BOOL: out.put<uint8_t>(v.b ? 1 : 0); break;
    case GGUFValueType::STRING: out.put_string(v.str); break;
    case GGUFValueType::ARRAY:
      out.put<uint32_t>(uint32_t(v.elem_type));
      out.put<uint64_t>(v.array.size());
      for (const auto& e : v.array) {
        if (e.type != v.elem_type) fail("GGUF writer: array element of type ", value_type_name(e.type),
                                        " in an array of ", value_type_name(v.elem_type));
        put_value(out, e);
      }
      break;
  }
}

}  // namespace

void GGUFWriter::set(std::string key, GGUFValue value) {
  for (auto& [k, v] : kv_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  kv_.emplace_back(std::move(key), std::move(value));
}

void GGUFWriter::add_tensor(std::string name, GGMLType type, std::vector<uint64_t> ne,
                            std::vector<uint8_t> data) {
  if (ne.empty() || ne.size() > 4) fail("GGUF writer: tensor '", name, "' must have 1..4 dims");
  const auto rb = row_bytes(type, ne[0]);
  if (!rb) fail("GGUF writer: tensor '", name, "': row of ", ne[0], " is not whole blocks of ",
                type_traits(type).name);
  uint64_t expect = *rb;
  for (size_t d = 1; d < ne.size(); ++d) expect *= ne[d];
  if (data.size() != expect)
    fail("GGUF writer: tensor '", name, "': ", data.size(), " bytes of data, expected ", expect);
  for (const auto& t : tensors_)
    if (t.name == name) fail("GGUF writer: duplicate tensor '", name, "'");
  tensors_.push_back({std::move(name), type, std::move(ne), std::move(data)});
}

// Header, metadata, tensor infos and padding up to the data section.
static std::vector<uint8_t> header_bytes(
    const std::vector<std::pair<std::string, GGUFValue>>& kv_, const auto& tensors_,
    uint64_t* alignment_out) {
  // Validated here (not in set()) so a caller may set keys in any order; a bad alignment would
  // otherwise divide by zero below.
  uint64_t alignment = 32;
  for (const auto& [k, v] : kv_) {
    if (k.empty()) fail("GGUF writer: empty metadata key");
    if (k != "general.alignment") continue;
    if (v.type != GGUFValueType::UINT32)
      fail("GGUF writer: key 'general.alignment': expected uint32, got ", value_type_name(v.type));
    if (v.u == 0 || (v.u & (v.u - 1)) != 0)
      fail("GGUF writer: key 'general.alignment': ", v.u, " is not a power of two");
    alignment = v.u;
  }
  ByteSink out;
  for (char ch : {'G', 'G', 'U', 'F'}) out.bytes.push_back(uint8_t(ch));
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    out.put_string(k);
    out.put<uint32_t>(uint32_t(v.type));
    put_value(out, v);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.put_string(t.name);
    out.put<uint32_t>(uint32_t(t.ne.size()));
    for (uint64_t n : t.ne) out.put<uint64_t>(n);
    out.put<uint32_t>(uint32_t(t.type));
    out.put<uint64_t>(offset);
    offset += t.data.size();
    offset = (offset + alignment - 1) / alignment * alignment;
  }
  out.pad_to(alignment);
  *alignment_out = alignment;
  return std::move(out.bytes);
}

std::vector<uint8_t> GGUFWriter::to_bytes() const {
  uint64_t alignment = 32;
  std::vector<uint8_t> bytes = header_bytes(kv_, tensors_, &alignment);
  for (const auto& t : tensors_) {
    bytes.insert(bytes.end(), t.data.begin(), t.data.end());
    bytes.resize((bytes.size() + alignment - 1) / alignment * alignment, 0);
  }
  return bytes;
}

void GGUFWriter::write(const std::string& path) const {
  uint64_t alignment = 32;
  const std::vector<uint8_t> header = header_bytes(kv_, tensors_, &alignment);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail(path, ": cannot open for writing");
    f.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size()));
    const char zeros[64] = {};
    for (const auto& t : tensors_) {
      f.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size()));
      const uint64_t pad = (alignment - t.data.size() % alignment) % alignment;
      for (uint64_t left = pad; left > 0;) {
        const uint64_t n = std::min<uint64_t>(left, sizeof zeros);
        f.write(zeros, std::streamsize(n));
        left -= n;
      }
    }
    if (!f) fail(path, ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, ": cannot rename ", tmp);
}

}  // namespace ft
