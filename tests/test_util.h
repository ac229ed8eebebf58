// Shared helpers for tests: locating ../shared test data with a clean skip when absent.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

namespace ft::test {

// Whether this build runs under ASan or TSan (GCC defines __SANITIZE_*; clang answers
// __has_feature). Loops that only repeat what the Release run checks run fewer rounds there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Directory of the shared test data; FT_SHARED_DIR env overrides the compiled-in default.
std::string shared_dir();
// Full path of a file under shared/, or "" when it does not exist.
std::string shared_file(const std::string& rel);
std::string read_file(const std::string& path);

// Runs `binary args`, stdout and stderr captured apart (stderr through a per-process, per-call
// file: ctest runs test cases as parallel processes).
struct CliResult {
  int exit_code = -1;
  std::string out, err;
};
CliResult run_cli(const std::string& binary, const std::string& args);

// One HTTP POST of a JSON body to localhost:port on a fresh connection ("Connection: close"): the
// whole response, head and body ("" when it cannot connect).
std::string http_post(int port, const std::string& path, const std::string& body);
// The same for any method, giving up after timeout_s seconds without a byte (what came by then;
// 0: never); on_sent runs once the whole request is sent.
std::string http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                         double timeout_s = 0, const std::function<void()>& on_sent = {});
// The same, closing the connection (the client leaving) once what came contains `until`: what
// came by then ("" when it cannot connect).
std::string http_request_until(int port, const std::string& method, const std::string& path, const std::string& body,
                               const std::string& until, double timeout_s = 60);

// A file in a per-process temp directory (ctest runs test cases as parallel processes), removed
// at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& name);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ft::test

// Skips the current test (with the reason) when a shared file is missing.
#define FT_REQUIRE_SHARED(var, rel)                                              \
  const std::string var = ::ft::test::shared_file(rel);                         \
  if (var.empty()) GTEST_SKIP() << "shared test data absent: " << (rel)         \
                                << " (looked in " << ::ft::test::shared_dir() << ")"
