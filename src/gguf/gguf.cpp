#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "core/error.h"

namespace ft {

std::string shape_str(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += cat(i ? ", " : "", ne[i]);
  return s + "]";
}

std::string_view value_type_name(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8: return "uint8";
    case GGUFValueType::INT8: return "int8";
    case GGUFValueType::UINT16: return "uint16";
    case GGUFValueType::INT16: return "int16";
    case GGUFValueType::UINT32: return "uint32";
    case GGUFValueType::INT32: return "int32";
    case GGUFValueType::FLOAT32: return "float32";
    case GGUFValueType::BOOL: return "bool";
    case GGUFValueType::STRING: return "string";
    case GGUFValueType::ARRAY: return "array";
    case GGUFValueType::UINT64: return "uint64";
    case GGUFValueType::INT64: return "int64";
    case GGUFValueType::FLOAT64: return "float64";
  }
  return "invalid";
}

bool GGUFValue::is_integer() const {
  switch (type) {
    case GGUFValueType::UINT8: case GGUFValueType::INT8: case GGUFValueType::UINT16:
    case GGUFValueType::INT16: case GGUFValueType::UINT32: case GGUFValueType::INT32:
    case GGUFValueType::UINT64: case GGUFValueType::INT64:
      return true;
    default:
      return false;
  }
}

GGUFValue GGUFValue::of_u32(uint32_t v) {
  GGUFValue x;
  x.type = GGUFValueType::UINT32;
  x.u = v;
  x.i = v;
  return x;
}
GGUFValue GGUFValue::of_i32(int32_t v) {
  GGUFValue x;
  x.type = GGUFValueType::INT32;
  x.i = v;
  x.u = uint64_t(v);
  return x;
}
GGUFValue GGUFValue::of_u64(uint64_t v) {
  GGUFValue x;
  x.type = GGUFValueType::UINT64;
  x.u = v;
  x.i = int64_t(v);
  return x;
}
GGUFValue GGUFValue::of_f32(float v) {
  GGUFValue x;
  x.type = GGUFValueType::FLOAT32;
  x.f = v;
  return x;
}
GGUFValue GGUFValue::of_bool(bool v) {
  GGUFValue x;
  x.type = GGUFValueType::BOOL;
  x.b = v;
  return x;
}
GGUFValue GGUFValue::of_str(std::string v) {
  GGUFValue x;
  x.type = GGUFValueType::STRING;
  x.str = std::move(v);
  return x;
}
GGUFValue GGUFValue::of_array(GGUFValueType elem, std::vector<GGUFValue> items) {
  GGUFValue x;
  x.type = GGUFValueType::ARRAY;
  x.elem_type = elem;
  x.array = std::move(items);
  return x;
}
GGUFValue GGUFValue::of_str_array(const std::vector<std::string>& items) {
  std::vector<GGUFValue> v;
  v.reserve(items.size());
  for (const auto& s : items) v.push_back(of_str(s));
  return of_array(GGUFValueType::STRING, std::move(v));
}
GGUFValue GGUFValue::of_f32_array(const std::vector<float>& items) {
  std::vector<GGUFValue> v;
  v.reserve(items.size());
  for (float f : items) v.push_back(of_f32(f));
  return of_array(GGUFValueType::FLOAT32, std::move(v));
}
GGUFValue GGUFValue::of_i32_array(const std::vector<int32_t>& items) {
  std::vector<GGUFValue> v;
  v.reserve(items.size());
  for (int32_t i : items) v.push_back(of_i32(i));
  return of_array(GGUFValueType::INT32, std::move(v));
}

