// A blocking client of the binary protocol (proto/firsttoken.fbs): one TCP connection
// (TCP_NODELAY), one request at a time; each response frame is handed to a callback as it
// arrives, so a caller sees every token the moment the server sends it.
#pragma once
#include <functional>
#include <string>
#include <string_view>

#include "client/binary_proto.h"

namespace ft::client {

class BinaryClient {
 public:
  // Connects to host:port (an IP address or a name); throws ft::Error when it cannot.
  // timeout_s bounds connecting and each blocking read and write (0 = none).
  BinaryClient(const std::string& host, int port, double timeout_s = 60);
  ~BinaryClient();
  BinaryClient(const BinaryClient&) = delete;
  BinaryClient& operator=(const BinaryClient&) = delete;

  // Sends req and reads frames until the last one, which it returns (its `error` is set when the
  // server refused or failed the request). on_frame sees every frame, the last one included.
  // Throws ft::Error when the connection breaks or a frame is malformed.
  proto::Response generate(const proto::Request& req,
                           const std::function<void(const proto::Response&)>& on_frame = {});

  // Low level (tests, benchmarks): raw bytes out; one frame in (false: the server closed the
  // connection).
  void send_raw(std::string_view bytes);
  bool read_frame(proto::Response& out);

 private:
  bool read_exact(void* p, size_t n);  // false at EOF before the first byte
  int fd_ = -1;
};

}  // namespace ft::client
