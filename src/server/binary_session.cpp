#include <algorithm>
#include <deque>
#include <spdlog/spdlog.h>

#include "client/binary_proto.h"
#include "core/error.h"
#include "profile/trace.h"
#include "server/server_impl.h"

namespace ft::server {

namespace {

using error_code = boost::system::error_code;

// One connection of the binary protocol (client/binary_proto.h, proto/firsttoken.fbs): frames
// are read one after another on the session's strand; a request is validated and tokenized here
// (this I/O thread's tokenizer), submitted to the same engine as HTTP, and answered with a frame
// per token (stream) and a last frame with finish reason, usage and timings. A bad length, a
// frame that fails the FlatBuffers Verifier, or a second request while one is generating closes
// this connection (cancelling its request); nothing else is touched.
//
// Reading a frame: its memory grows with the bytes that arrived (kReadChunk at a time), never to
// the length the prefix declares until the bytes are there; from its first byte the whole frame
// must arrive within frame_timeout_s, else the connection closes. Idle between frames (no request
// generating, nothing to write) for header_timeout_s, it closes, as an idle HTTP connection does.
// Each write must complete within write_timeout_s (a client that stops reading closes, and
// cancels its request, rather than holding its frames and its slot forever).
class BinSession : public Session<std::string>, public std::enable_shared_from_this<BinSession> {
 public:
  static constexpr size_t kReadChunk = 64 << 10;
  BinSession(tcp::socket&& s, Server::Impl& srv)
      : Session(srv), sock_(std::move(s)), frame_timer_(sock_.get_executor()), write_timer_(sock_.get_executor()) {}
  net::any_io_executor executor() override { return sock_.get_executor(); }
  void start() override { read_header(); }
  void on_shutdown() override {
    draining_ = true;
    if (gens_.empty() && outq_.empty() && !writing_) close();  // (writing_: the last frame is in wbuf_)
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
      if (!last.embedding.empty()) {
        r_.embedding = std::move(last.embedding);
        normalize_embedding(r_.embedding, 2);  // (the HTTP API's default)
      }
      if (const RequestTimings* t = f.timings)
        r_.timings = {t->tokenize_ms, t->queue_ms(), t->prefill_ms(), t->ttft_ms(), t->decode_ms(), t->total_ms()};
      s_.respond(r_);
    }
    void on_error(const ApiError& e, const Usage& u) override {
      proto::Response r;
      r.last = true;
      r.finish = e.code == kGenerationFailed || e.status == 400 ? "error" : "cancelled";  // (400: its own input)
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
    start_idle_timer();
    sock_.async_read_some(net::buffer(hdr_ + hdr_have_, sizeof hdr_ - hdr_have_),
                          [self = shared_from_this()](error_code ec, size_t n) { self->on_header(ec, n); });
  }
  void on_header(error_code ec, size_t n) {
    if (ec) return gone();
    if (hdr_have_ == 0) in_frame_ = true, start_frame_timer();
    hdr_have_ += n;
    if (hdr_have_ < sizeof hdr_) return read_header();
    hdr_have_ = 0;
    frame_len_ = proto::frame_length(hdr_);
    if (frame_len_ == 0 || frame_len_ > srv_.cfg.max_body_bytes) {
      spdlog::warn("binary protocol: bad frame length {} (1 .. {}); closing the connection", frame_len_,
                   srv_.cfg.max_body_bytes);
      return gone();
    }
    body_.clear();
    read_body();
  }
  void read_body() {
    const size_t have = body_.size(), chunk = std::min<size_t>(kReadChunk, frame_len_ - have);
    body_.resize(have + chunk);
    sock_.async_read_some(net::buffer(body_.data() + have, chunk), [self = shared_from_this(), have](error_code ec, size_t n) {
      if (ec) return self->gone();
      self->body_.resize(have + n);
      if (self->body_.size() < self->frame_len_) return self->read_body();
      self->on_body();
    });
  }
  // An idle connection (no request generating or waiting, nothing to write, no frame begun) is
  // closed after header_timeout_s, as an idle HTTP connection is: else idle connections held
  // every connection slot (max_connections) for good.
  void start_idle_timer() {
    if (!gens_.empty() || writing_ || in_frame_ || !held_.empty()) return;
    frame_timer_.expires_after(secs(srv_.cfg.header_timeout_s));
    frame_timer_.async_wait([self = shared_from_this(), frame = frames_](error_code ec) {
      if (ec || self->closed_ || self->frames_ != frame || self->in_frame_ || !self->gens_.empty() || self->writing_) return;
      spdlog::debug("binary protocol: idle for {} s; closing the connection", self->srv_.cfg.header_timeout_s);
      self->gone();
    });
  }
  void start_frame_timer() {
    frame_timer_.expires_after(secs(srv_.cfg.frame_timeout_s));
    frame_timer_.async_wait([self = shared_from_this(), frame = frames_](error_code ec) {
      if (ec || self->closed_ || self->frames_ != frame) return;  // cancelled, or fired as the frame arrived
      ++self->srv_.metrics.frame_timeouts;
      spdlog::warn("binary protocol: a frame did not arrive within {} s; closing the connection",
                   self->srv_.cfg.frame_timeout_s);
      self->gone();
    });
  }
  void on_body() {
    ++frames_;
    frame_timer_.cancel();
    in_frame_ = false;
    if (!gens_.empty()) {
      spdlog::warn("binary protocol: a request arrived while one is generating; closing the connection");
      return gone();
    }
    held_ = std::move(body_);  // released when handled: an idle connection holds no frame
    body_ = {};
    // A request waits for the previous response's frames to be written (write_next takes it up):
    // a client that sends and does not read gets no more responses queued, one at most.
    if (!writing_) handle_request();
  }
  void handle_request() {
    const std::vector<uint8_t> body = std::move(held_);
    held_ = {};
    profile::Scope sc("bin.parse", "http");  // decode, validate, tokenize, submit
    if (sc.on()) sc.args().i("body_bytes", int64_t(body.size()));
    try {
      proto::Request req;
      if (!proto::decode_request(body.data(), body.size(), req)) {
        spdlog::warn("binary protocol: malformed request frame ({} bytes); closing the connection", body.size());
        return gone();
      }
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
    g.stream = req.stream;
    g.embed = req.embed;
    g.name = cat("bin-", std::hex, 0x10000000u + srv_.next_id.fetch_add(1), req.embed ? " binary embedding" : " binary");
    gens_ = {Generation::start(srv_.gen, io_tokenizer(), std::move(g), std::make_shared<Reply>(*this, req.stream),
                               post_to(shared_from_this()))};
  }

  // The last frame; the connection is free for the next request.
  void respond(const proto::Response& last) {
    enqueue(proto::encode_response(last));
    gens_.clear();
  }

  void enqueue(std::string frame) {
    if (closed_) return;
    if (!backlog_allows(frame.size())) {
      spdlog::warn("binary protocol: the client fell {} bytes behind its response; closing the connection", backlog_);
      return gone();
    }
    outq_.push_back(std::move(frame));
    if (!writing_) write_next();
  }
  void write_next() {
    if (outq_.empty() || closed_) {
      writing_ = false;
      backlog_ = 0;
      if (!closed_ && !held_.empty()) return handle_request();  // (draining: answered 503, then closed)
      if (draining_ && gens_.empty()) return close();
      if (!closed_) start_idle_timer();
      return;
    }
    profile::Scope sc("bin.write", "http");
    writing_ = true;
    wbuf_ = std::move(outq_.front());
    outq_.pop_front();
    backlog_ -= std::min(backlog_, wbuf_.size());
    if (sc.on()) sc.args().i("bytes", int64_t(wbuf_.size()));
    const uint64_t write = ++writes_;
    write_timer_.expires_after(secs(srv_.cfg.write_timeout_s));
    write_timer_.async_wait([self = shared_from_this(), write](error_code ec) {
      if (ec || self->closed_ || !self->writing_ || self->writes_ != write) return;  // cancelled, or done
      spdlog::warn("binary protocol: a write did not complete within {} s; closing the connection",
                   self->srv_.cfg.write_timeout_s);
      self->gone();
    });
    net::async_write(sock_, net::buffer(wbuf_), [self = shared_from_this()](error_code ec, size_t) {
      self->write_timer_.cancel();
      if (ec) return self->gone();
      self->write_next();
    });
  }

  void close_transport() override {
    error_code ec;
    frame_timer_.cancel();
    write_timer_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }

  tcp::socket sock_;
  net::steady_timer frame_timer_;  // the frame being read must be complete when it fires
  net::steady_timer write_timer_;  // the write in progress (writes_-th) must be complete when it fires
  uint64_t writes_ = 0;
  uint8_t hdr_[proto::kFrameHeader] = {};
  size_t hdr_have_ = 0;    // bytes of the length prefix read so far
  uint32_t frame_len_ = 0;  // the frame's declared length
  uint64_t frames_ = 0;     // frames read whole (the timer's handler checks it is still this one's)
  std::vector<uint8_t> body_;  // what arrived of it
  bool in_frame_ = false;      // a frame's first byte has arrived, not yet its last
  std::vector<uint8_t> held_;  // a whole request frame waiting for the previous response's writes
  bool draining_ = false;
};

}  // namespace

std::shared_ptr<Connection> make_binary_session(tcp::socket&& s, Server::Impl& srv) {
  return std::make_shared<BinSession>(std::move(s), srv);
}

}  // namespace ft::server