namespace {

constexpr int kMaxArrayDepth = 8;
// Array elements over all metadata. Each parsed element costs sizeof(GGUFValue) (~100 bytes),
// so a corrupt count in a multi-GB file could otherwise consume the tensor data as millions of
// elements and exhaust memory. Real files hold ~1M (a 256k vocabulary's tokens, scores and
// types plus merges); 16M leaves ample room and bounds the worst case to ~1.6 GB.
constexpr uint64_t kMaxArrayElements = uint64_t(1) << 24;
constexpr uint32_t kMaxDims = 4;

// Bounds-checked little-endian reader over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& file)
      : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void error(const std::string& what, uint64_t at) const {
    fail(file_, ": ", what, " (at byte ", at, ")");
  }
  [[noreturn]] void error(const std::string& what) const { error(what, pos_); }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      error(cat("file truncated: need ", n, " bytes for ", what, ", only ", remaining(), " left"));
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t at = pos_;
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      error(cat(what, " length ", len, " exceeds the ", remaining(),
                " bytes left in the file (file truncated or corrupt)"),
            at);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), size_t(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  const std::string& file_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one value of type t (to bound counts before allocating).
uint64_t min_encoded_size(GGUFValueType t) {
  switch (t) {
    case GGUFValueType::UINT8: case GGUFValueType::INT8: case GGUFValueType::BOOL: return 1;
    case GGUFValueType::UINT16: case GGUFValueType::INT16: return 2;
    case GGUFValueType::UINT32: case GGUFValueType::INT32: case GGUFValueType::FLOAT32: return 4;
    case GGUFValueType::UINT64: case GGUFValueType::INT64: case GGUFValueType::FLOAT64: return 8;
    case GGUFValueType::STRING: return 8;
    case GGUFValueType::ARRAY: return 12;
  }
  return 0;
}

bool valid_value_type(uint32_t t) { return t <= uint32_t(GGUFValueType::FLOAT64); }

// elements_left: the remaining kMaxArrayElements budget, shared by all keys.
GGUFValue read_value(Cursor& c, GGUFValueType type, const std::string& key, int depth,
                     uint64_t& elements_left) {
  GGUFValue v;
  v.type = type;
  switch (type) {
    case GGUFValueType::UINT8: v.u = c.read<uint8_t>("uint8 value"); v.i = int64_t(v.u); break;
    case GGUFValueType::INT8: v.i = c.read<int8_t>("int8 value"); v.u = uint64_t(v.i); break;
    case GGUFValueType::UINT16: v.u = c.read<uint16_t>("uint16 value"); v.i = int64_t(v.u); break;
    case GGUFValueType::INT16: v.i = c.read<int16_t>("int16 value"); v.u = uint64_t(v.i); break;
    case GGUFValueType::UINT32: v.u = c.read<uint32_t>("uint32 value"); v.i = int64_t(v.u); break;
    case GGUFValueType::INT32: v.i = c.read<int32_t>("int32 value"); v.u = uint64_t(v.i); break;
    case GGUFValueType::UINT64: v.u = c.read<uint64_t>("uint64 value"); v.i = int64_t(v.u); break;
    case GGUFValueType::INT64: v.i = c.read<int64_t>("int64 value"); v.u = uint64_t(v.i); break;
    case GGUFValueType::FLOAT32: v.f = c.read<float>("float32 value"); break;
    case GGUFValueType::FLOAT64: v.f = c.read<double>("float64 value"); break;
    case GGUFValueType::BOOL: {
      const uint64_t at = c.pos();
      const uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.error(cat("key '", key, "': bool value ", int(b), " is not 0 or 1"), at);
      v.b = b != 0;
      break;
    }
    case GGUFValueType::STRING: v.str = c.read_string("string value"); break;
    case GGUFValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        c.error(cat("key '", key, "': arrays nested deeper than ", kMaxArrayDepth));
      const uint64_t at = c.pos();
      const uint32_t et = c.read<uint32_t>("array element type");
      if (!valid_value_type(et)) c.error(cat("key '", key, "': invalid array element type ", et), at);
      v.elem_type = GGUFValueType(et);
      const uint64_t n = c.read<uint64_t>("array length");
      if (n > c.remaining() / min_encoded_size(v.elem_type))
        c.error(cat("key '", key, "': array of ", n, " ", value_type_name(v.elem_type),
                    " cannot fit in the ", c.remaining(), " bytes left (file truncated or corrupt)"),
                at);
      if (n > elements_left)
        c.error(cat("key '", key, "': array of ", n, " elements exceeds the limit of ",
                    kMaxArrayElements, " metadata array elements per file (corrupt count?)"),
                at);
      elements_left -= n;
      // Grown as elements parse, not reserved from the (untrusted) count.
      v.array.reserve(size_t(std::min<uint64_t>(n, 4096)));
      for (uint64_t k = 0; k < n; ++k)
        v.array.push_back(read_value(c, v.elem_type, key, depth + 1, elements_left));
      break;
    }
  }
  return v;
}

