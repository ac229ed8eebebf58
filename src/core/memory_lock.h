// mlock with an error that says why: pinning weights in RAM (`--mlock`) so that the OS never
// pages them out (a page fault on a weight read in decode costs a disk read).
#pragma once
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"

namespace ft {

// mlock(p, bytes); throws ft::Error naming what (e.g. "the packed weights"), the OS's reason and,
// when the limit refused it, RLIMIT_MEMLOCK.
inline void lock_memory(const void* p, uint64_t bytes, std::string_view what) {
  if (bytes == 0 || mlock(p, size_t(bytes)) == 0) return;
  const int e = errno;
  std::string why = std::strerror(e);
  if (struct rlimit rl {}; (e == ENOMEM || e == EPERM) && getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
    why += rl.rlim_cur == RLIM_INFINITY ? std::string(" (RLIMIT_MEMLOCK is unlimited)")
                                        : cat(" (RLIMIT_MEMLOCK is ", rl.rlim_cur >> 10, " KiB: raise it with `ulimit -l`)");
  fail("cannot lock ", what, " in RAM (", bytes >> 20, " MiB): ", why);
}

}  // namespace ft
