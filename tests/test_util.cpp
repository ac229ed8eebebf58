#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ft::test {

std::string shared_dir() {
  if (const char* env = std::getenv("FT_SHARED_DIR")) return env;
  return FT_SHARED_DIR;
}

std::string shared_file(const std::string& rel) {
  const std::filesystem::path p = std::filesystem::path(shared_dir()) / rel;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

TempFile::TempFile(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ft_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  path_ = (dir / name).string();
}

TempFile::~TempFile() {
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  std::filesystem::remove(std::filesystem::path(path_).parent_path(), ec);  // only once empty
}

CliResult run_cli(const std::string& binary, const std::string& args) {
  static int calls = 0;
  const std::string err_file = testing::TempDir() + "ft_cli_stderr_" + std::to_string(getpid()) + "_" +
                               std::to_string(++calls) + ".txt";
  const std::string cmd = binary + " " + args + " 2>" + err_file;
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(err_file);
  std::filesystem::remove(err_file);
  return r;
}

// One HTTP request on a fresh connection ("Connection: close"): the whole response.
std::string http_post(int port, const std::string& path, const std::string& body) {
  return http_request(port, "POST", path, body);
}

namespace {
std::string exchange(int port, const std::string& method, const std::string& path, const std::string& body,
                     double timeout_s, const std::function<void()>& on_sent, const std::string& until) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (timeout_s > 0) {
    timeval tv{};
    tv.tv_sec = time_t(timeout_s);
    tv.tv_usec = suseconds_t((timeout_s - double(tv.tv_sec)) * 1e6);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
                          "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t off = 0; off < req.size();) {
    const ssize_t n = ::send(fd, req.data() + off, req.size() - off, 0);
    if (n <= 0) break;
    off += size_t(n);
  }
  if (on_sent) on_sent();
  std::string out;
  char buf[4096];
  for (ssize_t n; (until.empty() || out.find(until) == std::string::npos) && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    out.append(buf, size_t(n));
  ::close(fd);
  return out;
}
}  // namespace

std::string http_request(int port, const std::string& method, const std::string& path, const std::string& body,
                         double timeout_s, const std::function<void()>& on_sent) {
  return exchange(port, method, path, body, timeout_s, on_sent, "");
}

std::string http_request_until(int port, const std::string& method, const std::string& path, const std::string& body,
                               const std::string& until, double timeout_s) {
  return exchange(port, method, path, body, timeout_s, {}, until);
}

}  // namespace ft::test
