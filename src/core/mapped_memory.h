// Anonymous memory straight from mmap, advised onto transparent huge pages (2 MiB) where the
// kernel allows (THP mode "madvise" or "always"): for what the compute streams (the KV arena,
// the forward pass's activations), where 4 KiB pages cost a TLB miss per page. Zero-filled,
// move-only. FT_HUGE_PAGES=0 in the environment withholds the advice, FT_PREFAULT=0 the
// prefaulting (to measure their effect).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace ft {

// Whether the environment variable name is unset or other than "0" (a default-on switch).
inline bool env_switch_on(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::strcmp(e, "0") == 0);
}
// Whether huge-page advice is wanted (FT_HUGE_PAGES unset or not "0").
inline bool huge_pages_wanted() {
  static const bool wanted = env_switch_on("FT_HUGE_PAGES");
  return wanted;
}

class MappedMemory {
 public:
  // Prefault: every page is allocated now rather than at its first write. A first write costs
  // the page's allocation and zeroing there and then: on a KVM guest ~5 ms per 2 MiB huge page,
  // which a request's first chunk paid for each layer's K and V (~130 ms on the 110m shape)
  // until the requests had touched the whole KV arena once. (llama.cpp clears its KV buffer at
  // creation, to the same effect.)
  enum class Prefault { No, Yes };
  MappedMemory() = default;
  // what names the memory in the error when the OS refuses it.
  MappedMemory(uint64_t bytes, std::string_view what, Prefault prefault = Prefault::No) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail(what, ": cannot map ", bytes, " bytes: ", std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
#ifdef MADV_HUGEPAGE
    huge_pages_ = huge_pages_wanted() && madvise(p, size_t(bytes), MADV_HUGEPAGE) == 0;  // (advice)
#endif
    if (prefault == Prefault::Yes) prefault_pages();
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
  // (Not where it would take more than half the free memory: there the pages stay lazy, so an
  // oversized arena cannot get the process killed at start-up by the OOM killer.)
  // FT_PREFAULT=0 in the environment leaves them lazy (to measure the effect).
  void prefault_pages() {
    static const bool wanted = env_switch_on("FT_PREFAULT");
    if (!wanted) return;
    const long page = sysconf(_SC_PAGESIZE), free_pages = sysconf(_SC_AVPHYS_PAGES);
    if (page <= 0 || free_pages <= 0 || bytes_ / uint64_t(page) > uint64_t(free_pages) / 2) return;
#ifdef MADV_POPULATE_WRITE
    if (madvise(data_, size_t(bytes_), MADV_POPULATE_WRITE) == 0 || errno != EINVAL) return;  // (EINVAL: Linux < 5.14)
#endif
    for (uint64_t o = 0; o < bytes_; o += uint64_t(page)) reinterpret_cast<volatile uint8_t*>(data_)[o] = 0;
  }
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