bool is_signed(GGUFValueType t) {
  return t == GGUFValueType::INT8 || t == GGUFValueType::INT16 || t == GGUFValueType::INT32 ||
         t == GGUFValueType::INT64;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

std::unique_ptr<GGUFFile> GGUFFile::open(const std::string& path) {
  // (O_NONBLOCK: opening a FIFO would otherwise wait for a writer, a server thread with it, as
  // POST /v1/load_lora_adapter names any path; it is refused below, not being a regular file.)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < 24) {
    ::close(fd);
    fail(path, ": file truncated or not GGUF: ", size, " bytes, the header alone is 24");
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (map == MAP_FAILED) fail(path, ": mmap failed: ", std::strerror(e));
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(map);
  f->size_ = size;
  f->mapping_ = map;
  f->parse_all();
  return f;
}

std::unique_ptr<GGUFFile> GGUFFile::parse(const uint8_t* bytes, uint64_t size, std::string name) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = std::move(name);
  f->base_ = bytes;
  f->size_ = size;
  f->parse_all();
  return f;
}

GGUFFile::~GGUFFile() {
  if (mapping_) munmap(mapping_, size_);
}

void GGUFFile::parse_all() {
  Cursor c(base_, size_, path_);
  c.need(4, "magic");
  if (std::memcmp(base_, "GGUF", 4) != 0) {
    std::string got;
    for (int k = 0; k < 4; ++k) {
      const unsigned char ch = base_[k];
      got += (ch >= 32 && ch < 127) ? std::string(1, char(ch)) : cat("\\x", std::hex, int(ch));
    }
    c.error(cat("bad magic '", got, "', expected 'GGUF' (not a GGUF file)"), 0);
  }
  c.read<uint32_t>("magic");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    c.error(cat("unsupported GGUF version ", version_, " (supported: 2, 3)"), 4);
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each metadata entry takes >= 13 bytes (key length, type, 1-byte value), each tensor info
  // >= 28 bytes; absurd counts are rejected before anything is allocated.
  if (n_kv > c.remaining() / 13)
    c.error(cat("metadata count ", n_kv, " cannot fit in a file of ", size_,
                " bytes (file truncated or corrupt)"),
            16);
  if (n_tensors > c.remaining() / 28)
    c.error(cat("tensor count ", n_tensors, " cannot fit in a file of ", size_,
                " bytes (file truncated or corrupt)"),
            8);

  // Counts are only bounded by the file size here: reserve a little, grow as entries parse.
  kv_.reserve(size_t(std::min<uint64_t>(n_kv, 4096)));
  uint64_t elements_left = kMaxArrayElements;
  std::unordered_set<std::string> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos();
    std::string key = c.read_string("metadata key");
    if (key.empty()) c.error(cat("metadata entry ", k, " has an empty key"), at);
    if (!keys.insert(key).second) c.error(cat("duplicate metadata key '", key, "'"), at);
    const uint64_t type_at = c.pos();
    const uint32_t t = c.read<uint32_t>("metadata value type");
    if (!valid_value_type(t)) c.error(cat("key '", key, "': invalid value type ", t), type_at);
    GGUFValue v = read_value(c, GGUFValueType(t), key, 0, elements_left);
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GGUFValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->type != GGUFValueType::UINT32)
      fail(path_, ": key 'general.alignment': expected uint32, got ", value_type_name(a->type));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail(path_, ": key 'general.alignment': ", a->u, " is not a power of two");
    alignment_ = a->u;
  }

  tensors_.reserve(size_t(std::min<uint64_t>(n_tensors, 4096)));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const uint64_t at = c.pos();
    GGUFTensorInfo ti;
    ti.name = c.read_string("tensor name");
    if (!tensor_index_.emplace(ti.name, tensors_.size()).second) c.error(cat("duplicate tensor name '", ti.name, "'"), at);
    const uint64_t dims_at = c.pos();
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.error(cat("tensor '", ti.name, "': ", n_dims, " dimensions (must be 1..", kMaxDims, ")"),
              dims_at);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne_at = c.pos();
      const uint64_t ne = c.read<uint64_t>("tensor dimension");
      if (ne == 0 || ne > uint64_t(std::numeric_limits<int64_t>::max()) ||
          mul_overflows(n_el, ne, &n_el) || n_el > uint64_t(std::numeric_limits<int64_t>::max()))
        c.error(cat("tensor '", ti.name, "': dimension ", d, " = ", ne, " is zero or too large"),
                ne_at);
      ti.ne.push_back(ne);
    }
    const uint64_t type_at = c.pos();
    const uint32_t type = c.read<uint32_t>("tensor type");
    const TypeTraits tr = type_traits(type);
    if (!tr.known || tr.block_size == 0)
      c.error(cat("tensor '", ti.name, "': unknown type id ", type,
                  tr.name == "unknown" ? "" : cat(" (", tr.name, ")")),
              type_at);
    ti.type = GGMLType(type);
    if (ti.ne[0] % tr.block_size != 0)
      c.error(cat("tensor '", ti.name, "': row length ", ti.ne[0], " is not a multiple of the ",
                  tr.name, " block size ", tr.block_size),
              dims_at);
    ti.n_elements = n_el;
    ti.n_bytes = n_el / tr.block_size * tr.type_size;  // cannot overflow: type_size <= block bytes
    if (n_el / tr.block_size > std::numeric_limits<uint64_t>::max() / tr.type_size)
      c.error(cat("tensor '", ti.name, "': byte size overflows"), dims_at);
    const uint64_t off_at = c.pos();
    ti.offset = c.read<uint64_t>("tensor data offset");
    if (ti.offset % alignment_ != 0)
      c.error(cat("tensor '", ti.name, "': data offset ", ti.offset, " is not a multiple of the alignment ",
                  alignment_),
              off_at);
    tensors_.push_back(std::move(ti));
  }

  // Data section: after the header, padded to the alignment.
  uint64_t data_start = c.pos();
  if (data_start % alignment_ != 0) data_start += alignment_ - data_start % alignment_;
  if (!tensors_.empty() && data_start > size_)
    fail(path_, ": file truncated: the tensor data section would start at byte ", data_start,
         " but the file has ", size_, " bytes");
  const uint64_t data_size = data_start <= size_ ? size_ - data_start : 0;
  for (auto& ti : tensors_) {
    // Reported as offset + size (not absolute bytes): a corrupt offset may overflow a sum.
    if (ti.offset > data_size || ti.n_bytes > data_size - ti.offset)
      fail(path_, ": tensor '", ti.name, "': data at offset ", ti.offset, " (", ti.n_bytes,
           " bytes) of the data section starting at byte ", data_start,
           " extends past the end of the file (", size_, " bytes; file truncated or corrupt)");
    ti.data = base_ + data_start + ti.offset;
  }
  // No two tensors' bytes overlap (llama.cpp requires each at the running padded total; any
  // disjoint layout reads the same here): overlapping ones would each be packed apart, so a
  // small file could load into memory many times its size.
  std::vector<const GGUFTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& ti : tensors_) by_offset.push_back(&ti);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GGUFTensorInfo &a = *by_offset[k - 1], &b = *by_offset[k];
    if (a.n_bytes > b.offset - a.offset)  // (a.offset <= b.offset; both within the file, checked above)
      fail(path_, ": tensors '", a.name, "' (offset ", a.offset, ", ", a.n_bytes, " bytes) and '", b.name,
           "' (offset ", b.offset, ") overlap (file corrupt)");
  }
}

