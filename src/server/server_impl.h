// What a server's connections share (Server::Impl), and the interface it drives them through.
// Internal to src/server: the HTTP session (http_session.cpp), the binary session
// (binary_session.cpp), the route table (routes.cpp), the listener (listener.cpp) and the
// process-level server (server.cpp).
#pragma once
#include <atomic>
#include <utility>  // before Asio, whose awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <vector>

#include "server/api.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/server.h"

namespace ft::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// A client connection, HTTP or binary, as the server sees it.
class Connection {
 public:
  virtual ~Connection() {
    if (listener_) --listener_->open;
  }
  virtual void start() = 0;
  virtual net::any_io_executor executor() = 0;
  virtual void on_shutdown() = 0;  // stop taking requests: idle now, busy after their response
  virtual void on_deadline() = 0;  // the shutdown deadline passed: cancel what still generates
  // The listener that accepted it: counts it open until it is destroyed (listener.cpp).
  void held_by(ListenerStats& l) {
    listener_ = &l;
    ++l.open;
  }

 private:
  ListenerStats* listener_ = nullptr;
};
// Bytes a connection may queue behind its write in progress: a client that falls further behind
// its streamed response is closed and its request cancelled (a client that did not read held a
// stream's every byte until the write timeout: ~7 MB/s of SSE with n = 128 and logprobs).
inline constexpr size_t kMaxOutputBacklog = size_t(16) << 20;

// What both protocols' connections share: the server, the generation in progress, the queue of
// writes (Out: one queued write), and closing.
template <class Out>
class Session : public Connection {
 public:
  explicit Session(Server::Impl& srv);
  ~Session() override;
  void on_deadline() final {
    for (const auto& g : gens_) g->cancel_for_shutdown();
  }

 protected:
  // The client left or broke the protocol: cancel its request (its Finished event is still
  // accounted) and close.
  void gone() {
    abandon_all();
    close();
  }
  // Every generation of the request is cancelled; their sinks hear nothing more.
  void abandon_all() {
    for (const auto& g : gens_) g->abandon();
  }
  void close() {
    if (closed_) return;
    closed_ = true;
    outq_.clear();
    close_transport();
  }
  virtual void close_transport() = 0;  // shut the socket down both ways and close it
  // Counts `bytes` about to be queued; false when they would queue behind a backlog past
  // kMaxOutputBacklog (one item alone may be larger: a held response's body, written at once;
  // nor does what a choice's end sends count, under a Flush: held text and logprobs, which the
  // request's admission bounded, all at once, not a client falling behind).
  bool backlog_allows(size_t bytes) {
    if (!writing_ || flushing_) return true;
    backlog_ += bytes;
    return outq_.empty() || backlog_ <= kMaxOutputBacklog;
  }

  Server::Impl& srv_;
  // The request generating on this connection: one generation per prompt (a batched completions
  // request has several), none between requests.
  std::vector<std::shared_ptr<Generation>> gens_;
  std::deque<Out> outq_;
  std::string wbuf_;
  size_t backlog_ = 0;  // bytes queued behind the write in progress (write_next takes them off)
  bool flushing_ = false;
  struct Flush {  // while a sink sends a choice's end
    explicit Flush(Session& s) : s_(s) { s_.flushing_ = true; }
    ~Flush() { s_.flushing_ = false; }
    Flush(const Flush&) = delete;
    Flush& operator=(const Flush&) = delete;
    Session& s_;
  };
  bool writing_ = false, closed_ = false;
};

std::shared_ptr<Connection> make_http_session(tcp::socket&& s, Server::Impl& srv);
std::shared_ptr<Connection> make_binary_session(tcp::socket&& s, Server::Impl& srv);
// A connection over --max-connections: 503 + Retry-After, then closed (bounded in time; held
// in stats.refusing until then).
void refuse_http(tcp::socket&& s, ListenerStats& stats);

// This I/O thread's own copy of the tokenizer (set while the thread runs; see Server::run).
const Tokenizer& io_tokenizer();
void set_io_tokenizer(const Tokenizer* tok);

