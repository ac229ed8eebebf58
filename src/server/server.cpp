#include "server/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>

#include "core/error.h"
#include "client/binary_proto.h"
#include "profile/trace.h"
#include "server/api.h"
#include "server/metrics.h"

namespace ft::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Each I/O thread's own copy of the tokenizer (set when the thread starts; see Server::run).
thread_local const Tokenizer* t_tok = nullptr;

std::chrono::steady_clock::duration secs(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

class Session;
class BinSession;

struct Server::Impl {
  Engine& engine;
  ServedModel model;
  ServeConfig cfg;
  ModelInfo info;
  std::atomic<int64_t> waiting{0};  // submitted, no token or finish yet
  ServerMetrics metrics;
  GenerationContext gen;
  net::io_context ioc;
  net::strand<net::io_context::executor_type> ctl{net::make_strand(ioc)};  // acceptor + shutdown
  tcp::acceptor acceptor{ctl};
  net::signal_set signals{ctl, SIGINT, SIGTERM};
  net::steady_timer drain_timer{ctl}, hard_timer{ctl}, poll_timer{ctl};
  std::atomic<bool> draining{false};
  std::atomic<int> n_sessions{0};
  std::atomic<uint64_t> next_id{1};
  std::mutex sess_mu;
  std::vector<std::weak_ptr<Session>> sessions;
  std::vector<std::weak_ptr<BinSession>> bin_sessions;  // under sess_mu
  tcp::acceptor bin_acceptor{ctl};                       // the binary protocol (--binary-port)
  std::atomic<int> bound_port{0}, bound_binary_port{0};

  Impl(Engine& e, const ServedModel& m, const ServeConfig& c)
      : engine(e), model(m), cfg(c), gen(e, *m.tokenizer, m.chat_format) {
    info.id = m.id;
    info.n_ctx = e.n_ctx();
    info.n_vocab = m.tokenizer->n_vocab();
    gen.waiting = &waiting;
    gen.max_queue = cfg.max_queue;
    gen.metrics = &metrics;
    gen.emit_span = "http.emit";
  }
  void do_accept();
  void do_accept_binary();
  void begin_shutdown();
  void poll_drained();
  template <class F>
  void for_each_session(F f);
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& s, Server::Impl& srv) : stream_(std::move(s)), srv_(srv) { ++srv_.n_sessions; }
  ~Session() { --srv_.n_sessions; }
  void start() { do_read(); }
  net::any_io_executor executor() { return stream_.get_executor(); }

  // Posted by the server on shutdown: idle connections close now, busy ones after their response.
  void on_shutdown() {
    keep_alive_ = false;
    if (!gen_ && !writing_) close();
  }
  // Posted when the shutdown deadline passes: cancel what is still generating.
  void on_deadline() {
    if (gen_) gen_->cancel_for_shutdown();
  }

 private:
  struct Out {
    std::string data;
    bool end_of_response;
  };

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
    if (ec) return client_gone();
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
    if (ec) return client_gone();
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

  void client_gone() {
    if (gen_) gen_->abandon();
    close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    outq_.clear();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  void send_response(int status, std::string_view type, const std::string& body, std::string_view extra = {}) {
    enqueue(http_response(status, type, body, keep_alive_ && !srv_.draining, extra), true);
  }
  void send_json(const json& j) {
    send_response(200, "application/json", j.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  void send_error(const ApiError& e) {
    if (e.status == 429) {
      srv_.metrics.count_rejected();
      return send_response(e.status, "application/json", error_body(e), "Retry-After: 1\r\n");
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
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    try {
      if (srv_.draining) throw ApiError(503, "the server is shutting down", "", "server_error", "server_shutdown");
      struct Route {
        std::string_view path;
        http::verb method;
      };
      static const Route kRoutes[] = {{"/health", http::verb::get},           {"/v1/models", http::verb::get},
                                      {"/metrics", http::verb::get},          {"/tokenize", http::verb::post},
                                      {"/detokenize", http::verb::post},      {"/v1/completions", http::verb::post},
                                      {"/v1/chat/completions", http::verb::post}};
      const Route* route = nullptr;
      for (const Route& r : kRoutes)
        if (r.path == target) route = &r;
      if (!route) throw ApiError(404, cat("no route for ", target), "", "invalid_request_error", "not_found");
      if (sc.on()) sc.args().s("route", route->path.data());  // a literal: NUL-terminated
      if (req.method() != route->method) {
        srv_.metrics.count_error();
        const ApiError e(405, cat("method ", std::string(req.method_string()), " is not allowed on ", target), "",
                         "invalid_request_error", "method_not_allowed");
        return send_response(405, "application/json", error_body(e),
                             route->method == http::verb::get ? "Allow: GET\r\n" : "Allow: POST\r\n");
      }
      (void)get;
      (void)post;
      if (target == "/health") return send_json({{"status", "ok"}});
      if (target == "/v1/models") return send_json(models());
      if (target == "/metrics")
        return send_response(200, "text/plain; version=0.0.4; charset=utf-8",
                             srv_.metrics.render(srv_.engine.metrics()));
      if (target == "/tokenize") return send_json(tokenize(req.body()));
      if (target == "/detokenize") return send_json(detokenize(req.body()));
      generate(target == "/v1/completions" ? Endpoint::Completions : Endpoint::Chat, req.body());
    } catch (const ApiError& e) {
      send_error(e);
    } catch (const std::exception& e) {
      spdlog::error("internal error on {}: {}", std::string(target), e.what());
      send_error(ApiError(500, cat("internal error: ", e.what()), "", "server_error"));
    }
  }

  json models() const {
    return {{"object", "list"},
            {"data", json::array({{{"id", srv_.info.id},
                                   {"object", "model"},
                                   {"created", int64_t(std::time(nullptr))},
                                   {"owned_by", "firsttoken"},
                                   {"max_model_len", srv_.info.n_ctx}}})}};
  }

  json tokenize(const std::string& body) const {
    const json j = parse_json_object(body);
    for (const auto& [k, v] : j.items())
      if (k != "prompt" && k != "add_special_tokens" && k != "model")
        throw ApiError(400, "Unrecognized request argument supplied: " + k, k);
    if (j.contains("model") && j["model"] != srv_.info.id)
      throw ApiError(400, "The model does not exist", "model", "invalid_request_error", "model_not_found");
    if (!j.contains("prompt") || !j["prompt"].is_string()) throw ApiError(400, "'prompt' must be a string", "prompt");
    bool add_special = true;
    if (j.contains("add_special_tokens")) {
      if (!j["add_special_tokens"].is_boolean())
        throw ApiError(400, "'add_special_tokens' must be a boolean", "add_special_tokens");
      add_special = j["add_special_tokens"].get<bool>();
    }
    const Tokenizer& tok = *t_tok;
    const auto ids = tok.encode(j["prompt"].get<std::string>(), add_special && tok.add_bos_default(), true);
    return {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", srv_.info.n_ctx}};
  }

  json detokenize(const std::string& body) const {
    const json j = parse_json_object(body);
    for (const auto& [k, v] : j.items())
      if (k != "tokens" && k != "model") throw ApiError(400, "Unrecognized request argument supplied: " + k, k);
    if (!j.contains("tokens") || !j["tokens"].is_array())
      throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const json& t : j["tokens"]) {
      if (!t.is_number_integer()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
      ids.push_back(check_token_id(t.get<int64_t>(), srv_.info.n_vocab, "tokens"));
    }
    return {{"prompt", t_tok->decode(ids)}};
  }

  // --- generation -------------------------------------------------------------------------
  // The response of one generation: SSE chunks as its tokens come (stream), or one JSON body.
  class Reply : public GenerationSink {
   public:
    Reply(Session& s, ResponseMeta meta, const ParsedRequest& pr)
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

    Session& s_;  // alive while events are handled: each posted event holds the session
    ResponseMeta meta_;
    bool stream_, include_usage_, logprobs_;
    std::vector<TokenLogprob> lp_;  // not yet sent (streaming) / all of them (not streaming)
    int64_t lp_offset_ = 0;         // completions' text_offset of lp_[0]
    std::string text_;              // not streaming: the whole completion
  };

  void generate(Endpoint kind, const std::string& body) {
    ParsedRequest pr = parse_request(kind, body, srv_.info);
    const uint64_t n = srv_.next_id.fetch_add(1);
    ResponseMeta meta{kind, cat(kind == Endpoint::Chat ? "chatcmpl-" : "cmpl-", std::hex, 0x10000000u + n),
                      int64_t(std::time(nullptr)), srv_.info.id};
    pr.name = meta.id + (kind == Endpoint::Chat ? " chat" : " completion");
    auto reply = std::make_shared<Reply>(*this, std::move(meta), pr);
    gen_ = Generation::start(srv_.gen, *t_tok, std::move(pr), reply,
                             [self = shared_from_this()](std::function<void()> f) { net::post(self->executor(), std::move(f)); });
    reply->start();
    start_watch();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Server::Impl& srv_;
  std::deque<Out> outq_;
  std::string wbuf_;
  bool wend_ = false;
  bool linger_ = false;
  int64_t header_ns_ = 0;  // profiler clock when the request's header was read
  std::string discard_;
  bool writing_ = false, watching_ = false, resume_after_watch_ = false, closed_ = false, keep_alive_ = true;
  std::shared_ptr<Generation> gen_;  // the request being generated on this connection
};

// --- the binary protocol ---------------------------------------------------------------------
// One connection of the binary protocol (client/binary_proto.h, proto/firsttoken.fbs): frames
// are read one after another on the session's strand; a request is validated and tokenized here
// (this I/O thread's tokenizer), submitted to the same engine as HTTP, and answered with a frame
// per token (stream) and a last frame with finish reason, usage and timings. A bad length, a
// frame that fails the FlatBuffers Verifier, or a second request while one is generating closes
// this connection (cancelling its request); nothing else is touched.
class BinSession : public std::enable_shared_from_this<BinSession> {
 public:
  BinSession(tcp::socket&& s, Server::Impl& srv) : sock_(std::move(s)), srv_(srv) { ++srv_.n_sessions; }
  ~BinSession() { --srv_.n_sessions; }
  net::any_io_executor executor() { return sock_.get_executor(); }
  void start() { read_header(); }
  void on_shutdown() {
    draining_ = true;
    if (!gen_ && outq_.empty()) close();
  }
  void on_deadline() {
    if (gen_) gen_->cancel_for_shutdown();
  }

 private:
  // The response of one generation: a frame per token (stream) and the last frame, or the last
  // frame alone with everything.
  class Reply : public GenerationSink {
   public:
    Reply(BinSession& s, bool stream) : s_(s), stream_(stream) {}
    void on_output(Output&& o) override {
      if (!stream_) return append(o);
      proto::Response r;
      r.tokens = std::move(o.tokens);
      r.text = std::move(o.text);
      r.logprobs = std::move(o.logprobs);
      s_.enqueue(proto::encode_response(r));
    }
    void on_finish(Output&& last, const Finish& f) override {
      append(last);
      r_.last = true;
      r_.finish = f.reason;
      r_.prompt_tokens = f.usage.prompt_tokens;
      r_.completion_tokens = f.usage.completion_tokens;
      if (const RequestTimings* t = f.timings)
        r_.timings = {t->tokenize_ms, t->queue_ms(), t->prefill_ms(), t->ttft_ms(), t->decode_ms(), t->total_ms()};
      s_.respond(r_);
    }
    void on_error(const ApiError& e, const Usage& u) override {
      proto::Response r;
      r.last = true;
      r.finish = "cancelled";
      r.error = e.what();
      r.prompt_tokens = u.prompt_tokens;
      r.completion_tokens = u.completion_tokens;
      s_.respond(r);
    }

   private:
    void append(Output& o) {
      r_.tokens.insert(r_.tokens.end(), o.tokens.begin(), o.tokens.end());
      r_.text += o.text;
      for (auto& lp : o.logprobs) r_.logprobs.push_back(std::move(lp));
    }
    BinSession& s_;  // alive while events are handled: each posted event holds the session
    bool stream_;
    proto::Response r_;  // the last frame: what is not yet sent
  };

  void read_header() {
    if (closed_) return;
    net::async_read(sock_, net::buffer(hdr_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_header(ec);
    });
  }
  void on_header(beast::error_code ec) {
    if (ec) return gone();
    const uint32_t n = proto::frame_length(hdr_);
    if (n == 0 || n > srv_.cfg.max_body_bytes) {
      spdlog::warn("binary protocol: bad frame length {} (1 .. {}); closing the connection", n, srv_.cfg.max_body_bytes);
      return gone();
    }
    body_.resize(n);
    net::async_read(sock_, net::buffer(body_), [self = shared_from_this()](beast::error_code e, size_t) {
      self->on_body(e);
    });
  }
  void on_body(beast::error_code ec) {
    if (ec) return gone();
    if (gen_) {
      spdlog::warn("binary protocol: a request arrived while one is generating; closing the connection");
      return gone();
    }
    profile::Scope sc("bin.parse", "http");  // decode, validate, tokenize, submit
    if (sc.on()) sc.args().i("body_bytes", int64_t(body_.size()));
    proto::Request req;
    if (!proto::decode_request(body_.data(), body_.size(), req)) {
      spdlog::warn("binary protocol: malformed request frame ({} bytes); closing the connection", body_.size());
      return gone();
    }
    try {
      if (srv_.draining) throw ApiError(503, "the server is shutting down");
      generate(std::move(req));
    } catch (const ApiError& e) {
      send_error(e.param.empty() ? std::string(e.what()) : cat(e.param, ": ", e.what()));  // no param field here
    } catch (const std::exception& e) {
      send_error(e.what());
    }
    read_header();  // the next request, or the client leaving (which cancels this one)
  }

  void send_error(const std::string& msg) {
    proto::Response r;
    r.last = true;
    r.finish = "error";
    r.error = msg;
    enqueue(proto::encode_response(r));
  }

  void generate(proto::Request req) {
    GenerationRequest g;
    g.prompt_kind = req.tokens.empty() ? PromptKind::Text : PromptKind::Tokens;
    g.prompt_text = std::move(req.text);
    g.add_bos = req.add_bos;
    g.prompt_tokens = std::move(req.tokens);
    g.sampling = req.sampling;
    g.seed_set = req.seed_set;
    g.max_tokens = req.max_tokens;
    g.ignore_eos = req.ignore_eos;
    g.stop = std::move(req.stop);
    g.logprobs = req.logprobs;
    g.name = cat("bin-", std::hex, 0x10000000u + srv_.next_id.fetch_add(1), " binary");
    gen_ = Generation::start(srv_.gen, *t_tok, std::move(g), std::make_shared<Reply>(*this, req.stream),
                             [self = shared_from_this()](std::function<void()> f) { net::post(self->executor(), std::move(f)); });
  }

  // The last frame; the connection is free for the next request.
  void respond(const proto::Response& last) {
    enqueue(proto::encode_response(last));
    gen_.reset();
  }

  void enqueue(std::string frame) {
    if (closed_) return;
    outq_.push_back(std::move(frame));
    if (!writing_) write_next();
  }
  void write_next() {
    if (outq_.empty() || closed_) {
      writing_ = false;
      if (draining_ && !gen_) close();
      return;
    }
    profile::Scope sc("bin.write", "http");
    writing_ = true;
    wbuf_ = std::move(outq_.front());
    outq_.pop_front();
    if (sc.on()) sc.args().i("bytes", int64_t(wbuf_.size()));
    net::async_write(sock_, net::buffer(wbuf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->gone();
      self->write_next();
    });
  }

  // The client left or broke the protocol: cancel its request (its Finished event still comes
  // here and is accounted) and close.
  void gone() {
    if (gen_) gen_->abandon();
    close();
  }
  void close() {
    if (closed_) return;
    closed_ = true;
    outq_.clear();
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }

  tcp::socket sock_;
  Server::Impl& srv_;
  uint8_t hdr_[proto::kFrameHeader] = {};
  std::vector<uint8_t> body_;
  std::deque<std::string> outq_;
  std::string wbuf_;
  bool writing_ = false, closed_ = false, draining_ = false;
  std::shared_ptr<Generation> gen_;
};

template <class F>
void Server::Impl::for_each_session(F f) {
  std::lock_guard<std::mutex> lk(sess_mu);
  for (auto& w : sessions)
    if (auto s = w.lock()) net::post(s->executor(), [s, f] { f(*s); });
  for (auto& w : bin_sessions)
    if (auto s = w.lock()) net::post(s->executor(), [s, f] { f(*s); });
}

void Server::Impl::do_accept_binary() {
  bin_acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!ec) {
      beast::error_code opt_ec;
      socket.set_option(tcp::no_delay(true), opt_ec);  // each token frame leaves at once
      auto s = std::make_shared<BinSession>(std::move(socket), *this);
      {
        std::lock_guard<std::mutex> lk(sess_mu);
        std::erase_if(bin_sessions, [](const std::weak_ptr<BinSession>& w) { return w.expired(); });
        bin_sessions.push_back(s);
      }
      net::post(s->executor(), [s] { s->start(); });
    } else if (ec != net::error::operation_aborted) {
      spdlog::warn("binary protocol: accept failed: {}", ec.message());
    }
    if (bin_acceptor.is_open()) do_accept_binary();
  });
}

void Server::Impl::do_accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (!ec) {
      beast::error_code opt_ec;
      socket.set_option(tcp::no_delay(true), opt_ec);  // each SSE chunk leaves at once
      auto s = std::make_shared<Session>(std::move(socket), *this);
      {
        std::lock_guard<std::mutex> lk(sess_mu);
        std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
        sessions.push_back(s);
      }
      net::post(s->executor(), [s] { s->start(); });
    } else if (ec != net::error::operation_aborted) {
      spdlog::warn("accept failed: {}", ec.message());
    }
    if (acceptor.is_open()) do_accept();
  });
}