const GGUFValue* GGUFFile::find(std::string_view key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return &v;
  return nullptr;
}

const GGUFTensorInfo* GGUFFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
[[noreturn]] void wrong_type(const std::string& file, std::string_view key, const char* expected,
                             const GGUFValue& v) {
  std::string got(value_type_name(v.type));
  if (v.type == GGUFValueType::ARRAY) got += cat(" of ", value_type_name(v.elem_type));
  fail(file, ": key '", key, "': expected ", expected, ", got ", got);
}
}  // namespace

uint64_t GGUFFile::get_u64(std::string_view key, uint64_t dflt) const {
  const GGUFValue* v = find(key);
  if (!v) return dflt;
  if (!v->is_integer()) wrong_type(path_, key, "an integer", *v);
  if (v->i < 0 && is_signed(v->type))
    fail(path_, ": key '", key, "': negative value ", v->i);
  return v->u;
}

uint64_t GGUFFile::require_u64(std::string_view key) const {
  if (!find(key)) fail(path_, ": missing required key '", key, "'");
  return get_u64(key, 0);
}

int64_t GGUFFile::get_i64(std::string_view key, int64_t dflt) const {
  const GGUFValue* v = find(key);
  if (!v) return dflt;
  if (!v->is_integer()) wrong_type(path_, key, "an integer", *v);
  if (v->type == GGUFValueType::UINT64 && v->u > uint64_t(std::numeric_limits<int64_t>::max()))
    fail(path_, ": key '", key, "': value ", v->u, " out of range");
  return v->i;
}

