// The Engine calls of server/generation.cpp and the kernel the sampler calls (sampler.cpp), for
// fuzz_api, which links the request parser without the engine or the kernels (see CMakeLists.txt).
// Parsing never submits nor samples: reaching one of these is a bug.
#include <cstdio>
#include <cstdlib>

#include "engine/engine.h"
#include "kernels/kernels.h"

namespace ft {

uint64_t Engine::submit(EngineRequest, EventCallback) {
  std::fputs("engine_stub: Engine::submit reached from the request parser\n", stderr);
  std::abort();
}

void Engine::cancel(uint64_t) {
  std::fputs("engine_stub: Engine::cancel reached from the request parser\n", stderr);
  std::abort();
}

std::shared_ptr<const LoraAdapter> Engine::find_adapter(const std::string&) const {
  std::fputs("engine_stub: Engine::find_adapter reached from the request parser\n", stderr);
  std::abort();
}

void exp_shifted(const float*, int64_t, float, float, float*) {
  std::fputs("engine_stub: exp_shifted (sampling) reached from the request parser\n", stderr);
  std::abort();
}

}  // namespace ft
