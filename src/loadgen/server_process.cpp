#include "loadgen/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "loadgen/loadgen.h"
#include "core/error.h"

extern char** environ;

namespace ft::loadgen {

using Clock = std::chrono::steady_clock;

std::string self_exe() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cannot resolve /proc/self/exe: ", ec.message());
  return p.string();
}

std::string file_tail(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  return s.size() > n ? s.substr(s.size() - n) : s;
}

ServerProcess::ServerProcess(const std::string& exe, const std::vector<std::string>& args,
                             const std::string& log_path, double ready_timeout_s)
    : log_path_(log_path) {
  std::vector<std::string> argv_s = {exe, "serve", "--port", "0"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  const int rc = posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) fail("cannot start ", exe, ": ", std::strerror(rc));

  const auto deadline = Clock::now() + std::chrono::duration<double>(ready_timeout_s);
  const std::string marker = "listening on http://";
  try {
    while (port_ == 0) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        fail("the server exited before listening; its log (", log_path, "):\n", file_tail(log_path));
      }
      const std::string log = file_tail(log_path, 1 << 20);
      const size_t at = log.find(marker);
      if (at != std::string::npos) {
        const size_t colon = log.find(':', at + marker.size());
        const size_t eol = log.find('\n', at);
        if (colon != std::string::npos && eol != std::string::npos && colon < eol)
          port_ = std::atoi(log.substr(colon + 1, eol - colon - 1).c_str());
      }
      if (port_ == 0) {
        if (Clock::now() > deadline)
          fail("the server did not start listening within ", ready_timeout_s, " s; its log (", log_path, "):\n",
               file_tail(log_path));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    const ServerUrl url = parse_url(this->url());
    for (;;) {
      try {
        if (http_request(url, "GET", "/health", "", 5).status == 200) break;
      } catch (const Error&) {
      }
      if (Clock::now() > deadline) fail("the server at ", this->url(), " did not answer /health in time");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (...) {
    stop(5);
    throw;
  }
}

ServerProcess::~ServerProcess() { stop(); }

int ServerProcess::stop(double grace_s) {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::duration<double>(grace_s);
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || r < 0) break;
    if (Clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace ft::loadgen
