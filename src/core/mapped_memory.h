// Anonymous memory straight from mmap, advised onto transparent huge pages (2 MiB) where the
// kernel allows (THP mode "madvise" or "always"): for what the compute streams (the KV arena,
// the forward pass's activations), where 4 KiB pages cost a TLB miss per page. Zero-filled,
// move-only. FT_HUGE_PAGES=0 in the environment withholds the advice (to measure its effect).
#pragma once
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ft {

// Whether huge-page advice is wanted (FT_HUGE_PAGES unset or not "0").
inline bool huge_pages_wanted() {
  static const bool wanted = [] {
    const char* e = std::getenv("FT_HUGE_PAGES");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return wanted;
}

class MappedMemory {
 public:
  MappedMemory() = default;
  // what names the memory in the error when the OS refuses it.
  MappedMemory(uint64_t bytes, std::string_view what) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail(what, ": cannot map ", bytes, " bytes: ", std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
#ifdef MADV_HUGEPAGE
    huge_pages_ = huge_pages_wanted() && madvise(p, size_t(bytes), MADV_HUGEPAGE) == 0;  // (advice)
#endif
  }
  MappedMemory(MappedMemory&& o) noexcept { swap(o); }
  MappedMemory& operator=(MappedMemory&& o) noexcept {
    MappedMemory(std::move(o)).swap(*this);
    return *this;
  }
  ~MappedMemory() {
    if (data_) munmap(data_, size_t(bytes_));
  }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return bytes_; }
  bool huge_pages() const { return huge_pages_; }  // the kernel took the advice

 private:
  void swap(MappedMemory& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(huge_pages_, o.huge_pages_);
  }
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  bool huge_pages_ = false;
};

}  // namespace ft