void Server::Impl::begin_shutdown() {
  if (draining.exchange(true)) {  // a second signal: stop now
    spdlog::warn("second signal: stopping immediately");
    ioc.stop();
    return;
  }
  spdlog::info("shutting down: not accepting; {} connection(s) open; in-flight requests get {:.1f} s to finish",
               n_sessions.load(), cfg.shutdown_timeout_s);
  beast::error_code ec;
  acceptor.close(ec);
  bin_acceptor.close(ec);
  for_each_session([](auto& s) { s.on_shutdown(); });
  drain_timer.expires_after(secs(cfg.shutdown_timeout_s));
  drain_timer.async_wait([this](beast::error_code e) {
    if (e) return;
    spdlog::warn("shutdown deadline passed: cancelling the requests still running");
    for_each_session([](auto& s) { s.on_deadline(); });
    hard_timer.expires_after(std::chrono::seconds(3));
    hard_timer.async_wait([this](beast::error_code e2) {
      if (!e2) {
        spdlog::warn("connections still open 3 s after the deadline: closing them");
        ioc.stop();
      }
    });
  });
  signals.async_wait([this](beast::error_code e, int) {
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
  poll_timer.async_wait([this](beast::error_code e) {
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
  beast::error_code ec;
  const auto addr = net::ip::make_address(s.cfg.host, ec);
  if (ec) fail("--host '", s.cfg.host, "' is not an IP address");
  const tcp::endpoint ep(addr, static_cast<unsigned short>(s.cfg.port));
  s.acceptor.open(ep.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(ep, ec);
  if (ec) fail("cannot bind ", s.cfg.host, ":", s.cfg.port, ": ", ec.message());
  // TCP Fast Open on the listener: data in the SYN saves a round trip for new connections.
  {
    const int qlen = 64;
    if (setsockopt(s.acceptor.native_handle(), IPPROTO_TCP, TCP_FASTOPEN, &qlen, sizeof qlen) != 0) {
      spdlog::warn("TCP_FASTOPEN not available on the listener: {}", std::strerror(errno));
    } else {
      int mode = -1;
      std::ifstream("/proc/sys/net/ipv4/tcp_fastopen") >> mode;
      if (mode >= 0 && !(mode & 2))
        spdlog::warn("TCP_FASTOPEN set on the listener but the kernel has server-side TFO off "
                     "(net.ipv4.tcp_fastopen={}; needs bit 2)", mode);
      else
        spdlog::info("TCP_FASTOPEN enabled on the listener");
    }
  }
  s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on ", s.cfg.host, ":", s.cfg.port, ": ", ec.message());
  const auto bound = s.acceptor.local_endpoint();
  spdlog::info("serving model '{}' (context {} tokens) with {} HTTP thread(s), max queue {}", s.info.id, s.info.n_ctx,
               s.cfg.http_threads, s.cfg.max_queue);
  spdlog::info("listening on http://{}:{}", bound.address().to_string(), bound.port());
  spdlog::default_logger()->flush();

  s.bound_port = bound.port();
  if (s.cfg.binary_port > 0 || s.cfg.binary_port_any) {
    const tcp::endpoint bep(addr, static_cast<unsigned short>(s.cfg.binary_port_any ? 0 : s.cfg.binary_port));
    s.bin_acceptor.open(bep.protocol(), ec);
    if (!ec) s.bin_acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) s.bin_acceptor.bind(bep, ec);
    if (!ec) s.bin_acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) fail("cannot listen on ", s.cfg.host, ":", bep.port(), " (--binary-port): ", ec.message());
    const auto bb = s.bin_acceptor.local_endpoint();
    s.bound_binary_port = bb.port();
    spdlog::info("binary protocol listening on {}:{}", bb.address().to_string(), bb.port());
    net::post(s.ctl, [&s] { s.do_accept_binary(); });
  }
  net::post(s.ctl, [&s] { s.do_accept(); });
  s.signals.async_wait([&s](beast::error_code e, int sig) {
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
      t_tok = &local;
      s.ioc.run();
      t_tok = nullptr;
    });
  for (auto& t : threads) t.join();
  // Whatever is still outstanding finishes as cancelled; its events are posted to the stopped
  // io_context and destroyed with it.
  s.engine.shutdown();
  return 0;
}

}  // namespace ft::server
