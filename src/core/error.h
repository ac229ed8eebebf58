// Error type and helpers shared by every module.
#pragma once
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ft {

// Every user-facing failure (bad file, bad request, unsupported feature) is an Error whose
// message says what is wrong and where; the CLI prints it and exits 1.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An Error the request's own input caused where it could be seen only while serving it (a
// grammar too ambiguous to follow at some point of the output): a server answers it as a client
// error (400), not as its own failure.
struct RequestError : Error {
  using Error::Error;
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

// How the CLI says an Error on stderr, flushed (also each rank of a multi-process job, before the
// barrier after which any may exit: mpirun ends the others at the first non-zero exit).
inline void say_error(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "firsttoken: error: %s\n", what.c_str());
  std::fflush(stderr);
}

}  // namespace ft
