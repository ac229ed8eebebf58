// Our server as a child process, for `bench ablate` and the tests: `EXE serve --port 0 ARGS...`
// with its log in a file; the bound port is read from its "listening on http://HOST:PORT" line,
// then /health is polled. stop(): SIGTERM, wait (SIGKILL after a grace period).
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace ft::loadgen {

class ServerProcess {
 public:
  // Starts `exe serve --port 0 args...` (stdout and stderr to log_path) and waits until it
  // answers /health, at most ready_timeout_s. Throws ft::Error (with the log's tail) when it
  // exits or does not become ready.
  ServerProcess(const std::string& exe, const std::vector<std::string>& args, const std::string& log_path,
                double ready_timeout_s = 180);
  ~ServerProcess();  // stop()
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // SIGTERM, then SIGKILL after grace_s; returns the exit status (-1 if killed by a signal).
  int stop(double grace_s = 30);

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

// The path of the running executable (/proc/self/exe resolved).
std::string self_exe();
// The last n bytes of a file ("" when unreadable).
std::string file_tail(const std::string& path, size_t n = 2000);

}  // namespace ft::loadgen