inline std::chrono::steady_clock::duration secs(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// Runs f on c's strand, holding c until it has run: how engine events reach a session (the
// engine drops its callback after the last event, so the posted work must hold c itself).
template <class C>
Post post_to(const std::shared_ptr<C>& c) {
  return [c](std::function<void()> f) { net::post(c->executor(), [c, f = std::move(f)] { f(); }); };
}

// The Responses API's background responses still generating (background: true): what POST
// /v1/responses/{id}/cancel, DELETE and the shutdown deadline reach. Each counts in `open` (the
// server's n_sessions) while it runs, so that a drain waits for it as for a connection's request.
class BackgroundRuns {
 public:
  explicit BackgroundRuns(std::atomic<int>& open) : open_(open) {}
  // Before its generation starts (whose end may come before start() returns); ex: where its
  // generation's events run, and so its methods.
  void add(const std::string& id, net::any_io_executor ex) {
    const std::lock_guard lock(mu_);
    if (runs_.emplace(id, Run{std::move(ex), {}}).second) ++open_;
  }
  // Its generation, started (cancelled meanwhile: told to stop now).
  void started(const std::string& id, const std::shared_ptr<Generation>& g, const net::any_io_executor& ex) {
    {
      const std::lock_guard lock(mu_);
      if (const auto it = runs_.find(id); it != runs_.end()) {
        it->second.gen = g;
        return;
      }
    }
    net::post(ex, [g] { g->cancel(); });
  }
  // Its end (finished, failed, or never started): false when it was no longer running (cancelled).
  bool end(const std::string& id) {
    const std::lock_guard lock(mu_);
    if (!runs_.erase(id)) return false;
    --open_;
    return true;
  }
  // Stops id's run (its generation's cancel(), on its executor); false when none runs.
  bool cancel(const std::string& id) {
    Run r;
    {
      const std::lock_guard lock(mu_);
      const auto it = runs_.find(id);
      if (it == runs_.end()) return false;
      r = std::move(it->second);
      runs_.erase(it);
      --open_;
    }
    net::post(r.ex, [g = r.gen] {
      if (const auto p = g.lock()) p->cancel();
    });
    return true;
  }
  // The shutdown deadline: every run's generation cancel_for_shutdown()s (each then ends, failed).
  void cancel_for_shutdown() {
    const std::lock_guard lock(mu_);
    for (const auto& [id, r] : runs_)
      net::post(r.ex, [g = r.gen] {
        if (const auto p = g.lock()) p->cancel_for_shutdown();
      });
  }

 private:
  struct Run {
    net::any_io_executor ex;
    std::weak_ptr<Generation> gen;  // (empty until started)
  };
  std::mutex mu_;
  std::unordered_map<std::string, Run> runs_;
  std::atomic<int>& open_;
};

struct Server::Impl {
  Engine& engine;
  ServedModel model;
  ServeConfig cfg;
  ModelInfo info;
  std::atomic<int64_t> waiting{0};  // submitted, no token or finish yet
  ServerMetrics metrics;
  GenerationContext gen;
  ResponseStore responses;  // the Responses API's stored responses (cfg.max_stored_responses, max_stored_bytes)
  ConversationStore conversations;  // the Conversations API's (the same caps, apart)
  // (Before ioc: handlers destroyed with a stopped ioc destroy their sessions, which count here.)
  std::atomic<int> n_sessions{0};
  std::mutex conn_mu;
  std::vector<std::weak_ptr<Connection>> connections;  // under conn_mu
  net::io_context ioc;
  BackgroundRuns background{n_sessions};  // (after ioc: its executors released before ioc goes)
  net::strand<net::io_context::executor_type> ctl{net::make_strand(ioc)};  // listeners + shutdown
  tcp::acceptor acceptor{ctl};      // HTTP
  tcp::acceptor bin_acceptor{ctl};  // the binary protocol (--binary-port)
  net::signal_set signals{ctl, SIGINT, SIGTERM};
  net::steady_timer drain_timer{ctl}, hard_timer{ctl}, poll_timer{ctl};
  std::atomic<bool> draining{false};
  std::atomic<uint64_t> next_id{1};  // response ids
  std::atomic<int> bound_port{0}, bound_binary_port{0};
  // Where routes' blocking work runs (Responder::answer_later: a LoRA adapter's load), one item
  // at a time, so that no I/O thread waits on a file or the engine. Last: destroyed (joined)
  // first, while what its work uses is still here.
  net::thread_pool blocking{1};

  Impl(Engine& e, const ServedModel& m, const ServeConfig& c);
  // listener.cpp: opens a listener on ep (ft::Error naming `what` when it cannot); accepts
  // connections made by `make` until the listener closes.
  void listen(tcp::acceptor& a, const tcp::endpoint& ep, const char* what);
  // At most cfg.max_connections of its connections are open at once: one more is refused at accept
  // (counted in `stats`) before a session is made for it: `refuse` answers it (HTTP: 503), or it
  // is closed (nullptr, and beyond cfg.max_connections refusals being answered at once).
  using Refuse = void (*)(tcp::socket&&, ListenerStats&);
  void accept(tcp::acceptor& a, std::shared_ptr<Connection> (*make)(tcp::socket&&, Impl&), Refuse refuse,
              ListenerStats& stats);
  void for_each_connection(void (Connection::*f)());
  void begin_shutdown();
  void poll_drained();
};

template <class Out>
Session<Out>::Session(Server::Impl& srv) : srv_(srv) {
  ++srv_.n_sessions;
}
template <class Out>
Session<Out>::~Session() {
  --srv_.n_sessions;
}

}  // namespace ft::server
