// The HTTP/1.1 front end of the engine (Boost.Beast/Asio) and the binary protocol's, both over
// the one generation path (generation.h). Files: server.cpp (this class: threads, listeners,
// shutdown), listener.cpp (accepting), routes.cpp (the route table and its handlers),
// http_session.cpp and binary_session.cpp (one connection each), server_impl.h (what they share).
//
// Threads: `http_threads` I/O threads run one io_context; each connection is a session on its own
// strand. An I/O thread parses, validates and tokenizes a request (with its own Tokenizer copy),
// then submits it to the Engine. The engine thread's callback only copies the event and posts it
// to the session's strand (never blocks); the strand decodes text (StreamDecoder), matches stop
// strings and queues bytes on the socket: each SSE chunk or frame is written as soon as its token
// arrives, with TCP_NODELAY so no Nagle delay holds it back.
//
// Shutdown (SIGINT/SIGTERM): stop accepting, close idle connections, answer new requests on open
// connections with 503, let in-flight requests finish; after shutdown_timeout_s cancel the rest
// (streams get an SSE error event, others a 503 error body); exit when no session is left.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/grammar.h"
#include "server/config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ft::server {

struct ServedModel {
  const Model* model = nullptr;
  const Tokenizer* tokenizer = nullptr;  // immutable; copied once per I/O thread
  std::string id;                        // what clients send as "model"
  ChatTemplate chat;
  // Chat responses split R1-style reasoning into reasoning_content (ReasoningSplit), open at the
  // output's start when the request's rendered prompt ends with "<think>" (Generation::opens_reasoning).
  bool reasoning = false;
  // The chat template is gpt-oss's harmony (ChatTemplate::harmony): chat-like requests are
  // generated with their control tokens as text and split by channel (HarmonySplit): analysis ->
  // reasoning_content (raw, markup and all, in content when !reasoning: --reasoning-format none),
  // final -> content, commentary to=functions.NAME -> a tool call.
  bool harmony = false;
  Pooling pooling = Pooling::Last;  // /v1/embeddings' (resolve_pooling)
  std::string chat_template_source = {};  // the Jinja source chat renders with ("": a built-in format); GET /props
  std::vector<std::string> aliases = {};  // other names clients may send for id (answers name id)
  uint64_t grammar_mask_work = GrammarMatcher::kMaxMaskWork;  // GenerationContext's (tests lower it)
};

// The pooling of /v1/embeddings: setting "mean" | "cls" | "last", or "auto": the file's
// <arch>.pooling_type (llama.cpp's numbering: 1 mean, 2 cls, 3 last), else last (what vLLM pools
// a generative model's embeddings with; also, with a warning, for the file's none or rank).
// ft::Error on another setting.
Pooling resolve_pooling(const std::string& setting, const Model& model);

class Server {
 public:
  Server(Engine& engine, const ServedModel& model, const ServeConfig& cfg);
  ~Server();
  // Binds, serves until SIGINT/SIGTERM (or stop()), drains, returns 0. Throws ft::Error when it
  // cannot listen. Also serves the binary protocol (client/binary_proto.h) when cfg.binary_port > 0
  // or cfg.binary_port_any.
  int run();
  // From any thread: shut down as on SIGTERM (run() returns once drained).
  void stop();
  // The bound ports once run() is listening (0 before, or when the binary protocol is off).
  int port() const;
  int binary_port() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft::server
