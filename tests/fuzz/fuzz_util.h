// What the fuzz targets share: a property check that aborts (libFuzzer then saves the input).
#pragma once
#include <cstdio>
#include <cstdlib>

#define FT_FUZZ_CHECK(cond)                                                          \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
