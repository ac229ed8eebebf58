#include "client/binary_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace ft::client {

BinaryClient::BinaryClient(const std::string& host, int port, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    fail("cannot resolve ", host, ": ", gai_strerror(rc));
  // timeout_s bounds connect() too: Linux's blocking connect waits at most SO_SNDTIMEO (an address
  // that drops SYNs: ~2 min of the kernel's retries otherwise).
  timeval tv{};
  if (timeout_s > 0) {
    const double t = std::min(timeout_s, 1e9);  // (NaN: none)
    tv.tv_sec = time_t(t);
    tv.tv_usec = suseconds_t((t - double(tv.tv_sec)) * 1e6);
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;  // (0 would mean none)
  }
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (timeout_s > 0) {
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      fd_ = fd;
      break;
    }
    why = errno == EINPROGRESS || errno == EAGAIN ? "timed out" : std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (fd_ < 0) fail("cannot connect to ", host, ":", port, ": ", why);
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // requests leave at once
}

BinaryClient::~BinaryClient() {
  if (fd_ >= 0) ::close(fd_);
}

void BinaryClient::send_raw(std::string_view bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("binary protocol: send failed: ", std::strerror(errno));
    off += size_t(n);
  }
}

bool BinaryClient::read_exact(void* p, size_t n) {
  auto* out = static_cast<char*>(p);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd_, out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) fail("binary protocol: read timed out");
    if (r < 0 && errno == ECONNRESET && got == 0) return false;
    if (r < 0) fail("binary protocol: read failed: ", std::strerror(errno));
    if (r == 0) {
      if (got == 0) return false;
      fail("binary protocol: the connection closed mid-frame");
    }
    got += size_t(r);
  }
  return true;
}

bool BinaryClient::read_frame(proto::Response& out) {
  uint8_t h[proto::kFrameHeader];
  if (!read_exact(h, sizeof h)) return false;
  const uint32_t n = proto::frame_length(h);
  if (n == 0 || n > (64u << 20)) fail("binary protocol: bad frame length ", n);
  std::vector<uint8_t> body(n);
  if (!read_exact(body.data(), n)) fail("binary protocol: the connection closed mid-frame");
  if (!proto::decode_response(body.data(), n, out)) fail("binary protocol: malformed response frame");
  return true;
}

proto::Response BinaryClient::generate(const proto::Request& req,
                                       const std::function<void(const proto::Response&)>& on_frame) {
  send_raw(proto::encode_request(req));
  proto::Response r;
  for (;;) {
    if (!read_frame(r)) fail("binary protocol: the server closed the connection");
    if (on_frame) on_frame(r);
    if (r.last) return r;
  }
}

}  // namespace ft::client