double GGUFFile::get_f64(std::string_view key, double dflt) const {
  const GGUFValue* v = find(key);
  if (!v) return dflt;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return is_signed(v->type) ? double(v->i) : double(v->u);
  wrong_type(path_, key, "a number", *v);
}

bool GGUFFile::get_bool(std::string_view key, bool dflt) const {
  const GGUFValue* v = find(key);
  if (!v) return dflt;
  if (v->type != GGUFValueType::BOOL) wrong_type(path_, key, "bool", *v);
  return v->b;
}

std::string GGUFFile::get_str(std::string_view key, std::string dflt) const {
  const GGUFValue* v = find(key);
  if (!v) return dflt;
  if (v->type != GGUFValueType::STRING) wrong_type(path_, key, "string", *v);
  return v->str;
}

std::string GGUFFile::require_str(std::string_view key) const {
  if (!find(key)) fail(path_, ": missing required key '", key, "'");
  return get_str(key, "");
}

std::vector<std::string> GGUFFile::get_str_array(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) return {};
  if (v->type != GGUFValueType::ARRAY || v->elem_type != GGUFValueType::STRING)
    wrong_type(path_, key, "array of string", *v);
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const auto& e : v->array) out.push_back(e.str);
  return out;
}

std::vector<float> GGUFFile::get_f32_array(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) return {};
  if (v->type != GGUFValueType::ARRAY || !(v->elem_type == GGUFValueType::FLOAT32 ||
                                           v->elem_type == GGUFValueType::FLOAT64))
    wrong_type(path_, key, "array of float32", *v);
  std::vector<float> out;
  out.reserve(v->array.size());
  for (const auto& e : v->array) out.push_back(float(e.f));
  return out;
}

std::vector<int32_t> GGUFFile::get_i32_array(std::string_view key) const {
  const GGUFValue* v = find(key);
  if (!v) return {};
  if (v->type != GGUFValueType::ARRAY) wrong_type(path_, key, "array of int32", *v);
  GGUFValue probe;
  probe.type = v->elem_type;
  if (!probe.is_integer()) wrong_type(path_, key, "array of int32", *v);
  std::vector<int32_t> out;
  out.reserve(v->array.size());
  for (const auto& e : v->array) {
    // A uint64 above INT64_MAX has a negative e.i; judge unsigned types by e.u.
    const bool out_of_range =
        is_signed(e.type) ? (e.i < std::numeric_limits<int32_t>::min() ||
                             e.i > std::numeric_limits<int32_t>::max())
                          : e.u > uint64_t(std::numeric_limits<int32_t>::max());
    if (out_of_range)
      fail(path_, ": key '", key, "': element ",
           is_signed(e.type) ? cat(e.i) : cat(e.u), " out of int32 range");
    out.push_back(int32_t(e.i));
  }
  return out;
}

}  // namespace ft
