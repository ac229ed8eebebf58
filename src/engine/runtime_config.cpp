#include "engine/runtime_config.h"

#include <thread>

namespace ft {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? int(hw) : 1;
}

}  // namespace ft
