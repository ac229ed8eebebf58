// The process-level server: the shared state, the I/O threads, the listeners' start and the
// shutdown sequence. Connections live in http_session.cpp and binary_session.cpp, routes in
// routes.cpp, accepting in listener.cpp.
#include "server/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <spdlog/spdlog.h>
#include <thread>

#include "core/error.h"
#include "profile/trace.h"
#include "server/server_impl.h"

namespace ft::server {

using error_code = boost::system::error_code;

namespace {
thread_local const Tokenizer* t_tok = nullptr;

// TCP Fast Open on a listener: data in the SYN saves a round trip for new connections.
void enable_fast_open(tcp::acceptor& a) {
  const int qlen = 64;
  if (setsockopt(a.native_handle(), IPPROTO_TCP, TCP_FASTOPEN, &qlen, sizeof qlen) != 0) {
    spdlog::warn("TCP_FASTOPEN not available on the listener: {}", std::strerror(errno));
    return;
  }
  int mode = -1;
  std::ifstream("/proc/sys/net/ipv4/tcp_fastopen") >> mode;
  if (mode >= 0 && !(mode & 2))
    spdlog::warn("TCP_FASTOPEN set on the listener but the kernel has server-side TFO off "
                 "(net.ipv4.tcp_fastopen={}; needs bit 2)", mode);
  else
    spdlog::info("TCP_FASTOPEN enabled on the listener");
}
}  // namespace

Pooling resolve_pooling(const std::string& setting, const Model& model) {
  for (Pooling p : {Pooling::Mean, Pooling::Cls, Pooling::Last})
    if (setting == pooling_name(p)) return p;
  if (setting != "auto") fail("--pooling must be auto, mean, cls or last, got '", setting, "'");
  const std::string key = model.hparams().arch_name + ".pooling_type";
  switch (const int64_t t = model.file().get_i64(key, 3)) {
    case 1: return Pooling::Mean;
    case 2: return Pooling::Cls;
    case 3: return Pooling::Last;
    default:  // (none, rank: not an embedding this server makes; generation must not fail for it)
      spdlog::warn("{} = {}: not a pooling this server has (mean 1, cls 2, last 3); /v1/embeddings pools the last "
                   "position (--pooling sets another)", key, t);
      return Pooling::Last;
  }
}

const Tokenizer& io_tokenizer() { return *t_tok; }
void set_io_tokenizer(const Tokenizer* tok) { t_tok = tok; }

Server::Impl::Impl(Engine& e, const ServedModel& m, const ServeConfig& c)
    : engine(e), model(m), cfg(c), gen(e, *m.tokenizer, m.chat), responses(c.max_stored_responses, c.max_stored_bytes, c.max_body_bytes),
      conversations(c.max_stored_responses, c.max_stored_bytes, c.max_body_bytes) {
  info.id = m.id;
  info.aliases = m.aliases;
  info.n_ctx = gen.n_ctx;
  info.n_vocab = gen.n_vocab;
  info.n_embd = m.model ? m.model->hparams().dim : 0;
  gen.pooling = m.pooling;
  gen.grammar_mask_work = m.grammar_mask_work;
  info.has_adapter = [&e](const std::string& name) { return e.adapter_file(name).has_value(); };
  gen.waiting = &waiting;
  gen.max_queue = cfg.max_queue;
  gen.metrics = &metrics;
  gen.emit_span = "http.emit";
}

void Server::Impl::begin_shutdown() {
  if (draining.exchange(true)) {  // a second signal: stop now
    spdlog::warn("second signal: stopping immediately");
    ioc.stop();
    return;
  }
  spdlog::info("shutting down: not accepting; {} connection(s) open; in-flight requests get {:.1f} s to finish",
               n_sessions.load(), cfg.shutdown_timeout_s);
  error_code ec;
  acceptor.close(ec);
  bin_acceptor.close(ec);
  for_each_connection(&Connection::on_shutdown);
  drain_timer.expires_after(secs(cfg.shutdown_timeout_s));
  drain_timer.async_wait([this](error_code e) {
    if (e) return;
    spdlog::warn("shutdown deadline passed: cancelling the requests still running");
    for_each_connection(&Connection::on_deadline);
    background.cancel_for_shutdown();
    hard_timer.expires_after(std::chrono::seconds(3));
    hard_timer.async_wait([this](error_code e2) {
      if (!e2) {
        spdlog::warn("connections still open 3 s after the deadline: closing them");
        ioc.stop();
      }
    });
  });
  signals.async_wait([this](error_code e, int) {
    if (!e) begin_shutdown();
  });
  poll_drained();
}

void Server::Impl::poll_drained() {
  if (n_sessions.load() == 0) {
    spdlog::info("all connections closed; bye");
    ioc.stop();
    return;
  }
  poll_timer.expires_after(std::chrono::milliseconds(20));
  poll_timer.async_wait([this](error_code e) {
    if (!e) poll_drained();
  });
}

Server::Server(Engine& engine, const ServedModel& model, const ServeConfig& cfg)
    : impl_(std::make_unique<Impl>(engine, model, cfg)) {}
Server::~Server() = default;

void Server::stop() {
  Impl* s = impl_.get();
  net::post(s->ctl, [s] { s->begin_shutdown(); });
}
int Server::port() const { return impl_->bound_port.load(); }
int Server::binary_port() const { return impl_->bound_binary_port.load(); }

int Server::run() {
  Impl& s = *impl_;
  error_code ec;
  const auto addr = net::ip::make_address(s.cfg.host, ec);
  if (ec) fail("--host '", s.cfg.host, "' is not an IP address");
  s.listen(s.acceptor, tcp::endpoint(addr, static_cast<unsigned short>(s.cfg.port)), "HTTP");
  enable_fast_open(s.acceptor);
  const auto bound = s.acceptor.local_endpoint();
  spdlog::info("serving model '{}' (context {} tokens) with {} HTTP thread(s), max queue {}", s.info.id, s.info.n_ctx,
               s.cfg.http_threads, s.cfg.max_queue);
  spdlog::info("listening on http://{}:{}", bound.address().to_string(), bound.port());
  spdlog::default_logger()->flush();
  s.bound_port = bound.port();
  if (s.cfg.binary_port > 0 || s.cfg.binary_port_any) {
    s.listen(s.bin_acceptor, tcp::endpoint(addr, static_cast<unsigned short>(s.cfg.binary_port_any ? 0 : s.cfg.binary_port)),
             "--binary-port");
    const auto bb = s.bin_acceptor.local_endpoint();
    s.bound_binary_port = bb.port();
    spdlog::info("binary protocol listening on {}:{}", bb.address().to_string(), bb.port());
    net::post(s.ctl, [&s] { s.accept(s.bin_acceptor, make_binary_session, nullptr, s.metrics.binary); });
  }
  net::post(s.ctl, [&s] { s.accept(s.acceptor, make_http_session, refuse_http, s.metrics.http); });
  s.signals.async_wait([&s](error_code e, int sig) {
    if (!e) {
      spdlog::info("received signal {}", sig);
      s.begin_shutdown();
    }
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, s.cfg.http_threads); ++i)
    threads.emplace_back([&s, i] {
      profile::set_thread_name("http-" + std::to_string(i));
      const Tokenizer local = *s.model.tokenizer;  // this worker's own tokenizer
      set_io_tokenizer(&local);
      // A handler that throws fails its own connection (its handlers, holding it, are gone);
      // the thread logs it and goes on serving the rest.
      for (;;) {
        try {
          s.ioc.run();
          break;
        } catch (const std::exception& e) {
          spdlog::error("I/O handler failed: {}", e.what());
        }
      }
      set_io_tokenizer(nullptr);
    });
  for (auto& t : threads) t.join();
  // Whatever is still outstanding finishes as cancelled; its events are posted to the stopped
  // io_context and destroyed with it. A route's blocking work still running (a LoRA load) fails
  // against the stopped engine ("shutting down"); its answer goes the same way.
  s.engine.shutdown();
  s.blocking.join();
  return 0;
}

}  // namespace ft::server
