#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <chrono>
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
  // (buf_ bounded: a body's size is limited by the parser, but not the chunked encoding's own
  // bytes, which an endless chunk extension grew without end.)
  HttpSession(tcp::socket&& s, Server::Impl& srv)
      : Session(srv), stream_(std::move(s)), buf_(srv.cfg.max_body_bytes + kHeaderLimit + 64 * 1024) {}
  void start() override { do_read(); }
  net::any_io_executor executor() override { return stream_.get_executor(); }

  // Posted by the server on shutdown: idle connections close now, busy ones after their response.
  void on_shutdown() override {
    keep_alive_ = false;
    if (gens_.empty() && !writing_ && !answering_ && !following_) close();
  }

 private:

  // --- reading ----------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    if (srv_.draining) return close();
    parser_.emplace();
    headers_.clear();  // an error before handle() (413, 431) carries nothing of the previous request
    anthropic_ = false;
    head_only_ = false;
    parser_->body_limit(srv_.cfg.max_body_bytes);
    parser_->header_limit(kHeaderLimit);
    stream_.expires_after(secs(srv_.cfg.header_timeout_s));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    if (profile::enabled()) header_ns_ = profile::now_ns();
    const auto& h = parser_->get();
    anthropic_ = is_anthropic(h);  // (a 413 below speaks its API)
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
    if (ec == http::error::body_limit || ec == http::error::buffer_overflow) {
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
  // kept in buf_ for the next parse, and the read posted again, as long as buf_ has room (then
  // the client's bytes wait in the socket, and a disconnect is noticed at the next write).
  // No timeout: the stream's read timer would otherwise keep the expiry of the write that was
  // starting (the response's head, write_timeout_s), and close a stream longer than that.
  void start_watch() {
    if (watching_ || closed_ || buf_.size() + kWatchBytes > buf_.max_size()) return;
    watching_ = true;
    stream_.expires_never();  // (the read's timer only, when a write is in progress)
    stream_.async_read_some(buf_.prepare(kWatchBytes),
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
      return do_read();
    }
    if (!gens_.empty() || following_) start_watch();
    if (following_ && !watching_) gone();  // (nothing would hold a follower: a deliberate close)
  }

  // --- writing ----------------------------------------------------------------------------
  void enqueue(std::string data, bool end_of_response) {
    if (closed_) return;
    if (!backlog_allows(data.size())) {
      spdlog::warn("HTTP: the client fell {} bytes behind its response; closing the connection", backlog_);
      return gone();
    }
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
    backlog_ = 0;  // (what was queued is in wbuf_; a response is one write after another)
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
    gens_.clear();
    following_ = false;
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
    std::string r = http_response(status, type, body, keep_alive_ && !srv_.draining, cat(extra, headers_));
    if (head_only_) r.resize(r.size() - body.size());  // (a HEAD response has none; Content-Length stays the GET's)
    enqueue(std::move(r), true);
  }
  void send_json(const json& j) override {
    send_response(200, "application/json", j.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  void send_error(const ApiError& e) {
    if (e.status == 429) {
      srv_.metrics.count_rejected();
      return send_response(e.status, "application/json", body_of(e), retry_after(e));
    }
    srv_.metrics.count_error();
    send_response(e.status, "application/json", body_of(e));
  }
  // A background stream sent again: its events after `after`, then what comes until its end.
  // The log holds this session weakly (a stored response's log outlives the I/O context); the
  // watch read holds it meanwhile, and sees the client leave.
  void follow(const std::shared_ptr<EventLog>& log, int64_t after) override {
    const std::string head = sse_response_head(keep_alive_ && !srv_.draining, headers_);
    if (head_only_) return enqueue(head, true);  // (HEAD: no body, nothing followed)
    const std::weak_ptr<HttpSession> weak = weak_from_this();
    const auto [past, done] = log->follow(after, weak, [weak](const std::string& text, bool end) {
      if (const auto self = weak.lock())
        net::post(self->executor(), [self, text, end] {
          self->enqueue((text.empty() ? std::string() : http_chunk(text)) + (end ? http_chunk("") : std::string()), end);
        });
    });
    enqueue(head + (past.empty() ? std::string() : http_chunk(past)) + (done ? http_chunk("") : std::string()), done);
    if (done) return;
    following_ = true;
    start_watch();
    if (!watching_) gone();  // (nothing would hold a follower: a deliberate close)
  }
  void answer_later(std::function<Answer()> work) override {
    answering_ = true;
    net::post(srv_.blocking, [self = shared_from_this(), ex = executor(), work = std::move(work)] {
      // (the blocking-work thread: work, then back to the connection's strand; nothing escapes)
      std::optional<Answer> a;
      std::optional<ApiError> err;
      try {
        a = work();
      } catch (const ApiError& e) {
        err = e;
      } catch (const std::exception& e) {
        spdlog::error("internal error answering a request: {}", e.what());
        err = ApiError(500, cat("internal error: ", e.what()), "", "server_error");
      } catch (...) {
        err = ApiError(500, "internal error", "", "server_error");
      }
      net::post(ex, [self, a = std::move(a), err = std::move(err)] {
        self->answering_ = false;
        if (err) return self->send_error(*err);
        self->send_response(a->status, a->type, a->body);
      });
    });
  }
  // Whether a request speaks Anthropic's API: /v1/messages*, or any route asked by its clients
  // (they send anthropic-version: GET /v1/models from its SDK), whose errors they parse.
  template <class Header>
  static bool is_anthropic(const Header& h) {
    const std::string_view target(h.target().data(), h.target().size());
    return target.starts_with("/v1/messages") || h.find("anthropic-version") != h.end();
  }
  // An error's body in the current request's API: Anthropic's for its clients (is_anthropic), else OpenAI's.
  std::string body_of(const ApiError& e) const { return anthropic_ ? anthropic_error_body(e) : error_body(e); }

  // --- routing ----------------------------------------------------------------------------
  void handle(const http::request<http::string_body>& req) {
    // The request's read (header to body, as an arg), routing, parsing, validation, tokenization
    // and submission.
    profile::Scope sc("http.parse", "http");
    if (sc.on())
      sc.args().i("body_bytes", int64_t(req.body().size())).i("read_us", header_ns_ > 0 ? (profile::now_ns() - header_ns_) / 1000 : -1);
    header_ns_ = 0;
    std::string_view target(req.target().data(), req.target().size()), query;
    if (auto q = target.find('?'); q != std::string_view::npos) {
      query = target.substr(q + 1);
      target = target.substr(0, q);
    }
    anthropic_ = is_anthropic(req);
    head_only_ = req.method() == http::verb::head;  // a GET route's answer without its body
    const auto header = [&](auto f) {  // (a field, or a name Beast has no field for)
      auto it = req.find(f);
      return it == req.end() ? std::string_view{} : std::string_view(it->value().data(), it->value().size());
    };
    // Headers every response to this request carries: CORS, the echoed X-Request-Id.
    headers_.clear();
    const std::string allow = srv_.cfg.allowed_origins.empty()
                                  ? std::string()
                                  : cors_allow_origin(srv_.cfg.allowed_origins, header(http::field::origin));
    if (!allow.empty()) headers_ = cat("Access-Control-Allow-Origin: ", allow, "\r\nVary: Origin\r\n");
    auto rid = req.find("X-Request-Id");
    request_id_ = rid == req.end() ? "" : request_id(std::string_view(rid->value().data(), rid->value().size()));
    if (!request_id_.empty()) headers_ += cat("X-Request-Id: ", request_id_, "\r\n");
    if (req.method() == http::verb::options && !allow.empty()) {  // a CORS preflight
      const std::string_view want = header(http::field::access_control_request_headers);
      return enqueue(cat("HTTP/1.1 204 No Content\r\nServer: firsttoken\r\nConnection: ",
                         keep_alive_ && !srv_.draining ? "keep-alive" : "close", "\r\n", headers_,
                         "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS\r\nAccess-Control-Allow-Headers: ",
                         want.empty() ? std::string_view("Authorization, Content-Type, X-Request-Id, x-api-key, anthropic-version") : want,
                         "\r\nAccess-Control-Max-Age: 600\r\n\r\n"),
                     true);
    }
    try {
      if (!srv_.cfg.api_key.empty() && target != "/health" && target != "/v1/health" && target != "/metrics" &&
          !authorized(srv_.cfg.api_key, header(http::field::authorization), header("x-api-key")))
        throw ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'", "",
                       "invalid_request_error", "invalid_api_key");
      if (srv_.draining) throw ApiError(503, "the server is shutting down", "", "server_error", "server_shutdown");
      const Route* route = find_route(target, head_only_ ? http::verb::get : req.method());
      if (!route) {
        const std::string allow = route_methods(target);
        if (allow.empty()) throw ApiError(404, cat("no route for ", target), "", "invalid_request_error", "not_found");
        srv_.metrics.count_error();
        const ApiError e(405, cat("method ", std::string(req.method_string()), " is not allowed on ", target), "",
                         "invalid_request_error", "method_not_allowed");
        return send_response(405, "application/json", body_of(e), cat("Allow: ", allow, "\r\n"));
      }
      if (sc.on()) sc.args().s("route", route->path.data());
      const std::string_view tail = route->path.ends_with('*') ? target.substr(route->path.size() - 1) : std::string_view{};
      route->handle(srv_, *this, RouteRequest{req.body(), tail, query});
    } catch (const ApiError& e) {
      send_error(e);
    } catch (const std::exception& e) {
      spdlog::error("internal error on {}: {}", std::string(target), e.what());
      send_error(ApiError(500, cat("internal error: ", e.what()), "", "server_error"));
    }
  }

  // --- generation -------------------------------------------------------------------------
  // A chat's reasoning split for the served model: gpt-oss's harmony channels, R1-style <think>
  // (ServedModel::reasoning; open_reasoning may reopen it), or none.
  static std::optional<ReasoningSplit> reasoning_split(const ServedModel& m) {
    if (m.harmony) return ReasoningSplit(HarmonySplit(/*raw=*/!m.reasoning));
    if (m.reasoning) return ReasoningSplit(false);
    return std::nullopt;
  }
  static HarmonySplit* harmony_of(std::optional<ReasoningSplit>& think) { return think ? think->harmony() : nullptr; }
  // A choice's tool calls at its end, and the content still to give. Streaming: found in what
  // `held` kept back (the text before it went out); else in the whole text, of which `kept` holds
  // what was released (taken).
  static FoundToolCalls finish_calls(std::optional<ToolCallHold>& held, std::string& kept, bool stream, ToolChoice choice,
                                     const std::string& name, const json& tools, bool parallel) {
    const bool released = held && held->released();
    std::string text = held ? held->take() : std::string();
    held.reset();
    if (!stream) text = std::exchange(kept, {}) + text;
    return at_most_one_call(extract_tool_calls(choice, name, tools, text, stream && released), parallel);
  }

  // The response of a request's generations (one per prompt: PromptSink): SSE chunks as their
  // tokens come (stream), or one JSON body once every choice of every prompt has finished.
  class Reply {
   public:
    Reply(HttpSession& s, ResponseMeta meta, const ParsedRequest& pr)
        : s_(s), meta_(std::move(meta)), stream_(pr.stream), include_usage_(pr.include_usage),
          continuous_usage_(pr.include_usage && pr.continuous_usage), logprobs_(pr.logprobs >= 0),
          tool_choice_(pr.tool_choice), parallel_(pr.parallel_tool_calls), tool_name_(pr.tool_name), tools_(pr.tools),
          legacy_functions_(pr.legacy_functions), echo_only_(pr.echo_only),
          echo_alternatives_(pr.logprobs), report_prompt_logprobs_(pr.report_prompt_logprobs),
          tokens_as_ids_(pr.tokens_as_ids), token_ids_(pr.return_token_ids), n_(pr.n),
          usage_(1 + pr.more_texts.size() + pr.more_tokens.size()), prompts_left_(usage_.size()),
          choices_(usage_.size() * size_t(pr.n)), done_(choices_.size()), prompt_logprobs_(usage_.size()),
          prompt_ids_(usage_.size()) {
      if (meta_.kind == Endpoint::Chat)
        for (Choice& c : choices_) c.think = reasoning_split(s.srv_.model);  // (open_reasoning: whether <think> starts open)
      grammar_ = !pr.grammar.empty();
      if (pr.echo) {  // each prompt as the client gave it
        const Tokenizer& tok = *s.srv_.model.tokenizer;
        echo_.push_back(pr.prompt_kind == PromptKind::Text ? pr.prompt_text : tok.decode(pr.prompt_tokens));
        for (const std::string& t : pr.more_texts) echo_.push_back(t);
        for (const std::vector<int32_t>& t : pr.more_tokens) echo_.push_back(tok.decode(t));
      }
    }
    void on_output(int32_t prompt, Output&& o) {
      if (failed_) return;
      o.index += prompt * n_;
      Choice& c = choices_[size_t(o.index)];
      if (!echo_only_) ++c.generated;
      if (echo_only_) drop_generated(o);
      add_logprobs(c, prompt, o);
      add_ids(c, prompt, o);
      emit(c, o.index, think(c, o.index, o.text, false), false);
    }
    void on_finish(int32_t prompt, Output&& last, const Finish& fin) {
      const Flush flush(s_);
      if (failed_) return;
      Finish f = fin;
      if (echo_only_) {  // max_tokens 0: nothing was generated, as far as the client is concerned
        drop_generated(last);
        f.reason = "length";
        f.stop_word.clear();
        f.stop_token = -1;
        f.usage.completion_tokens = 0;
      }
      // The request's usage and last choice: every prompt's.
      usage_[size_t(prompt)] = f.usage;
      if (f.last) --prompts_left_;
      f.last = prompts_left_ == 0;
      f.usage = {};
      for (const Usage& u : usage_) {
        f.usage.prompt_tokens += u.prompt_tokens;
        f.usage.completion_tokens += u.completion_tokens;
        f.usage.cached_tokens += u.cached_tokens;
      }
      f.index += prompt * n_;
      Choice& c = choices_[size_t(f.index)];
      c.generated += int64_t(last.tokens.size());
      add_logprobs(c, prompt, last);
      add_ids(c, prompt, last);
      if (f.reason == "length" && c.think) c.think->cut_short();  // (gpt-oss: an open call is no call)
      emit(c, f.index, think(c, f.index, last.text, true), true);
      // Tool calls: from the whole text, or streaming from what was held back (the text before a
      // call went out as content; a named call's arguments stream).
      std::string reason = f.reason;
      // A named call is finished when its grammar ended the output, not a stop string or token.
      const bool call_ended = reason == "stop" && (tool_choice_ != ToolChoice::Named || (f.stop_word.empty() && f.stop_token < 0));
      json calls = nullptr;
      if (HarmonySplit* h = harmony_of(c.think); h && !c.held && tool_choice_ != ToolChoice::Named) {
        // gpt-oss: its commentary messages to=functions.NAME (auto: a function of the request's).
        FoundToolCalls found = at_most_one_call(harmony_tool_calls(h->take_calls(), tool_choice_, tools_), parallel_);
        if (!found.calls.empty()) {
          calls = tool_calls_json(found.calls, stream_);
          if (reason == "stop") reason = "tool_calls";
        }
        if (!found.content.empty()) emit(c, f.index, found.content, false);
        if (stream_ && !calls.is_null())
          s_.enqueue(http_chunk(sse_event(client_chunk(tool_calls_chunk(meta_, calls, include_usage_, f.index), f.index))), false);
      } else if (tool_choice_ != ToolChoice::None && (!stream_ || tool_choice_ != ToolChoice::Named || c.held)) {
        FoundToolCalls found = finish_calls(c.held, c.text, stream_, tool_choice_, tool_name_, tools_, parallel_);
        if (!found.calls.empty()) {
          calls = tool_calls_json(found.calls, stream_);
          if (call_ended) reason = "tool_calls";
        }
        if (!found.content.empty()) emit(c, f.index, found.content, false);
        if (stream_) send(c, f.index, "", true);  // (the logprobs of tokens whose text was held)
        if (stream_ && !calls.is_null())
          s_.enqueue(http_chunk(sse_event(client_chunk(tool_calls_chunk(meta_, calls, include_usage_, f.index), f.index))), false);
      } else if (tool_choice_ == ToolChoice::Named && call_ended) {
        reason = "tool_calls";
      }
      if (stream_) {
        json chunk = client_chunk(stream_chunk(meta_, "", false, reason, include_usage_, nullptr, f.index), f.index);
        chunk["choices"][0]["stop_reason"] = stop_reason_json(f);
        take_ids(c, prompt, chunk);
        std::string sse = sse_event(chunk);
        if (!f.last) return s_.enqueue(http_chunk(sse), false);
        if (include_usage_) sse += sse_event(usage_chunk(meta_, f.usage));
        sse += kSseDone;
        return s_.enqueue(http_chunk(sse) + http_chunk(""), true);
      }
      done_[size_t(f.index)] =
          completion_choice(meta_.kind, f.index, c.text, reason, logprobs_ ? logprobs_json(meta_.kind, c.lp) : json(nullptr), calls);
      if (legacy_functions_) as_function_call(done_[size_t(f.index)]);
      done_[size_t(f.index)]["stop_reason"] = stop_reason_json(f);
      if (c.think && c.think->reasoned()) done_[size_t(f.index)]["message"]["reasoning_content"] = c.reasoning;
      // vLLM's prompt_logprobs and return_token_ids: completions' per choice, chat's prompt once
      // for the response.
      if (report_prompt_logprobs_ >= 0 && meta_.kind == Endpoint::Completions)
        done_[size_t(f.index)]["prompt_logprobs"] = prompt_logprobs_[size_t(prompt)];
      if (token_ids_) {
        json& choice = done_[size_t(f.index)];
        take_ids(c, prompt, choice);
        if (meta_.kind == Endpoint::Chat) choice.erase("prompt_token_ids");
      }
      if (!f.last) return;
      json body = completion_response(meta_, json(std::move(done_)), f.usage);
      if (report_prompt_logprobs_ >= 0 && meta_.kind == Endpoint::Chat) body["prompt_logprobs"] = prompt_logprobs_[0];
      if (token_ids_ && meta_.kind == Endpoint::Chat) body["prompt_token_ids"] = prompt_ids_[0];
      s_.send_response(200, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
    }
    // A prompt's generation failed: so does the request (the other prompts' are cancelled).
    void on_error(const ApiError& e) {
      if (failed_) return;
      failed_ = true;
      s_.abandon_all();
      if (!stream_) return s_.send_error(e);
      // The headers are out: an SSE error event, which OpenAI clients raise as APIError.
      s_.enqueue(http_chunk("data: " + error_body(e) + "\n\n" + std::string(kSseDone)) + http_chunk(""), true);
    }
    // Each prompt's tokens, once all are prepared (continuous_usage_stats).
    void set_prompt_tokens(std::vector<int64_t> n) { prompt_tokens_ = std::move(n); }
    // Whether the output starts inside the reasoning (Generation::opens_reasoning: the rendered
    // prompt ends with "<think>"), before any output. Under a grammar never: it constrains the
    // output from its first token, so reasoning only where the output writes "<think>" itself.
    void open_reasoning(bool open) {
      for (Choice& c : choices_)
        if (c.think && !c.think->harmony()) c.think.emplace(open && !grammar_);
    }
    // The SSE head, and chat's first chunk per choice (the role, empty content), before any
    // token. Tool calls: required/auto text is held back (auto: what is or may become a call); a
    // named call's arguments stream as they come.
    void start() {
      // (gpt-oss's calls under auto are its own messages: HarmonySplit finds them)
      if (tool_choice_ == ToolChoice::Required || tool_choice_ == ToolChoice::Auto)
        for (Choice& c : choices_)
          if (tool_choice_ == ToolChoice::Required || !harmony_of(c.think)) c.held.emplace(tool_choice_ == ToolChoice::Required);
      if (!stream_) return;
      std::string head = sse_response_head(s_.keep_alive_ && !s_.srv_.draining, s_.headers_);
      if (meta_.kind == Endpoint::Chat)
        for (size_t i = 0; i < choices_.size(); ++i)
          head += http_chunk(sse_event(client_chunk(stream_chunk(meta_, "", true, "", include_usage_, nullptr, int32_t(i)), int32_t(i))));
      s_.enqueue(std::move(head), false);
    }

   private:
    struct Choice {
      std::optional<ToolCallHold> held;  // text held back while it is or may become tool calls
      bool call_started = false;        // streaming a named call: its first delta is out
      bool echoed = false;              // echo: the prompt went out (with its first output)
      std::vector<TokenLogprob> lp;     // not yet sent (streaming) / all of them (not streaming)
      int64_t lp_offset = 0;            // completions' text_offset of lp[0]
      std::string text;                 // not streaming: the whole completion
      std::vector<int32_t> ids;         // return_token_ids: not yet sent (streaming) / all of them
      bool prompt_ids_sent = false;
      std::optional<ReasoningSplit> think;  // a reasoning model's chat (ServedModel::reasoning)
      std::string reasoning;            // not streaming: the whole reasoning
      int64_t generated = 0;            // tokens out so far (continuous_usage_stats)
    };
    static void drop_generated(Output& o) {
      o.text.clear();
      o.tokens.clear();
      o.logprobs.clear();
    }
    // A reasoning model's text (chat, ReasoningSplit): its reasoning streams as delta.reasoning_content
    // (with the logprobs and ids so far) or is kept for message.reasoning_content; returns the
    // content, for emit().
    std::string think(Choice& c, int32_t index, const std::string& text, bool final) {
      if (!c.think) return text;
      ReasoningSplit::Parts parts = c.think->push(text, final);
      if (parts.reasoning.empty()) return std::move(parts.content);
      if (!stream_) {
        c.reasoning += parts.reasoning;
        return std::move(parts.content);
      }
      json chunk = client_chunk(stream_chunk(meta_, "", false, "", include_usage_, take_logprobs(c), index), index);
      chunk["choices"][0]["delta"] = {{"reasoning_content", parts.reasoning}};
      take_ids(c, index / n_, chunk);
      s_.enqueue(http_chunk(sse_event(chunk)), false);
      return std::move(parts.content);
    }
    // A streamed chunk's logprobs: the choice's since the previous chunk (null when not asked).
    json take_logprobs(Choice& c) {
      if (!logprobs_) return nullptr;
      json lp = logprobs_json(meta_.kind, c.lp, c.lp_offset);
      for (const auto& t : c.lp) c.lp_offset += text_offset_length(t.text);
      c.lp.clear();
      return lp;
    }
    // vLLM's return_token_ids: the choice's ids not yet sent, and its prompt's once.
    void add_ids(Choice& c, int32_t prompt, const Output& o) {
      if (!token_ids_) return;
      if (o.prompt_ids && prompt_ids_[size_t(prompt)].empty()) prompt_ids_[size_t(prompt)] = *o.prompt_ids;
      c.ids.insert(c.ids.end(), o.tokens.begin(), o.tokens.end());
    }
    // Moves them into a choice (non-streamed) or a chunk: "token_ids", and "prompt_token_ids" with
    // the choice's first (completions: in the choice; a chat chunk: at its top).
    void take_ids(Choice& c, int32_t prompt, json& into) {
      if (!token_ids_) return;
      json& choice = into.contains("choices") ? into["choices"][0] : into;
      choice["token_ids"] = std::exchange(c.ids, {});
      if (c.prompt_ids_sent) return;
      c.prompt_ids_sent = true;
      (meta_.kind == Endpoint::Chat && into.contains("choices") ? into : choice)["prompt_token_ids"] = prompt_ids_[size_t(prompt)];
    }
    // A token as logprobs name it: its piece, or "token_id:N" (vLLM's return_tokens_as_token_ids).
    std::string token_name(int32_t id) const {
      return tokens_as_ids_ ? cat("token_id:", id) : s_.srv_.model.tokenizer->token_to_piece(id);
    }
    // The choice's logprobs, and with echo on its first output the prompt before its text. A
    // prompt's first output also carries its prompt_logprobs.
    void add_logprobs(Choice& c, int32_t prompt, Output& o) {
      const Tokenizer& tok = *s_.srv_.model.tokenizer;  // immutable; decoding reads only
      if (report_prompt_logprobs_ >= 0 && !o.prompt_logprobs.empty() && prompt_logprobs_[size_t(prompt)].is_null())
        prompt_logprobs_[size_t(prompt)] = vllm_prompt_logprobs(o.prompt_logprobs);
      auto add = [&](const TokenLogprobs& t, size_t alternatives) {
        TokenLogprob x{token_name(t.token), t.logprob, {}};
        for (size_t k = 0; k < std::min(alternatives, t.top.size()); ++k) x.top.emplace_back(token_name(t.top[k].first), t.top[k].second);
        c.lp.push_back(std::move(x));
      };
      if (!echo_.empty() && !c.echoed) {
        c.echoed = true;
        o.text.insert(0, echo_[size_t(prompt)]);
        const size_t first = c.lp.size();
        std::vector<int32_t> ids;
        size_t bytes = 0;
        for (const TokenLogprobs& t : o.prompt_logprobs) {
          add(t, size_t(echo_alternatives_));  // (the engine scored max(logprobs, prompt_logprobs))
          ids.push_back(t.token);
          bytes += c.lp.back().text.size();
        }
        // Decoding drops what the tokenizer added before the text (SentencePiece's space
        // prefix): so does the first piece, so that the tokens add up to the text (text_offset).
        const size_t text_bytes = ids.empty() ? 0 : tok.decode(ids).size();
        for (size_t k = first, cut = bytes > text_bytes ? bytes - text_bytes : 0; k < c.lp.size() && cut > 0; ++k) {
          std::string& piece = c.lp[k].text;
          if (piece.empty()) continue;  // BOS, control tokens
          if (piece.size() >= cut && piece.find_first_not_of(' ') >= cut) piece.erase(0, cut);
          break;
        }
      }
      for (const TokenLogprobs& t : o.logprobs) add(t, t.top.size());
    }
    // vLLM's prompt_logprobs: null for the first token (nothing precedes it), then per token
    // {"<id>": {"logprob", "rank", "decoded_token"}}, the token itself first, then its
    // report_prompt_logprobs_ best alternatives (ranks 1..; -inf as -9999, vLLM's clamp).
    json vllm_prompt_logprobs(const std::vector<TokenLogprobs>& lps) const {
      json out = json::array();
      for (const TokenLogprobs& t : lps) {
        if (std::isnan(t.logprob)) {
          out.push_back(nullptr);
          continue;
        }
        json pos = json::object();
        auto entry = [&](int32_t id, float lp, int32_t rank) {
          pos[std::to_string(id)] = {{"logprob", std::max(lp, -9999.0f)}, {"rank", rank}, {"decoded_token", token_name(id)}};
        };
        entry(t.token, t.logprob, t.rank);
        for (size_t k = 0; k < std::min(size_t(report_prompt_logprobs_), t.top.size()); ++k)
          if (t.top[k].first != t.token) entry(t.top[k].first, t.top[k].second, int32_t(k + 1));
        out.push_back(std::move(pos));
      }
      return out;
    }
    // Sends (streaming) or appends text. A streamed chunk carries the logprobs of the tokens since
    // the previous chunk; final: send them even without text (held-back bytes, a stop).
    void emit(Choice& c, int32_t index, const std::string& text, bool final) {
      if (c.held) {
        const std::string out = c.held->push(text);  // (what cannot be a call)
        if (!out.empty()) send(c, index, out, final);
        return;
      }
      send(c, index, text, final);
    }
    void send(Choice& c, int32_t index, const std::string& text, bool final) {
      if (!stream_) {
        c.text += text;
        return;
      }
      if (tool_choice_ == ToolChoice::Named) {
        if (text.empty()) return;
        json delta = {{"index", 0}, {"function", {{"arguments", text}}}};
        if (!c.call_started) {  // the first delta names the call
          c.call_started = true;
          delta = {{"index", 0}, {"id", new_tool_call_id()},
                   {"type", "function"}, {"function", {{"name", tool_name_}, {"arguments", text}}}};
        }
        json chunk = client_chunk(tool_calls_chunk(meta_, json::array({delta}), include_usage_, index), index);
        chunk["choices"][0]["logprobs"] = take_logprobs(c);  // (the call's tokens': they were never sent)
        s_.enqueue(http_chunk(sse_event(chunk)), false);
        return;
      }
      if (text.empty() && !(final && !c.lp.empty())) return;
      json chunk = client_chunk(stream_chunk(meta_, text, false, "", include_usage_, take_logprobs(c), index), index);
      take_ids(c, index / n_, chunk);
      s_.enqueue(http_chunk(sse_event(chunk)), false);
    }

    // continuous_usage_stats (vLLM's, per choice): a streamed chunk of choice `index` carries its
    // prompt's tokens and the choice's generated so far.
    // A chunk as this request's client reads it: with its usage so far (continuous_usage_), in
    // the deprecated functions API's shape (legacy_functions_).
    json client_chunk(json chunk, int32_t index) const {
      if (legacy_functions_)
        for (json& choice : chunk["choices"]) as_function_call(choice);
      if (continuous_usage_)
        chunk["usage"] = usage_json({prompt_tokens_.empty() ? 0 : prompt_tokens_[size_t(index / n_)], choices_[size_t(index)].generated},
                                    false);
      return chunk;
    }

    HttpSession& s_;  // alive while events are handled: each posted event holds the session
    ResponseMeta meta_;
    bool stream_, include_usage_, continuous_usage_, logprobs_;
    std::vector<int64_t> prompt_tokens_;  // per prompt (set_prompt_tokens)
    ToolChoice tool_choice_;
    bool parallel_;  // parallel_tool_calls
    std::string tool_name_;
    json tools_;
    bool legacy_functions_;          // ParsedRequest::legacy_functions
    std::vector<std::string> echo_;  // echo: each prompt's text (none: no echo)
    bool echo_only_;                 // echo with max_tokens 0: the generated token is dropped
    bool grammar_ = false;           // a grammar constrains the output
    int32_t echo_alternatives_;      // echo: alternatives per prompt token (the request's logprobs)
    int32_t report_prompt_logprobs_; // vLLM's prompt_logprobs (-1: off)
    bool tokens_as_ids_;             // vLLM's return_tokens_as_token_ids
    bool token_ids_;                 // vLLM's return_token_ids
    int32_t n_;                      // choices per prompt
    std::vector<Usage> usage_;       // per prompt, its latest
    size_t prompts_left_;            // prompts whose last choice has not finished
    bool failed_ = false;            // a prompt's generation failed: the response is out
    std::vector<Choice> choices_;    // prompt i's choice j at i * n_ + j
    std::vector<json> done_;         // not streaming: the finished choices' JSON, by index
    std::vector<json> prompt_logprobs_;  // per prompt, vLLM's prompt_logprobs once its first output came
    std::vector<std::vector<int32_t>> prompt_ids_;  // per prompt, with return_token_ids
  };
  // One prompt's generation, for its request's Reply.
  class PromptSink : public GenerationSink {
   public:
    PromptSink(std::shared_ptr<Reply> r, int32_t prompt) : r_(std::move(r)), prompt_(prompt) {}
    void on_output(Output&& o) override { r_->on_output(prompt_, std::move(o)); }
    void on_finish(Output&& last, const Finish& f) override { r_->on_finish(prompt_, std::move(last), f); }
    void on_error(const ApiError& e, const Usage&) override { r_->on_error(e); }

   private:
    std::shared_ptr<Reply> r_;
    int32_t prompt_;
  };

  // /v1/embeddings' response: one JSON body once every input's embedding has come (each input
  // its own generation), normalized as the request says; the first failure fails the request.
  class EmbeddingsReply {
   public:
    EmbeddingsReply(HttpSession& s, const ParsedRequest& pr)
        : s_(s), model_(pr.model), base64_(pr.base64), llama_(pr.llama_embeddings), norm_(pr.embd_normalize),
          vectors_(1 + pr.more_texts.size() + pr.more_tokens.size()), left_(vectors_.size()) {}
    void on_finish(int32_t input, Output&& last, const Finish& f) {
      if (failed_) return;
      normalize_embedding(last.embedding, norm_);
      vectors_[size_t(input)] = std::move(last.embedding);
      prompt_tokens_ += f.usage.prompt_tokens;
      if (--left_ != 0) return;
      s_.send_json(llama_ ? llama_embeddings_response(vectors_) : embeddings_response(model_, vectors_, base64_, prompt_tokens_));
    }
    void on_error(const ApiError& e) {
      if (failed_) return;
      failed_ = true;
      s_.abandon_all();
      s_.send_error(e);
    }

   private:
    HttpSession& s_;
    std::string model_;
    bool base64_, llama_;  // llama_: llama.cpp's /embedding answer
    int32_t norm_;
    std::vector<std::vector<float>> vectors_;  // by input
    size_t left_;
    int64_t prompt_tokens_ = 0;
    bool failed_ = false;
  };
  class InputSink : public GenerationSink {
   public:
    InputSink(std::shared_ptr<EmbeddingsReply> r, int32_t input) : r_(std::move(r)), input_(input) {}
    void on_output(Output&&) override {}  // (an embedding has no tokens)
    void on_finish(Output&& last, const Finish& f) override { r_->on_finish(input_, std::move(last), f); }
    void on_error(const ApiError& e, const Usage&) override { r_->on_error(e); }

   private:
    std::shared_ptr<EmbeddingsReply> r_;
    int32_t input_;
  };

  // llama.cpp's native /completion response: one JSON object, or a stream of its pieces (SSE
  // "data:" lines, no [DONE]), the last with stop true and the figures.
  class NativeReply : public GenerationSink {
    using Clock = std::chrono::steady_clock;

   public:
    NativeReply(HttpSession& s, const ParsedRequest& pr)
        : s_(s), model_(pr.model), stream_(pr.stream), tokens_(pr.return_token_ids), eval_only_(pr.echo_only),
          probs_(pr.logprobs >= 0), t0_(Clock::now()) {}
    void start() {
      if (stream_) s_.enqueue(sse_response_head(s_.keep_alive_ && !s_.srv_.draining, s_.headers_), false);
    }
    void on_output(Output&& o) override {
      if (!first_) first_ = Clock::now();
      if (eval_only_) return;
      if (!stream_) {
        text_ += o.text;
        if (tokens_) ids_.insert(ids_.end(), o.tokens.begin(), o.tokens.end());
        if (probs_) lps_.insert(lps_.end(), o.logprobs.begin(), o.logprobs.end());
        return;
      }
      if (o.text.empty() && !(tokens_ && !o.tokens.empty()) && !(probs_ && !o.logprobs.empty())) return;
      s_.enqueue(http_chunk(sse_event(piece(o))), false);
    }
    void on_finish(Output&& last, const Finish& fin) override {
      Finish f = fin;
      if (eval_only_) {  // n_predict 0: the prompt evaluated, nothing generated (its one token dropped)
        last = Output{};
        f.reason = "length";
        f.stop_word.clear();
        f.usage.completion_tokens = 0;
      }
      const std::string type = f.reason == "length" ? "limit" : !f.stop_word.empty() ? "word" : "eos";
      NativeTimings t;
      t.predicted_n = f.usage.completion_tokens;
      if (f.timings) {
        t.cached_n = f.timings->cached_tokens;
        t.prompt_ms = f.timings->prefill_ms();
        t.predicted_ms = f.timings->decode_ms();
      } else {  // a stop string (or a grammar's end) ended it before the engine did: this reply's clock
        const auto now = Clock::now(), first = first_.value_or(now);
        t.prompt_ms = std::chrono::duration<double, std::milli>(first - t0_).count();
        t.predicted_ms = std::chrono::duration<double, std::milli>(now - first).count();
      }
      t.prompt_n = f.usage.prompt_tokens - t.cached_n;
      if (!stream_) {
        text_ += last.text;
        if (tokens_) ids_.insert(ids_.end(), last.tokens.begin(), last.tokens.end());
        if (probs_) {
          lps_.insert(lps_.end(), last.logprobs.begin(), last.logprobs.end());
          // Stopped by a stop string: as many entries dropped at the end as it has tokens
          // (llama.cpp's rule: they made the cut text).
          if (!f.stop_word.empty())
            lps_.resize(lps_.size() - std::min(lps_.size(), io_tokenizer().encode(f.stop_word, false, false).size()));
        }
        json body = native_chunk(model_, text_, ids_, true, f.usage.completion_tokens, f.usage.prompt_tokens, type,
                                 f.stop_word, &t);
        if (probs_) body["completion_probabilities"] = native_probs(io_tokenizer(), lps_);
        return s_.send_json(body);
      }
      std::string out;
      if (!last.text.empty() || (tokens_ && !last.tokens.empty()) || (probs_ && !last.logprobs.empty()))
        out += sse_event(piece(last));
      out += sse_event(native_chunk(model_, "", {}, true, f.usage.completion_tokens, f.usage.prompt_tokens, type, f.stop_word, &t));
      s_.enqueue(http_chunk(out) + http_chunk(""), true);
    }
    void on_error(const ApiError& e, const Usage&) override {
      if (!stream_) return s_.send_error(e);
      s_.enqueue(http_chunk("data: " + error_body(e) + "\n\n") + http_chunk(""), true);
    }

   private:
    HttpSession& s_;
    std::string model_;
    bool stream_, tokens_;
    // A streamed piece: its text, and its tokens (return_tokens) and probabilities (n_probs).
    json piece(const Output& o) const {
      json j = native_chunk(model_, o.text, tokens_ ? o.tokens : std::vector<int32_t>{}, false, 0, 0);
      if (probs_) j["completion_probabilities"] = native_probs(io_tokenizer(), o.logprobs);
      return j;
    }

    bool eval_only_;            // n_predict 0 (ParsedRequest::echo_only): no content
    bool probs_;                // n_probs
    std::vector<TokenLogprobs> lps_;  // not streaming, with n_probs
    std::string text_;          // not streaming: the whole content
    std::vector<int32_t> ids_;  // not streaming, with return_tokens
    Clock::time_point t0_;                   // (timings without the engine's: from the request)
    std::optional<Clock::time_point> first_;  // the first output
  };

  // The Responses API's answer (one response object, or its typed events). A reasoning model's
  // text before </think> becomes a reasoning item (content [reasoning_text]) ahead of the message,
  // streamed as response.reasoning_text.delta events.
  // Background (ParsedRequest::background): stored as queued before it starts, in_progress from
  // its first output, its end stored in its place (BackgroundRuns::end: unless cancelled first).
  // Not streamed, the request's answer is the queued response and the reply writes nothing more
  // (s_ null: it outlives the connection); streamed, what it writes after the client left is
  // dropped (a closed session's enqueue), and the generation goes on (outlives_client); its events
  // are kept (log_, the stored response's EventLog) for GET ...?stream=true to send again.
  class ResponsesReply : public GenerationSink {
   public:
    ResponsesReply(HttpSession& s, ResponseMeta meta, ParsedRequest& pr)
        : s_(&s), srv_(s.srv_), meta_(std::move(meta)), background_(pr.background), stream_(pr.stream), tool_choice_(pr.tool_choice),
          parallel_(pr.parallel_tool_calls), tool_name_(pr.tool_name),
          tools_(pr.tools), echo_(pr.responses_echo), msg_id_(new_item_id("msg_")), rs_id_(new_item_id("rs_")),
          grammar_(!pr.grammar.empty()), store_(pr.store_response), conversation_(pr.conversation),
          claim_(std::move(pr.conversation_claim)), input_(std::move(pr.responses_input)),
          logprobs_(pr.logprobs >= 0) {
      think_ = reasoning_split(s.srv_.model);
      if (background_ && stream_) log_ = std::make_shared<EventLog>();
      // (gpt-oss's calls under auto are its own messages: HarmonySplit finds them)
      if (tool_choice_ != ToolChoice::None && !(tool_choice_ == ToolChoice::Auto && harmony_of(think_)))
        held_.emplace(tool_choice_ != ToolChoice::Auto);
    }
    // As Reply::open_reasoning: whether the output starts inside the reasoning.
    void open_reasoning(bool open) {
      if (think_ && !think_->harmony()) think_.emplace(open && !grammar_);
    }
    // Background: stored as queued (before it starts: GET and cancel find it at once); false
    // when the store would not take it.
    bool store_queued() { return srv_.responses.put(entry(queued_object(), json::array(), true)); }
    json queued_object() const { return status_object("queued"); }
    void detach() { s_ = nullptr; }  // (before its generation starts)
    void start() {
      if (!stream_) return;
      const json r = responses_object(meta_, "in_progress", json::array(), nullptr, "", echo_);
      // One ev() per statement: the operands of + are unsequenced, and ev() numbers the events.
      std::string out = ev("response.created", {{"response", r}});
      out += ev("response.in_progress", {{"response", r}});
      if (log_) log_->publish(false);
      s_->enqueue(sse_response_head(s_->keep_alive_ && !srv_.draining, s_->headers_) + http_chunk(out), false);
    }
    void on_output(Output&& o) override {
      if (background_ && !in_progress_) {  // (queued until its first output)
        in_progress_ = true;
        srv_.responses.replace(entry(status_object("in_progress"), json::array(), true), /*only_pending=*/true);
      }
      const ReasoningSplit::Parts p = split(o.text, false);
      // (a token whose text went to the reasoning, or is held inside it)
      if (p.content.empty() && think_ && (think_->in_reasoning() || !p.reasoning.empty()))
        reasoning_tokens_ += int64_t(o.tokens.size());
      else
        add_logprobs(o);
      std::string out = reason(p.reasoning);
      if (!p.content.empty()) {
        if (stream_) out += close_reasoning();
        out += message_text(held_ ? held_->push(p.content) : p.content);
      }
      if (log_) log_->publish(false);
      if (!out.empty() && s_) s_->enqueue(http_chunk(out), false);
    }
    void on_finish(Output&& last, const Finish& f) override {
      std::optional<Flush> flush;
      if (s_) flush.emplace(*s_);
      if (f.reason == "length" && think_) think_->cut_short();  // (gpt-oss: an open call is no call)
      const ReasoningSplit::Parts p = split(last.text, true);
      if (!(p.content.empty() && !p.reasoning.empty())) add_logprobs(last);
      std::string out = reason(p.reasoning);
      if (stream_ && !p.content.empty()) out += close_reasoning();
      out += message_text(held_ ? held_->push(p.content) : p.content);
      // Calls: in the whole text, or streaming in what was held back (the text before a call went
      // out as the message's).
      std::vector<ToolCall> calls;
      if (held_ || harmony_of(think_)) {
        FoundToolCalls found = held_ ? finish_calls(held_, text_, stream_, tool_choice_, tool_name_, tools_, parallel_)
                                     : at_most_one_call(harmony_tool_calls(harmony_of(think_)->take_calls(),
                                                                           tool_choice_, tools_), parallel_);
        calls = std::move(found.calls);
        if (!calls.empty()) lp_.clear();  // (the held tokens': the calls' text, which has no logprobs)
        if (stream_ && !found.content.empty()) out += close_reasoning();
        out += message_text(found.content);
      }
      const bool has_message = !text_.empty() || calls.empty();
      const bool incomplete = f.reason == "length";
      const char* message_status = incomplete ? "incomplete" : "completed";  // (OpenAI's: the message was cut)
      json output = json::array();
      if (stream_) {
        out += close_reasoning();
        if (has_message) out += open_message();  // (an empty message's: no delta opened it)
        // The items in the order they were added (output_index): reasoning resumed after the
        // message began (harmony's channels) is an item of its own after it.
        for (const StreamItem& it : items_)
          output.push_back(it.reasoning ? responses_reasoning_item(it.id, it.text, "completed")
                                        : responses_message_item(msg_id_, text_, message_status, text_logprobs_));
      } else {
        if (think_ && think_->reasoned()) output.push_back(responses_reasoning_item(rs_id_, reasoning_, "completed"));
        if (has_message) output.push_back(responses_message_item(msg_id_, text_, message_status, text_logprobs_));
      }
      for (const ToolCall& c : calls) output.push_back(responses_call_item(c, "completed"));
      Usage usage = f.usage;
      usage.reasoning_tokens = reasoning_tokens_;
      json r = responses_object(meta_, incomplete ? "incomplete" : "completed", output, &usage,
                                incomplete ? "max_output_tokens" : "", echo_);
      // (background: unless it was cancelled first, which stored it so). Its turn in its
      // conversation first: a client that sees it finished (GET) finds the turn there.
      const bool ended = !background_ || srv_.background.end(meta_.id);
      if (ended) add_to_conversation(output);
      claim_.reset();
      r["store"] = store_ && ended && keep(r);
      if (!s_) return;
      if (!stream_) return s_->send_json(r);
      int64_t index = int64_t(items_.size());
      if (has_message) {
        const int64_t m = msg_item_;
        out += ev("response.output_text.done", {{"item_id", msg_id_}, {"output_index", m}, {"content_index", 0},
                                                {"text", text_}, {"logprobs", text_logprobs_}});
        out += ev("response.content_part.done", {{"item_id", msg_id_}, {"output_index", m}, {"content_index", 0},
                                                 {"part", output[size_t(m)]["content"][0]}});
        out += ev("response.output_item.done", {{"output_index", m}, {"item", output[size_t(m)]}});
      }
      for (const ToolCall& c : calls) {
        json item = responses_call_item(c, "in_progress");
        const std::string item_id = item["id"].get<std::string>();
        item["arguments"] = "";
        out += ev("response.output_item.added", {{"output_index", index}, {"item", item}});
        out += ev("response.function_call_arguments.delta", {{"item_id", item_id}, {"output_index", index}, {"delta", c.arguments}});
        out += ev("response.function_call_arguments.done",
                  {{"item_id", item_id}, {"output_index", index}, {"name", c.name}, {"arguments", c.arguments}});
        out += ev("response.output_item.done", {{"output_index", index}, {"item", responses_call_item(c, "completed")}});
        ++index;
      }
      out += ev(incomplete ? "response.incomplete" : "response.completed", {{"response", r}});
      if (log_) {
        log_->publish(true);
        srv_.responses.recount(meta_.id);  // (its last events came after it was stored)
      }
      s_->enqueue(http_chunk(out) + http_chunk(""), true);
    }
    void on_error(const ApiError& e, const Usage& u) override {
      claim_.reset();
      if (background_ && srv_.background.end(meta_.id)) {  // failed (cancelled: the cancel stored that)
        Usage usage = u;
        usage.reasoning_tokens = reasoning_tokens_;
        json r = responses_object(meta_, "failed", json::array(), &usage, "", echo_);
        r["error"] = {{"code", e.code.empty() ? "server_error" : e.code}, {"message", e.what()}};
        srv_.responses.replace(entry(r, json::array(), false));
      }
      if (!stream_) {
        if (s_) s_->send_error(e);
        return;
      }
      const std::string out = ev("error", {{"code", e.code.empty() ? json(nullptr) : json(e.code)}, {"message", e.what()},
                                           {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
      if (log_) log_->publish(true);
      if (s_) s_->enqueue(http_chunk(out) + http_chunk(""), true);
    }

   private:
    std::string ev(const std::string& type, json data) {
      std::string e = responses_event(type, std::move(data), seq_++);
      if (log_) log_->append(e);
      return e;
    }
    // Stores the finished response r; whether it was (ResponseStore::put: it may be over the cap;
    // background: in its queued self's place, unless that is gone).
    bool keep(const json& r) {
      if (!background_) return srv_.responses.put(entry(r, r["output"], false));
      if (srv_.responses.replace(entry(r, r["output"], false))) return true;
      ResponseStore::Entry without_stream = entry(r, r["output"], false);  // (its events alone past the cap)
      without_stream.events = nullptr;
      if (log_ && srv_.responses.replace(std::move(without_stream))) return true;
      // Over the byte cap alone (a foreground response is answered, store: false; a background
      // one has only the store): its end, without its output.
      json failed = status_object("failed");
      failed["error"] = {{"code", "server_error"},
                         {"message", cat("the response (", ResponseStore::text(r).size(), " bytes) is larger than the "
                                         "response store's byte cap, --max-stored-bytes ", srv_.responses.max_bytes())}};
      ResponseStore::Entry e = entry(failed, json::array(), false);
      e.events = nullptr;  // (its stream is not kept either)
      srv_.responses.replace(std::move(e));
      return false;
    }
    // A finished response's input items then its output items, at its conversation's end (one
    // deleted meanwhile: dropped; one its output would take past its cap, or that items of the
    // turn's ids were added to meanwhile: not added, a warning logged).
    void add_to_conversation(const json& output) const {
      if (conversation_.empty()) return;
      std::vector<ResponseStore::Item> items = ResponseStore::to_items(input_);
      for (ResponseStore::Item& it : ResponseStore::to_items(output)) items.push_back(std::move(it));
      std::string duplicate;
      switch (srv_.conversations.add(conversation_, items, &duplicate)) {
        case ConversationStore::Change::kOverTheCap:
          spdlog::warn("{}: {}: this turn is not added", meta_.id,
                       conversation_over_cap(conversation_, srv_.conversations.max_conversation_bytes()));
          break;
        case ConversationStore::Change::kDuplicate:  // (an item of that id added to it meanwhile)
          spdlog::warn("{}: conversation {} holds an item '{}' already: this turn is not added", meta_.id, conversation_,
                       duplicate);
          break;
        default:
          break;
      }
    }
    // The response object r as stored: its request's input items, `output`'s items.
    ResponseStore::Entry entry(json r, const json& output, bool pending) const {
      ResponseStore::Entry e;
      e.id = meta_.id;
      e.pending = pending;
      e.events = log_;
      if (echo_.contains("previous_response_id")) e.previous_id = echo_["previous_response_id"].get<std::string>();
      e.input = ResponseStore::to_items(input_);
      e.output = ResponseStore::to_items(output);
      r.erase("output");
      r["store"] = true;
      e.response = ResponseStore::text(r);
      return e;
    }
    json status_object(const char* status) const {
      json r = responses_object(meta_, status, json::array(), nullptr, "", echo_);
      r["store"] = true;
      return r;
    }
    ReasoningSplit::Parts split(const std::string& text, bool final) {
      if (!think_) return {"", text};
      return think_->push(text, final);
    }
    // Reasoning text: kept, and streamed (the item's opening events first). Reasoning that comes
    // after its item closed (a harmony analysis after the final channel began) opens another.
    std::string reason(const std::string& text) {
      reasoning_ += text;
      const bool open = rs_item_ >= 0 && !reasoning_closed_;
      if (!stream_ || (text.empty() && (rs_item_ >= 0 || !(think_ && think_->reasoned())))) return "";
      std::string out;
      if (!open) {
        rs_item_ = int64_t(items_.size());
        const int64_t k = std::count_if(items_.begin(), items_.end(), [](const StreamItem& it) { return it.reasoning; });
        items_.push_back({k ? cat(rs_id_, "_", k + 1) : rs_id_, true, ""});
        reasoning_closed_ = false;
        out += ev("response.output_item.added",
                  {{"output_index", rs_item_}, {"item", responses_reasoning_item(items_.back().id, "", "in_progress")}});
        out += ev("response.content_part.added", {{"item_id", items_.back().id}, {"output_index", rs_item_}, {"content_index", 0},
                                                  {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
      }
      StreamItem& it = items_[size_t(rs_item_)];
      it.text += text;
      if (!text.empty())
        out += ev("response.reasoning_text.delta", {{"item_id", it.id}, {"output_index", rs_item_}, {"content_index", 0}, {"delta", text}});
      return out;
    }
    // The open reasoning item's closing events, once (before the message's text).
    std::string close_reasoning() {
      if (rs_item_ < 0 || reasoning_closed_) return "";
      reasoning_closed_ = true;
      const StreamItem& it = items_[size_t(rs_item_)];
      std::string out = ev("response.reasoning_text.done", {{"item_id", it.id}, {"output_index", rs_item_}, {"content_index", 0}, {"text", it.text}});
      out += ev("response.content_part.done", {{"item_id", it.id}, {"output_index", rs_item_}, {"content_index", 0},
                                               {"part", {{"type", "reasoning_text"}, {"text", it.text}}}});
      out += ev("response.output_item.done",
                {{"output_index", rs_item_}, {"item", responses_reasoning_item(it.id, it.text, "completed")}});
      return out;
    }
    // Message text: kept, and streamed as a delta (the message's opening events first) with the
    // logprobs of the tokens since the last one.
    std::string message_text(const std::string& text) {
      if (text.empty()) return "";
      text_ += text;
      json lp = logprobs_json(Endpoint::Chat, std::exchange(lp_, {}))["content"];
      for (const json& e : lp) text_logprobs_.push_back(e);
      if (!stream_) return "";
      std::string out = open_message();
      out += ev("response.output_text.delta", {{"item_id", msg_id_}, {"output_index", msg_item_}, {"content_index", 0},
                                               {"delta", text}, {"logprobs", std::move(lp)}});
      return out;
    }
    // An output's logprobs (include: message.output_text.logprobs), held until its text goes out
    // as the message's (a reasoning token's are not: reasoning items carry none).
    void add_logprobs(const Output& o) {
      if (!logprobs_) return;
      const Tokenizer& tok = *srv_.model.tokenizer;  // immutable; decoding reads only
      for (const TokenLogprobs& t : o.logprobs) {
        TokenLogprob x{tok.token_to_piece(t.token), t.logprob, {}};
        for (const auto& [id, lp] : t.top) x.top.emplace_back(tok.token_to_piece(id), lp);
        lp_.push_back(std::move(x));
      }
    }
    // The message item's opening events, once (its place: after the items added before it).
    std::string open_message() {
      if (msg_item_ >= 0) return "";
      msg_item_ = int64_t(items_.size());
      items_.push_back({msg_id_, false, ""});
      std::string out =  // (sequenced: see start())
          ev("response.output_item.added", {{"output_index", msg_item_}, {"item", responses_message_item(msg_id_, "", "in_progress")}});
      out += ev("response.content_part.added",
                {{"item_id", msg_id_}, {"output_index", msg_item_}, {"content_index", 0},
                 {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
      return out;
    }

    HttpSession* s_;  // null: nothing more to write (a background response's, not streamed)
    Server::Impl& srv_;
    ResponseMeta meta_;
    bool background_;
    bool in_progress_ = false;  // background: stored as in_progress
    std::shared_ptr<EventLog> log_;  // background and streamed: its events, kept
    bool stream_;
    ToolChoice tool_choice_;
    bool parallel_;  // parallel_tool_calls
    std::string tool_name_;
    json tools_;
    json echo_;  // the request's fields its response object echoes
    // msg_id_, rs_id_: random, not derived from the response id (items are sent back; the id reads the response)
    std::string msg_id_, rs_id_, text_, reasoning_;  // text_: the message's so far
    bool grammar_;  // a grammar constrains the output (reasoning never open from the start)
    bool store_;    // ParsedRequest::store_response
    std::string conversation_;  // ParsedRequest::conversation
    std::shared_ptr<void> claim_;  // ParsedRequest::conversation_claim (let go when it ends)
    json input_;    // ParsedRequest::responses_input
    bool logprobs_;  // include: message.output_text.logprobs
    std::vector<TokenLogprob> lp_;                  // not yet out with the message's text
    json text_logprobs_ = json::array();            // the message's (its output_text part's)
    std::optional<ToolCallHold> held_;  // with tools: text held back while it is or may become a call
    std::optional<ReasoningSplit> think_;  // a reasoning model (ServedModel::reasoning)
    // Streamed: the reasoning items and the message, in the order they were added (output_index).
    struct StreamItem {
      std::string id;
      bool reasoning;
      std::string text;  // a reasoning item's (the message's is text_)
    };
    std::vector<StreamItem> items_;
    int64_t rs_item_ = -1, msg_item_ = -1;  // the last reasoning item's place, the message's (-1: none yet)
    bool reasoning_closed_ = false;         // the last reasoning item is done
    int64_t reasoning_tokens_ = 0;  // usage's output_tokens_details
    int64_t seq_ = 0;
  };

  // Anthropic's Messages API answer: one message object, or its typed events (message_start,
  // then content blocks, each content_block_start / _delta... / _stop: thinking, text, tool_use;
  // then message_delta with the stop reason and usage, and message_stop). A reasoning model's
  // text before </think> is a thinking block (its signature empty: nothing here verifies one).
  // Tool calls are found as chat's are: text that may be a call is held back, the calls sent whole
  // at the end as tool_use blocks.
  class MessagesReply : public GenerationSink {
   public:
    MessagesReply(HttpSession& s, ResponseMeta meta, const ParsedRequest& pr)
        : s_(s), meta_(std::move(meta)), stream_(pr.stream), tool_choice_(pr.tool_choice),
          parallel_(pr.parallel_tool_calls), tool_name_(pr.tool_name),
          tools_(pr.tools), grammar_(!pr.grammar.empty()) {
      think_ = reasoning_split(s.srv_.model);
      // (gpt-oss's calls under auto are its own messages: HarmonySplit finds them)
      if (tool_choice_ != ToolChoice::None && !(tool_choice_ == ToolChoice::Auto && harmony_of(think_)))
        held_.emplace(tool_choice_ != ToolChoice::Auto);
    }
    // As Reply::open_reasoning: whether the output starts inside the reasoning.
    void open_reasoning(bool open) {
      if (think_ && !think_->harmony()) think_.emplace(open && !grammar_);
    }
    void start(int64_t prompt_tokens) {
      if (!stream_) return;
      std::string out = typed_event("message_start", {{"message", messages_response(meta_, json::array(), nullptr, {prompt_tokens, 0})}});
      out += typed_event("ping", json::object());
      s_.enqueue(sse_response_head(s_.keep_alive_ && !s_.srv_.draining, s_.headers_) + http_chunk(out), false);
    }
    void on_output(Output&& o) override {
      const ReasoningSplit::Parts p = split(o.text, false);
      std::string out = thinking(p.reasoning);
      out += content(p.content);
      if (!out.empty()) s_.enqueue(http_chunk(out), false);
    }
    void on_finish(Output&& last, const Finish& f) override {
      const Flush flush(s_);
      if (f.reason == "length" && think_) think_->cut_short();  // (gpt-oss: an open call is no call)
      const ReasoningSplit::Parts p = split(last.text, true);
      std::string out = thinking(p.reasoning);
      out += content(p.content);
      std::vector<ToolCall> calls;
      if (held_) {  // the whole text, or streaming what was held back (the text before a call went out)
        FoundToolCalls found = finish_calls(held_, text_, stream_, tool_choice_, tool_name_, tools_, parallel_);
        calls = std::move(found.calls);
        out += content(found.content);
      } else if (HarmonySplit* h = harmony_of(think_)) {  // gpt-oss's own call messages
        FoundToolCalls found = at_most_one_call(harmony_tool_calls(h->take_calls(), tool_choice_, tools_), parallel_);
        calls = std::move(found.calls);
        out += plain(found.content);
      }
      const MessagesStop stop = messages_stop(f, !calls.empty());
      if (!stream_) {
        nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
        if (!reasoning_.empty()) blocks.push_back({{"type", "thinking"}, {"thinking", reasoning_}, {"signature", ""}});
        if (!text_.empty() || (calls.empty() && blocks.empty())) blocks.push_back({{"type", "text"}, {"text", text_}});
        for (const ToolCall& c : calls) blocks.push_back(messages_tool_use_block(c));
        return s_.send_response(200, "application/json", messages_response(meta_, std::move(blocks), &stop, f.usage)
                                                             .dump(-1, ' ', false, json::error_handler_t::replace));
      }
      if (next_index_ == 0 && open_ == Block::None && calls.empty()) out += open_block(Block::Text);  // (as unstreamed: one text block)
      out += close_block();
      for (const ToolCall& c : calls) {
        nlohmann::ordered_json block = messages_tool_use_block(c);
        const std::string input = block["input"].dump(-1, ' ', false, json::error_handler_t::replace);
        block["input"] = json::object();
        const int64_t index = next_index_++;
        out += typed_event("content_block_start", {{"index", index}, {"content_block", block}});
        out += typed_event("content_block_delta", {{"index", index}, {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}});
        out += typed_event("content_block_stop", {{"index", index}});
      }
      out += typed_event("message_delta", {{"delta", {{"stop_reason", stop.reason}, {"stop_sequence", stop.sequence}}},
                                           {"usage", messages_usage(f.usage)}});
      out += typed_event("message_stop", json::object());
      s_.enqueue(http_chunk(out) + http_chunk(""), true);
    }
    void on_error(const ApiError& e, const Usage&) override {
      if (!stream_) return s_.send_error(e);
      const std::string out = typed_event("error", {{"error", {{"type", anthropic_error_type(e.status)}, {"message", e.what()}}}});
      s_.enqueue(http_chunk(out) + http_chunk(""), true);
    }

   private:
    enum class Block { None, Thinking, Text };
    ReasoningSplit::Parts split(const std::string& text, bool final) {
      if (!think_) return {"", text};
      return think_->push(text, final);
    }
    // Opens a block of this kind (closing the open one) unless it is the open one.
    std::string open_block(Block kind) {
      if (open_ == kind) return "";
      std::string out = close_block();
      open_ = kind;
      const json block = kind == Block::Thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                                 : json{{"type", "text"}, {"text", ""}};
      out += typed_event("content_block_start", {{"index", next_index_}, {"content_block", block}});
      return out;
    }
    std::string close_block() {
      if (open_ == Block::None) return "";
      open_ = Block::None;
      return typed_event("content_block_stop", {{"index", next_index_++}});
    }
    std::string thinking(const std::string& text) {
      if (text.empty()) return "";
      reasoning_ += text;
      if (!stream_) return "";
      std::string out = open_block(Block::Thinking);
      out += typed_event("content_block_delta", {{"index", next_index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", text}}}});
      return out;
    }
    // Content text: what is or may become a tool call held back (ToolCallHold), the rest streamed
    // in a text block or kept for the message.
    std::string content(const std::string& text) { return plain(held_ ? held_->push(text) : text); }
    std::string plain(const std::string& text) {
      if (!stream_) {
        text_ += text;
        return "";
      }
      if (text.empty()) return "";
      std::string out = open_block(Block::Text);
      out += typed_event("content_block_delta", {{"index", next_index_}, {"delta", {{"type", "text_delta"}, {"text", text}}}});
      return out;
    }

    HttpSession& s_;
    ResponseMeta meta_;
    bool stream_;
    ToolChoice tool_choice_;
    bool parallel_;  // parallel_tool_calls
    std::string tool_name_;
    json tools_;
    bool grammar_;                         // a grammar constrains the output (reasoning never open from the start)
    std::optional<ReasoningSplit> think_;  // a reasoning model (ServedModel::reasoning)
    std::optional<ToolCallHold> held_;     // content held back while it is or may become tool calls
    std::string text_, reasoning_;         // not streaming: the message's text and thinking
    Block open_ = Block::None;             // streaming: the block being written (its index next_index_)
    int64_t next_index_ = 0;               // streaming: the open block's index, else the next one's
  };

  void generate(Endpoint kind, const std::string& body) override {
    ParsedRequest pr = kind == Endpoint::Responses    ? parse_responses_request(body, srv_.info, &srv_.responses, &srv_.conversations)
                       : kind == Endpoint::Messages   ? parse_messages_request(body, srv_.info)
                       : kind == Endpoint::Native     ? parse_native_request(body, srv_.info)
                       : kind == Endpoint::Infill     ? parse_infill_request(body, srv_.info)
                       : kind == Endpoint::Embeddings ? parse_embeddings_request(body, srv_.info)
                       : kind == Endpoint::NativeEmbeddings ? parse_native_embeddings_request(body, srv_.info)
                                                      : parse_request(kind, body, srv_.info);
    const uint64_t n = srv_.next_id.fetch_add(1);
    const char* prefix = kind == Endpoint::Chat        ? "chatcmpl-"
                         : kind == Endpoint::Responses  ? "resp_"
                         : pr.kind == Endpoint::Embeddings ? "embd-"
                         : kind == Endpoint::Messages   ? "msg_"
                                                        : "cmpl-";
    // "model" names the base or a LoRA adapter (vLLM's convention); responses echo it.
    if (pr.model != srv_.info.id) pr.adapter = pr.model;
    // (A response's id is random: its stored response is read back by it, GET /v1/responses/{id}.)
    ResponseMeta meta{kind, kind == Endpoint::Responses ? new_item_id(prefix) : cat(prefix, std::hex, 0x10000000u + n),
                      int64_t(std::time(nullptr)), pr.model};
    pr.name = (request_id_.empty() ? meta.id : request_id_) +
              (kind == Endpoint::Chat         ? " chat"
               : kind == Endpoint::Responses  ? " response"
               : pr.kind == Endpoint::Embeddings ? " embedding"
               : kind == Endpoint::Messages   ? " message"
                                              : " completion");
    for (const auto& f : pr.unknown_fields) spdlog::warn("{}: ignoring the unknown field '{}'", pr.name, f);
    // gpt-oss: its harmony markup (<|channel|>, <|message|>, <|end|>, ...) comes out as text for
    // HarmonySplit to read (llama.cpp renders these tokens for its parser the same way); none of it
    // reaches the client but with --reasoning-format none.
    if (srv_.model.harmony && (kind == Endpoint::Chat || kind == Endpoint::Responses || kind == Endpoint::Messages))
      pr.skip_special_tokens = false;
    for (const auto& f : pr.ignored_fields) spdlog::debug("{}: '{}' has no effect here; ignored", pr.name, f);
    // Tool calls hold a stream's text, and its logprobs, until a call ends (a named call's, its
    // generation): such a stream's logprobs count as a held response's (kMaxLogprobEntries); so do
    // a Responses stream's, whose completed event carries its whole output.
    pr.holds_output = pr.stream && (kind == Endpoint::Responses ||
                                    (pr.tool_choice != ToolChoice::None &&
                                     !(pr.tool_choice == ToolChoice::Auto && srv_.model.harmony) &&  // (its calls are messages)
                                     !(kind == Endpoint::Chat && pr.tool_choice == ToolChoice::Named)));  // (chat streams its arguments)
    if (kind == Endpoint::Responses && pr.background) {
      // Stored as queued, registered, then submitted: its events run on this connection's strand
      // when streamed (the session stays while its generation does), else on a strand of their
      // own, the reply never touching this session (the queued answer is the session's own).
      const std::string id = meta.id;
      const bool stream = pr.stream;
      pr.outlives_client = true;
      auto reply = std::make_shared<ResponsesReply>(*this, std::move(meta), pr);
      if (!stream) reply->detach();
      if (!reply->store_queued())  // (its input alone is over the store's byte cap)
        bad("background", cat("this response's input is larger than the response store's byte cap, "
                               "--max-stored-bytes ", srv_.responses.max_bytes(), ": it cannot run in the background"));
      const net::any_io_executor ex = stream ? executor() : net::any_io_executor(net::make_strand(srv_.ioc));
      srv_.background.add(id, ex);
      std::shared_ptr<Generation> g;
      try {
        g = Generation::prepare(srv_.gen, io_tokenizer(), std::move(pr), reply,
                                stream ? post_to(shared_from_this()) : Post([ex](std::function<void()> f) { net::post(ex, std::move(f)); }));
        reply->open_reasoning(g->opens_reasoning());  // (before its first event can run)
        g->submit_prepared();
      } catch (...) {  // (refused: nothing runs, nothing stays stored)
        srv_.background.end(id);
        srv_.responses.erase(id);
        throw;
      }
      srv_.background.started(id, g, ex);
      if (!stream) return send_json(reply->queued_object());
      gens_ = {g};
      reply->start();
    } else if (kind == Endpoint::Responses) {
      auto reply = std::make_shared<ResponsesReply>(*this, std::move(meta), pr);
      gens_ = {Generation::start(srv_.gen, io_tokenizer(), std::move(pr), reply, post_to(shared_from_this()))};
      reply->open_reasoning(gens_.front()->opens_reasoning());
      reply->start();
    } else if (kind == Endpoint::Messages) {
      auto reply = std::make_shared<MessagesReply>(*this, std::move(meta), pr);
      gens_ = {Generation::start(srv_.gen, io_tokenizer(), std::move(pr), reply, post_to(shared_from_this()))};
      reply->open_reasoning(gens_.front()->opens_reasoning());
      reply->start(gens_.front()->n_prompt());
    } else if (kind == Endpoint::Native || kind == Endpoint::Infill) {
      auto reply = std::make_shared<NativeReply>(*this, pr);
      gens_ = {Generation::start(srv_.gen, io_tokenizer(), std::move(pr), reply, post_to(shared_from_this()))};
      reply->start();
    } else {
      // One generation per prompt (a batched completions request has several; embeddings one
      // per input). Every prompt is tokenized, validated and admitted before any is submitted, so
      // a prompt refused (too long, the queue full) refuses the request with nothing run; a
      // refusal at submission (shutting down) cancels the ones submitted before it.
      std::shared_ptr<Reply> reply;
      std::shared_ptr<EmbeddingsReply> embeddings;
      if (pr.kind == Endpoint::Embeddings) embeddings = std::make_shared<EmbeddingsReply>(*this, pr);
      else reply = std::make_shared<Reply>(*this, std::move(meta), pr);
      const size_t k = 1 + pr.more_texts.size() + pr.more_tokens.size();
      size_t submitted = 0;
      try {
        for (size_t i = 0; i < k; ++i) {
          GenerationRequest g = static_cast<const GenerationRequest&>(pr);
          if (i > 0) {
            if (pr.prompt_kind == PromptKind::Tokens) g.prompt_tokens = pr.more_tokens[i - 1];
            else g.prompt_text = pr.more_texts[i - 1];
          }
          if (k > 1) g.name += cat("[", i, "]");
          g.queue_slot = !embeddings || i + 1 == k;  // (admitted last, it leaves the queue last)
          g.logprob_share = int32_t(k);
          std::shared_ptr<GenerationSink> sink;
          if (embeddings) sink = std::make_shared<InputSink>(embeddings, int32_t(i));
          else sink = std::make_shared<PromptSink>(reply, int32_t(i));
          gens_.push_back(Generation::prepare(srv_.gen, io_tokenizer(), std::move(g), std::move(sink), post_to(shared_from_this())));
        }
        int64_t prompt_entries = 0, output_entries = 0;  // the response's size over its prompts, bounded
        for (const auto& gen : gens_) {
          prompt_entries += gen->prompt_logprob_entries();
          output_entries += gen->output_logprob_entries();
        }
        check_logprob_entries(prompt_entries, output_entries);
        for (size_t i = 0; i < k; ++i) {
          gens_[i]->submit_prepared();
          submitted = i + 1;
        }
      } catch (...) {
        for (size_t i = 0; i < submitted; ++i) gens_[i]->abandon();
        gens_.clear();  // (the unsubmitted give their admission back)
        throw;
      }
      if (reply) {
        std::vector<int64_t> prompt_tokens;
        for (const auto& gen : gens_) prompt_tokens.push_back(gen->n_prompt());
        reply->set_prompt_tokens(std::move(prompt_tokens));
        reply->open_reasoning(gens_.front()->opens_reasoning());  // (chat: one prompt)
        reply->start();
      }
    }
    start_watch();
  }

  static constexpr uint64_t kHeaderLimit = 16 * 1024, kWatchBytes = 4096;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool wend_ = false;
  bool linger_ = false;
  int64_t header_ns_ = 0;  // profiler clock when the request's header was read
  std::string discard_;
  bool watching_ = false, resume_after_watch_ = false, keep_alive_ = true;
  bool answering_ = false;  // answer_later's work is running: the connection is busy
  bool following_ = false;  // the current response is a background stream sent again (follow)
  std::string headers_;     // "Name: value\r\n" lines every response to the current request carries
  std::string request_id_;  // the current request's X-Request-Id ("" = none)
  bool anthropic_ = false;  // the current request is Anthropic's Messages API: its error format
  bool head_only_ = false;  // the current request is a HEAD: its responses carry no body
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
