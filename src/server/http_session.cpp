#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <ctime>
#include <deque>
#include <optional>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "profile/trace.h"
#include "server/routes.h"
#include "server/server_impl.h"

namespace ft::server {

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;

// The header of every 429 and 503 that says "come back later".
std::string retry_after(const ApiError& e) { return cat("Retry-After: ", e.retry_after_s, "\r\n"); }

// One HTTP/1.1 connection on its own strand: reads a request (header and body under their
// timeouts), routes it (routes.cpp), and writes the answer; a completion goes through the one
// generation path (generation.h) with this connection's Reply as the sink. While a request
// generates, a read stays posted so a client that leaves is noticed and its request cancelled.
struct HttpOut {
  std::string data;
  bool end_of_response;
};

class HttpSession : public Session<HttpOut>, public Responder, public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& s, Server::Impl& srv) : Session(srv), stream_(std::move(s)) {}
  void start() override { do_read(); }
  net::any_io_executor executor() override { return stream_.get_executor(); }

  // Posted by the server on shutdown: idle connections close now, busy ones after their response.
  void on_shutdown() override {
    keep_alive_ = false;
    if (!gen_ && !writing_) close();
  }

 private:

  // --- reading ----------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    if (srv_.draining) return close();
    parser_.emplace();
    parser_->body_limit(srv_.cfg.max_body_bytes);
    parser_->header_limit(16 * 1024);
    stream_.expires_after(secs(srv_.cfg.header_timeout_s));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    if (profile::enabled()) header_ns_ = profile::now_ns();
    const auto& h = parser_->get();
    if (auto it = h.find(http::field::content_length); it != h.end()) {
      uint64_t n = 0;
      try {
        n = std::stoull(std::string(it->value()));
      } catch (...) {
        n = 0;
      }
      if (n > srv_.cfg.max_body_bytes) {
        keep_alive_ = false;  // the unread body makes the connection unusable
        linger_ = true;
        return send_error(ApiError(413, cat("the request body of ", n, " bytes exceeds the limit of ",
                                            srv_.cfg.max_body_bytes, " bytes")));
      }
    }
    if (auto it = h.find(http::field::expect); it != h.end() && beast::iequals(it->value(), "100-continue")) {
      // curl and others wait (1 s) for this before sending a body. Written on the raw socket so
      // the stream's read timeout is untouched; nothing else is being written between requests.
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_.socket(), net::buffer(kContinue),
                       net::bind_executor(stream_.get_executor(), [self = shared_from_this()](beast::error_code, size_t) {}));
    }
    stream_.expires_after(secs(srv_.cfg.body_timeout_s));
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    http::request<http::string_body> req = parser_->release();
    keep_alive_ = req.keep_alive();
    handle(req);
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      keep_alive_ = false;
      linger_ = true;
      return send_error(ApiError(413, cat("the request body exceeds the limit of ", srv_.cfg.max_body_bytes, " bytes")));
    }
    if (ec == http::error::header_limit) {
      keep_alive_ = false;
      return send_error(ApiError(431, "the request headers are too large"));
    }
    if (&ec.category() == &http::make_error_code(http::error::end_of_stream).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      keep_alive_ = false;  // a malformed request line or header
      return send_error(ApiError(400, "malformed HTTP request: " + ec.message()));
    }
    close();  // EOF, timeout, reset, shutdown
  }

  // While a request is generating, a read stays posted so a client that goes away is noticed
  // at once (EOF/reset) and its request cancelled. Bytes that arrive (a pipelined request) are
  // kept in buf_ for the next parse.
  void start_watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.async_read_some(buf_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (ec == net::error::operation_aborted && resume_after_watch_ && !closed_) {
      resume_after_watch_ = false;
      return do_read();
    }
    if (ec) return gone();
    buf_.commit(n);
    if (resume_after_watch_) {
      resume_after_watch_ = false;
      do_read();
    }
  }

  // --- writing ----------------------------------------------------------------------------
  void enqueue(std::string data, bool end_of_response) {
    if (closed_) return;
    outq_.push_back({std::move(data), end_of_response});
    if (!writing_) write_next();
  }

  void write_next() {
    profile::Scope sc("http.write", "http");  // coalescing, and the send the initiation attempts at once
    // Coalesce what is queued up to the end of the response into one write.
    wbuf_.clear();
    wend_ = false;
    while (!outq_.empty() && !wend_) {
      wbuf_ += outq_.front().data;
      wend_ = outq_.front().end_of_response;
      outq_.pop_front();
    }
    writing_ = true;
    if (sc.on()) sc.args().i("bytes", int64_t(wbuf_.size())).i("end", wend_);
    stream_.expires_after(secs(srv_.cfg.write_timeout_s));
    net::async_write(stream_, net::buffer(wbuf_),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (ec) return gone();
    if (wend_) return after_response();
    if (!outq_.empty()) return write_next();
    stream_.expires_never();  // waiting for tokens is not a timeout
  }

  void after_response() {
    gen_.reset();
    if (linger_) return linger_close();
    if (!keep_alive_ || srv_.draining) return close();
    if (!outq_.empty()) return write_next();  // cannot happen: one response at a time
    if (watching_) {
      // The next request may already be in buf_ (pipelined), so do not wait for the watch
      // read: cancel it, and its completion starts the next request's read.
      resume_after_watch_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
    } else {
      do_read();
    }
  }

  // After answering a request whose body was not read (413): send FIN, then read and discard
  // what the client is still sending (bounded in time), so closing does not reset the
  // connection and destroy the response before the client has read it.
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(5));  // the whole linger, not per read
    discard_.resize(64 * 1024);
    linger_read();
  }
  void linger_read() {
    stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code e, size_t) {
      if (e) return self->close();
      self->linger_read();
    });
  }

  void close_transport() override {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  void send_response(int status, std::string_view type, const std::string& body, std::string_view extra = {}) override {
    enqueue(http_response(status, type, body, keep_alive_ && !srv_.draining, extra), true);
  }
  void send_json(const json& j) override {
    send_response(200, "application/json", j.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  void send_error(const ApiError& e) {
    if (e.status == 429) {
      srv_.metrics.count_rejected();
      return send_response(e.status, "application/json", error_body(e), retry_after(e));
    }
    srv_.metrics.count_error();
    send_response(e.status, "application/json", error_body(e));
  }

  // --- routing ----------------------------------------------------------------------------
  void handle(const http::request<http::string_body>& req) {
    // The request's read (header to body, as an arg), routing, parsing, validation, tokenization
    // and submission.
    profile::Scope sc("http.parse", "http");
    if (sc.on())
      sc.args().i("body_bytes", int64_t(req.body().size())).i("read_us", header_ns_ > 0 ? (profile::now_ns() - header_ns_) / 1000 : -1);
    header_ns_ = 0;
    std::string_view target(req.target().data(), req.target().size());
    if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    try {
      if (srv_.draining) throw ApiError(503, "the server is shutting down", "", "server_error", "server_shutdown");
      const Route* route = find_route(target);
      if (!route) throw ApiError(404, cat("no route for ", target), "", "invalid_request_error", "not_found");
      if (sc.on()) sc.args().s("route", route->path.data());
      if (req.method() != route->method) {
        srv_.metrics.count_error();
        const ApiError e(405, cat("method ", std::string(req.method_string()), " is not allowed on ", target), "",
                         "invalid_request_error", "method_not_allowed");
        return send_response(405, "application/json", error_body(e),
                             cat("Allow: ", std::string(http::to_string(route->method)), "\r\n"));
      }
      route->handle(srv_, *this, req.body());
    } catch (const ApiError& e) {
      send_error(e);
    } catch (const std::exception& e) {
      spdlog::error("internal error on {}: {}", std::string(target), e.what());
      send_error(ApiError(500, cat("internal error: ", e.what()), "", "server_error"));
    }
  }

  // --- generation -------------------------------------------------------------------------
  // The response of one generation: SSE chunks as its tokens come (stream), or one JSON body.
  class Reply : public GenerationSink {
   public:
    Reply(HttpSession& s, ResponseMeta meta, const ParsedRequest& pr)
        : s_(s), meta_(std::move(meta)), stream_(pr.stream), include_usage_(pr.include_usage), logprobs_(pr.logprobs >= 0) {}
    void on_output(Output&& o) override {
      add_logprobs(o);
      emit(o.text, false);
    }
    void on_finish(Output&& last, const Finish& f) override {
      add_logprobs(last);
      emit(last.text, true);
      if (stream_) {
        std::string sse = sse_event(stream_chunk(meta_, "", false, f.reason, include_usage_));
        if (include_usage_) sse += sse_event(usage_chunk(meta_, f.usage));
        sse += kSseDone;
        s_.enqueue(http_chunk(sse) + http_chunk(""), true);
      } else {
        s_.send_response(200, "application/json",
                         completion_response(meta_, text_, f.reason, f.usage,
                                             logprobs_ ? logprobs_json(meta_.kind, lp_) : json(nullptr))
                             .dump(-1, ' ', false, json::error_handler_t::replace));
      }
    }
    void on_error(const ApiError& e, const Usage&) override {
      if (!stream_) return s_.send_error(e);
      // The headers are out: an SSE error event, which OpenAI clients raise as APIError.
      s_.enqueue(http_chunk("data: " + error_body(e) + "\n\n" + std::string(kSseDone)) + http_chunk(""), true);
    }
    // The SSE head, and chat's first chunk (the role, empty content), before any token.
    void start() {
      if (!stream_) return;
      std::string head = sse_response_head(s_.keep_alive_ && !s_.srv_.draining);
      if (meta_.kind == Endpoint::Chat)
        head += http_chunk(sse_event(stream_chunk(meta_, "", true, "", include_usage_)));
      s_.enqueue(std::move(head), false);
    }

   private:
    void add_logprobs(const Output& o) {
      const Tokenizer& tok = *s_.srv_.model.tokenizer;  // immutable; decoding reads only
      for (const TokenLogprobs& t : o.logprobs) {
        TokenLogprob x{tok.token_to_piece(t.token), t.logprob, {}};
        for (const auto& [id, lp] : t.top) x.top.emplace_back(tok.token_to_piece(id), lp);
        lp_.push_back(std::move(x));
      }
    }
    // Sends (streaming) or appends text. A streamed chunk carries the logprobs of the tokens since
    // the previous chunk; final: send them even without text (held-back bytes, a stop).
    void emit(const std::string& text, bool final) {
      if (!stream_) {
        text_ += text;
        return;
      }
      if (text.empty() && !(final && !lp_.empty())) return;
      json lp = nullptr;
      if (logprobs_) {
        lp = logprobs_json(meta_.kind, lp_, lp_offset_);
        for (const auto& t : lp_) lp_offset_ += int64_t(t.text.size());
        lp_.clear();
      }
      s_.enqueue(http_chunk(sse_event(stream_chunk(meta_, text, false, "", include_usage_, lp))), false);
    }

    HttpSession& s_;  // alive while events are handled: each posted event holds the session
    ResponseMeta meta_;
    bool stream_, include_usage_, logprobs_;
    std::vector<TokenLogprob> lp_;  // not yet sent (streaming) / all of them (not streaming)
    int64_t lp_offset_ = 0;         // completions' text_offset of lp_[0]
    std::string text_;              // not streaming: the whole completion
  };

  void generate(Endpoint kind, const std::string& body) override {
    ParsedRequest pr = parse_request(kind, body, srv_.info);
    const uint64_t n = srv_.next_id.fetch_add(1);
    ResponseMeta meta{kind, cat(kind == Endpoint::Chat ? "chatcmpl-" : "cmpl-", std::hex, 0x10000000u + n),
                      int64_t(std::time(nullptr)), srv_.info.id};
    pr.name = meta.id + (kind == Endpoint::Chat ? " chat" : " completion");
    auto reply = std::make_shared<Reply>(*this, std::move(meta), pr);
    gen_ = Generation::start(srv_.gen, io_tokenizer(), std::move(pr), reply, post_to(shared_from_this()));
    reply->start();
    start_watch();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool wend_ = false;
  bool linger_ = false;
  int64_t header_ns_ = 0;  // profiler clock when the request's header was read
  std::string discard_;
  bool watching_ = false, resume_after_watch_ = false, keep_alive_ = true;
};

// A connection refused over --max-connections: the 503 goes out at once (its request is never
// read), then FIN, then what the client still sends is read and dropped so that closing does not
// reset the connection before the client has read the answer; all of it within kRefusalTime.
class Refusal : public std::enable_shared_from_this<Refusal> {
 public:
  Refusal(tcp::socket&& s, ListenerStats& stats) : stream_(std::move(s)), stats_(stats) { ++stats_.refusing; }
  ~Refusal() { --stats_.refusing; }
  void start() {
    static const ApiError kError(503, "too many open connections; retry later", "", "server_error", "too_many_connections");
    static const std::string kAnswer = http_response(503, "application/json", error_body(kError), false, retry_after(kError));
    stream_.expires_after(kRefusalTime);  // the whole refusal, not per operation
    net::async_write(stream_, net::buffer(kAnswer), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return;
      beast::error_code sec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, sec);
      self->drain();
    });
  }

 private:
  static constexpr std::chrono::seconds kRefusalTime{2};
  void drain() {
    stream_.async_read_some(net::buffer(buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec) self->drain();
    });
  }
  beast::tcp_stream stream_;
  ListenerStats& stats_;
  char buf_[4096];
};

}  // namespace

void refuse_http(tcp::socket&& s, ListenerStats& stats) {
  std::make_shared<Refusal>(std::move(s), stats)->start();
}

std::shared_ptr<Connection> make_http_session(tcp::socket&& s, Server::Impl& srv) {
  return std::make_shared<HttpSession>(std::move(s), srv);
}

}  // namespace ft::server
