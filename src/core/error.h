// Error type and helpers shared by every module.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ft {

// Every user-facing failure (bad file, bad request, unsupported feature) is an Error whose
// message says what is wrong and where; the CLI prints it and exits 1.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

}  // namespace ft
