// One listener for both protocols: open a port, accept connections and keep track of them.
#include <memory>
#include <utility>  // before Asio, whose awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "server/server_impl.h"

namespace ft::server {

using error_code = boost::system::error_code;
constexpr int kAcceptRetryMs = 50;

void Server::Impl::listen(tcp::acceptor& a, const tcp::endpoint& ep, const char* what) {
  error_code ec;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on ", cfg.host, ":", ep.port(), " (", what, "): ", ec.message());
}

void Server::Impl::accept(tcp::acceptor& a, std::shared_ptr<Connection> (*make)(tcp::socket&&, Impl&), Refuse refuse,
                          ListenerStats& stats) {
  a.async_accept(net::make_strand(ioc), [this, &a, make, refuse, &stats](error_code ec, tcp::socket socket) {
    if (!ec) stats.accept_errors = 0;
    if (!ec && stats.open.load() >= cfg.max_connections) {
      ++stats.refused;
      spdlog::debug("port {}: {} connections open (--max-connections); refusing a new one", a.local_endpoint().port(),
                   stats.open.load());
      if (refuse && stats.refusing.load() < cfg.max_connections) {
        refuse(std::move(socket), stats);
      } else {
        error_code close_ec;
        socket.close(close_ec);
      }
    } else if (!ec) {
      error_code opt_ec;
      socket.set_option(tcp::no_delay(true), opt_ec);  // each token's bytes leave at once
      auto c = make(std::move(socket), *this);
      c->held_by(stats);
      {
        std::lock_guard<std::mutex> lk(conn_mu);
        std::erase_if(connections, [](const std::weak_ptr<Connection>& w) { return w.expired(); });
        connections.push_back(c);
      }
      net::post(c->executor(), [c] { c->start(); });
    } else if (ec == net::error::no_descriptors || ec == net::error::no_buffer_space || ec == net::error::no_memory ||
               ec == boost::system::errc::too_many_files_open_in_system) {
      // Out of descriptors (EMFILE, ENFILE) or memory: the next accept fails at once too, so
      // wait a little (a spin logged ~90k lines a second), and say so once per run of failures.
      if (stats.accept_errors++ == 0)
        spdlog::warn("accept failed on port {}: {} (retrying every {} ms until it succeeds)", a.local_endpoint().port(),
                     ec.message(), kAcceptRetryMs);
      auto t = std::make_shared<net::steady_timer>(a.get_executor(), std::chrono::milliseconds(kAcceptRetryMs));
      t->async_wait([this, &a, make, refuse, &stats, t](error_code) {
        if (a.is_open()) accept(a, make, refuse, stats);
      });
      return;
    } else if (ec != net::error::operation_aborted) {
      spdlog::warn("accept failed on port {}: {}", a.local_endpoint().port(), ec.message());  // (one connection's)
    }
    if (a.is_open()) accept(a, make, refuse, stats);
  });
}

void Server::Impl::for_each_connection(void (Connection::*f)()) {
  std::lock_guard<std::mutex> lk(conn_mu);
  for (auto& w : connections)
    if (auto c = w.lock()) net::post(c->executor(), [c, f] { ((*c).*f)(); });
}

}  // namespace ft::server
