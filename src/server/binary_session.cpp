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
class BinSession : public Session<std::string>, public std::enable_shared_from_this<BinSession> {
 public:
  BinSession(tcp::socket&& s, Server::Impl& srv) : Session(srv), sock_(std::move(s)) {}
  net::any_io_executor executor() override { return sock_.get_executor(); }
  void start() override { read_header(); }
  void on_shutdown() override {
    draining_ = true;
    if (!gen_ && outq_.empty()) close();
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
    net::async_read(sock_, net::buffer(hdr_), [self = shared_from_this()](error_code ec, size_t) {
      self->on_header(ec);
    });
  }
  void on_header(error_code ec) {
    if (ec) return gone();
    const uint32_t n = proto::frame_length(hdr_);
    if (n == 0 || n > srv_.cfg.max_body_bytes) {
      spdlog::warn("binary protocol: bad frame length {} (1 .. {}); closing the connection", n, srv_.cfg.max_body_bytes);
      return gone();
    }
    body_.resize(n);
    net::async_read(sock_, net::buffer(body_), [self = shared_from_this()](error_code e, size_t) {
      self->on_body(e);
    });
  }
  void on_body(error_code ec) {
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
    gen_ = Generation::start(srv_.gen, io_tokenizer(), std::move(g), std::make_shared<Reply>(*this, req.stream),
                             post_to(shared_from_this()));
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
    net::async_write(sock_, net::buffer(wbuf_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->gone();
      self->write_next();
    });
  }

  void close_transport() override {
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }

  tcp::socket sock_;
  uint8_t hdr_[proto::kFrameHeader] = {};
  std::vector<uint8_t> body_;
  bool draining_ = false;
};

}  // namespace

std::shared_ptr<Connection> make_binary_session(tcp::socket&& s, Server::Impl& srv) {
  return std::make_shared<BinSession>(std::move(s), srv);
}

}  // namespace ft::server
