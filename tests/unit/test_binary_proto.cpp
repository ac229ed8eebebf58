// The binary protocol (proto/firsttoken.fbs, src/client): the frame codec on its own (round
// trips, and the Verifier refusing malformed bytes), then a server running in this process on
// stories260K driven by the C++ client: greedy text equals the golden continuation (streamed and
// not, text and token-id prompts), errors as a last frame, and malformed frames closing only
// their own connection while another stream completes. The same server's HTTP front end takes
// a batched completions request (HttpBatchedPrompts: here so that the sanitizers run it).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "client/binary_client.h"
#include "client/binary_proto.h"
#include "proto/firsttoken_generated.h"  // flatc's output: to build frames that leave fields out
#include "core/error.h"
#include "engine/engine.h"
#include "server/server.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ft {
namespace {

using json = nlohmann::json;

// The bytes after a frame's length header.
std::vector<uint8_t> body_of(const std::string& frame) {
  EXPECT_GE(frame.size(), proto::kFrameHeader);
  EXPECT_EQ(proto::frame_length(reinterpret_cast<const uint8_t*>(frame.data())), frame.size() - proto::kFrameHeader);
  return {frame.begin() + proto::kFrameHeader, frame.end()};
}

TEST(BinaryProtoCodec, RequestRoundTrip) {
  proto::Request r;
  r.text = "Once upon a time";
  r.add_bos = false;
  r.sampling.temperature = 0.5f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.9f;
  r.sampling.min_p = 0.05f;
  r.sampling.repetition_penalty = 1.1f;
  r.sampling.presence_penalty = 0.5f;
  r.sampling.frequency_penalty = -0.5f;
  r.sampling.seed = 0xFFFFFFFFFFFFull;
  r.sampling.typical_p = 0.7f;
  r.sampling.dynatemp_range = 0.3f;
  r.sampling.dynatemp_exponent = 2.0f;
  r.sampling.mirostat = 2;
  r.sampling.mirostat_tau = 4.0f;
  r.sampling.mirostat_eta = 0.2f;
  r.sampling.min_keep = 3;
  r.sampling.penalty_last_n = -1;
  r.seed_set = true;
  r.max_tokens = 1000;
  r.stop = {"\n", "The end"};
  r.stream = false;
  r.ignore_eos = true;
  r.logprobs = 5;
  const auto b = body_of(proto::encode_request(r));
  proto::Request d;
  ASSERT_TRUE(proto::decode_request(b.data(), b.size(), d));
  EXPECT_TRUE(d.tokens.empty());
  EXPECT_EQ(d.text, r.text);
  EXPECT_FALSE(d.add_bos);
  EXPECT_EQ(d.sampling.temperature, 0.5f);
  EXPECT_EQ(d.sampling.top_k, 40);
  EXPECT_EQ(d.sampling.top_p, 0.9f);
  EXPECT_EQ(d.sampling.min_p, 0.05f);
  EXPECT_EQ(d.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(d.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(d.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(d.sampling.seed, r.sampling.seed);
  EXPECT_EQ(d.sampling, r.sampling);  // every field, llama.cpp's samplers included
  EXPECT_TRUE(d.seed_set);
  EXPECT_EQ(d.max_tokens, 1000);
  EXPECT_EQ(d.stop, r.stop);
  EXPECT_FALSE(d.stream);
  EXPECT_TRUE(d.ignore_eos);
  EXPECT_EQ(d.logprobs, 5);

  proto::Request t;
  t.tokens = {1, 403, 407, 261, 378};
  const auto bt = body_of(proto::encode_request(t));
  ASSERT_TRUE(proto::decode_request(bt.data(), bt.size(), d));
  EXPECT_EQ(d.tokens, t.tokens);
  EXPECT_TRUE(d.text.empty());
  EXPECT_EQ(d.max_tokens, 16);  // the schema's defaults
  EXPECT_TRUE(d.stream);
  EXPECT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_FALSE(d.seed_set);
  EXPECT_EQ(d.logprobs, -1);  // off
}

// A request that leaves sampling fields out gets the binary profile the server documents
// (engine/sampler.h): the schema's sampling fields are optional (no defaults of their own), so a
// default changes in one line of sampler.h.
TEST(BinaryProtoCodec, SchemaDefaultsAreTheBinaryProfile) {
  flatbuffers::FlatBufferBuilder b;
  const auto sampling = fbs::CreateSampling(b);  // every field at its default: none is stored
  const auto text = b.CreateString("x");
  b.Finish(fbs::CreateRequest(b, 0, text, true, sampling));
  proto::Request d;
  ASSERT_TRUE(proto::decode_request(b.GetBufferPointer(), b.GetSize(), d));
  EXPECT_TRUE(d.sampling == kBinarySampling);
  EXPECT_FALSE(d.seed_set);
  EXPECT_TRUE(proto::Request{}.sampling == kBinarySampling);
  EXPECT_EQ(d.max_tokens, proto::Request{}.max_tokens);
  EXPECT_EQ(d.logprobs, proto::Request{}.logprobs);
  EXPECT_EQ(d.stream, proto::Request{}.stream);
}

TEST(BinaryProtoCodec, ResponseRoundTrip) {
  proto::Response r;
  r.tokens = {432};
  r.text = ", there";
  const auto b = body_of(proto::encode_response(r));
  proto::Response d;
  ASSERT_TRUE(proto::decode_response(b.data(), b.size(), d));
  EXPECT_EQ(d.tokens, r.tokens);
  EXPECT_EQ(d.text, r.text);
  EXPECT_FALSE(d.last);
  EXPECT_EQ(d.finish, "");
  EXPECT_TRUE(d.logprobs.empty());

  proto::Response l;
  l.tokens = {432, 7};
  l.logprobs = {{432, -0.25f, {{432, -0.25f}, {9, -1.5f}}}, {7, -3.0f, {}}};
  const auto bl = body_of(proto::encode_response(l));
  ASSERT_TRUE(proto::decode_response(bl.data(), bl.size(), d));
  ASSERT_EQ(d.logprobs.size(), 2u);
  EXPECT_EQ(d.logprobs[0].token, 432);
  EXPECT_EQ(d.logprobs[0].logprob, -0.25f);
  EXPECT_EQ(d.logprobs[0].top, (std::vector<std::pair<int32_t, float>>{{432, -0.25f}, {9, -1.5f}}));
  EXPECT_EQ(d.logprobs[1].token, 7);
  EXPECT_EQ(d.logprobs[1].logprob, -3.0f);
  EXPECT_TRUE(d.logprobs[1].top.empty());

  proto::Response f;
  f.last = true;
  f.finish = "length";
  f.prompt_tokens = 5;
  f.completion_tokens = 100;
  f.timings = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  const auto bf = body_of(proto::encode_response(f));
  ASSERT_TRUE(proto::decode_response(bf.data(), bf.size(), d));
  EXPECT_TRUE(d.last);
  EXPECT_EQ(d.finish, "length");
  EXPECT_EQ(d.prompt_tokens, 5);
  EXPECT_EQ(d.completion_tokens, 100);
  EXPECT_EQ(d.timings.ttft, 0.4);
  EXPECT_EQ(d.timings.total, 0.6);
  EXPECT_TRUE(d.error.empty());

  // Text is UTF-8 on the wire: a character cut at the end, a lone byte token, an overlong form
  // and a surrogate each become U+FFFD a byte; well-formed text passes unchanged.
  proto::Response u;
  u.text = "a\xE2\x82|\xFF|\xC0\xAF|\xED\xA0\x80|é日😀";
  const auto bu = body_of(proto::encode_response(u));
  ASSERT_TRUE(proto::decode_response(bu.data(), bu.size(), d));
  const std::string r1 = "\xEF\xBF\xBD";
  EXPECT_EQ(d.text, "a" + r1 + r1 + "|" + r1 + "|" + r1 + r1 + "|" + r1 + r1 + r1 + "|é日😀");

  proto::Response e;
  e.last = true;
  e.finish = "error";
  e.error = "max_tokens must be >= 1";
  const auto be = body_of(proto::encode_response(e));
  ASSERT_TRUE(proto::decode_response(be.data(), be.size(), d));
  EXPECT_EQ(d.finish, "error");
  EXPECT_EQ(d.error, e.error);
}

TEST(BinaryProtoCodec, VerifierRefusesMalformedBytes) {
  proto::Request d;
  EXPECT_FALSE(proto::decode_request(nullptr, 0, d));
  const uint8_t tiny[2] = {1, 2};
  EXPECT_FALSE(proto::decode_request(tiny, sizeof tiny, d));
  std::vector<uint8_t> garbage(64, 0xFF);
  EXPECT_FALSE(proto::decode_request(garbage.data(), garbage.size(), d));
  proto::Request r;
  r.text = "hello";
  r.stop = {"x"};
  const auto b = body_of(proto::encode_request(r));
  // Truncations fail (cutting only trailing padding may pass) and never read out of bounds;
  // random byte flips never crash (ASan checks the reads).
  for (size_t n = 0; n < b.size(); ++n) {
    const std::vector<uint8_t> cut(b.begin(), b.begin() + ptrdiff_t(n));  // exact size for ASan
    const bool ok = proto::decode_request(cut.data(), cut.size(), d);
    if (n < b.size() / 2) {
      EXPECT_FALSE(ok) << n;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    auto m = b;
    for (int k = 0; k < 3; ++k) m[rng() % m.size()] = uint8_t(rng());
    (void)proto::decode_request(m.data(), m.size(), d);
    proto::Response resp;
    (void)proto::decode_response(m.data(), m.size(), resp);
  }
}

// The Verifier lets many vector entries share one string or table: a 128 KB request of 16K
// references to one 64 KB stop string decoded into 1 GB (4.75 s of an I/O thread), and a
// response's logprobs could share one `top` vector the same way (a hostile server against the
// client). What a frame decodes into is bounded by its own size (kMaxDecodeGrowth); honest frames
// with every stop string and many default-valued logprob entries still decode.
// A server that takes no connection (its accept queue full: Linux drops further SYNs) fails the
// client's connect within its timeout, not after the kernel's ~2 minutes of retries.
TEST(BinaryClientConnect, TimesOutOnAServerThatDoesNotAnswer) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(::listen(lfd, 0), 0);
  const int port = ntohs(a.sin_port);
  std::vector<std::unique_ptr<client::BinaryClient>> fill;  // the accept queue's places, never accepted
  const auto t0 = std::chrono::steady_clock::now();
  bool timed_out = false;
  for (int i = 0; i < 8 && !timed_out; ++i) {
    try {
      fill.push_back(std::make_unique<client::BinaryClient>("127.0.0.1", port, 0.3));
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
      timed_out = true;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(lfd);
  EXPECT_TRUE(timed_out) << fill.size() << " connections to a listener that accepts none";
  EXPECT_LT(s, 5.0);
}

TEST(BinaryProtoCodec, SharedReferencesAreBoundedByTheFrame) {
  namespace fb = flatbuffers;
  {
    fb::FlatBufferBuilder b;
    const auto str = b.CreateString(std::string(64 << 10, 's'));
    const std::vector<fb::Offset<fb::String>> refs(16384, str);
    const auto stop = b.CreateVector(refs);
    fbs::RequestBuilder rb(b);
    rb.add_stop(stop);
    b.Finish(rb.Finish());
    proto::Request d;
    EXPECT_FALSE(proto::decode_request(b.GetBufferPointer(), b.GetSize(), d));
    EXPECT_TRUE(d.stop.size() < 16384u);
  }
  {
    fb::FlatBufferBuilder b;
    const std::vector<fbs::Alternative> alts(4096, fbs::Alternative(1, -1.0f));
    const auto top = b.CreateVectorOfStructs(alts);
    const auto entry = fbs::CreateTokenLogprob(b, 1, -0.5f, top);
    const std::vector<fb::Offset<fbs::TokenLogprob>> refs(4096, entry);
    const auto lp = b.CreateVector(refs);
    fbs::ResponseBuilder rb(b);
    rb.add_logprobs(lp);
    b.Finish(rb.Finish());
    proto::Response d;
    EXPECT_FALSE(proto::decode_response(b.GetBufferPointer(), b.GetSize(), d));
  }
  proto::Request r;
  for (int i = 0; i < 256; ++i) r.stop.push_back(i % 2 ? "" : "x");
  proto::Request d;
  const auto body = body_of(proto::encode_request(r));
  ASSERT_TRUE(proto::decode_request(body.data(), body.size(), d));
  EXPECT_EQ(d.stop, r.stop);
  proto::Response resp;
  resp.logprobs.resize(5000);
  for (TokenLogprobs& x : resp.logprobs) x.token = 0;  // token 0, logprob 0, no alternatives: every field left out
  proto::Response dr;
  const auto rbody = body_of(proto::encode_response(resp));
  ASSERT_TRUE(proto::decode_response(rbody.data(), rbody.size(), dr));
  EXPECT_EQ(dr.logprobs.size(), 5000u);
}

// --- through a running server ----------------------------------------------------------------
class BinaryServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::shared_file("models/stories260K.gguf");
    if (path.empty()) return;
    model_ = Model::load(path).release();
    tok_ = new Tokenizer(Tokenizer::from_gguf(model_->file()));
    EngineConfig ec;
    ec.runtime.threads = 1;
    ec.calibrate = false;
    engine_ = new Engine(*model_, ec, [](int32_t t) { return tok_->is_eog(t); });
    server::ServedModel sm{model_, tok_, "stories260K", ChatFormat::ChatML};
    server::ServeConfig cfg;
    cfg.port = 0;
    cfg.binary_port_any = true;
    cfg.http_threads = 2;
    cfg.shutdown_timeout_s = 5;
    server_ = new server::Server(*engine_, sm, cfg);
    thread_ = new std::thread([] { server_->run(); });
    for (int i = 0; i < 3000 && server_->binary_port() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  static void TearDownTestSuite() {
    if (!server_) return;
    server_->stop();
    thread_->join();
    delete thread_;
    delete server_;
    delete engine_;
    delete tok_;
    delete model_;
    server_ = nullptr;
  }
  void SetUp() override {
    FT_REQUIRE_SHARED(golden_path, "models/stories260K.golden.json");
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(server_->binary_port(), 0) << "the server did not start listening";
    const json doc = json::parse(test::read_file(golden_path));
    for (const json& c : doc["cases"])
      if (c["prompt"] == "Once upon a time") {
        const json toks = c["greedy_tokens"].is_string() ? json::parse(c["greedy_tokens"].get<std::string>()) : c["greedy_tokens"];
        const json prompt = c["prompt_tokens"].is_string() ? json::parse(c["prompt_tokens"].get<std::string>()) : c["prompt_tokens"];
        greedy_text_ = c["greedy_text"].get<std::string>();
        greedy_tokens_ = toks.get<std::vector<int32_t>>();
        prompt_tokens_ = prompt.get<std::vector<int32_t>>();
      }
    ASSERT_FALSE(greedy_text_.empty());
  }
  static proto::Request greedy(int64_t n) {
    proto::Request r;
    r.text = "Once upon a time";
    r.max_tokens = n;
    r.sampling.temperature = 0;
    return r;
  }
  int port() const { return server_->binary_port(); }

  static inline Model* model_ = nullptr;
  static inline Tokenizer* tok_ = nullptr;
  static inline Engine* engine_ = nullptr;
  static inline server::Server* server_ = nullptr;
  static inline std::thread* thread_ = nullptr;
  std::string greedy_text_;
  std::vector<int32_t> greedy_tokens_, prompt_tokens_;
};

// One HTTP/1.1 POST on a connection of its own (Connection: close): the response's status and
// body (raw: a stream's chunk framing included). abort_after > 0: the client leaves once that
// many bytes came.
std::pair<int, std::string> http_post(int port, const std::string& path, const std::string& body, size_t abort_after = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) close(fd);
    return {-1, ""};
  }
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n" +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t off = 0; off < req.size();) {
    const ssize_t n = send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += size_t(n);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) {
    out.append(buf, size_t(n));
    if (abort_after > 0 && out.size() >= abort_after) break;
  }
  close(fd);
  const size_t sp = out.find(' '), head = out.find("\r\n\r\n");
  if (sp == std::string::npos || head == std::string::npos) return {-1, out};
  return {std::atoi(out.c_str() + sp + 1), out.substr(head + 4)};
}
// The JSON of each SSE event in a streamed body ("data: {...}"; [DONE] left out).
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> ev;
  for (size_t at = 0; (at = body.find("data: {", at)) != std::string::npos;) {
    const size_t end = body.find("\n\n", at);
    ev.push_back(json::parse(body.substr(at + 6, end - at - 6)));
    at = end;
  }
  return ev;
}

// Completions' batched prompts through the HTTP front end (here under the sanitizers too): one
// generation per prompt, prompt i's choices at i*n.., each its prompt's single answer, streamed
// and not; a refused prompt refuses the whole request before anything runs; a client leaving a
// batched stream cancels every prompt's generation; the server goes on serving.
TEST_F(BinaryServer, HttpBatchedPrompts) {
  const int hp = server_->port();
  ASSERT_GT(hp, 0);
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog"};
  std::vector<std::string> single;
  for (const std::string& p : prompts) {
    const auto [st, body] = http_post(hp, "/v1/completions", json{{"model", "stories260K"}, {"prompt", p}, {"max_tokens", 12}, {"temperature", 0}}.dump());
    ASSERT_EQ(st, 200) << body;
    single.push_back(json::parse(body)["choices"][0]["text"]);
  }
  const json req = {{"model", "stories260K"}, {"prompt", prompts}, {"max_tokens", 12}, {"temperature", 0}, {"n", 2}};
  const auto [st, body] = http_post(hp, "/v1/completions", req.dump());
  ASSERT_EQ(st, 200) << body;
  const json r = json::parse(body);
  ASSERT_EQ(r["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r["choices"][i]["index"], i);
    EXPECT_EQ(r["choices"][i]["text"], single[size_t(i / 2)]) << i;
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 4 * 12);

  json sreq = req;
  sreq["stream"] = true;
  const auto [sst, sbody] = http_post(hp, "/v1/completions", sreq.dump());
  ASSERT_EQ(sst, 200);
  std::vector<std::string> text(4);
  int finishes = 0;
  for (const json& e : sse_events(sbody))
    for (const json& c : e["choices"]) {
      text[c["index"].get<size_t>()] += c["text"].get<std::string>();
      finishes += !c["finish_reason"].is_null();
    }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(text[size_t(i)], single[size_t(i / 2)]) << i;
  EXPECT_EQ(finishes, 4);

  // A prompt past the context refuses the request; nothing of it runs.
  const auto [bst, bbody] = http_post(hp, "/v1/completions",
                                      json{{"model", "stories260K"}, {"prompt", {prompt_tokens_, std::vector<int32_t>(size_t(engine_->n_ctx()) + 1, prompt_tokens_.back())}}, {"max_tokens", 4}}.dump());
  EXPECT_EQ(bst, 400) << bbody;
  // A client leaving a batched stream: every prompt's generation is cancelled.
  json leave = sreq;
  leave["max_tokens"] = 400;
  leave["ignore_eos"] = true;
  EXPECT_EQ(http_post(hp, "/v1/completions", leave.dump(), 3000).first, 200);
  for (int i = 0; i < 500 && engine_->metrics().running + engine_->metrics().waiting > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto [ast, abody] = http_post(hp, "/v1/completions", json{{"model", "stories260K"}, {"prompt", prompts[0]}, {"max_tokens", 12}, {"temperature", 0}}.dump());
  EXPECT_EQ(ast, 200);
  EXPECT_EQ(json::parse(abody)["choices"][0]["text"], single[0]);
}

// Embeddings on both front ends (here so that the sanitizers run them): the binary protocol's
// final frame carries the same unit vector as /v1/embeddings for the same text, and from ids;
// a batched HTTP request of several inputs gives each what it gives alone.
TEST_F(BinaryServer, EmbeddingsOnBothFrontEnds) {
  client::BinaryClient c("127.0.0.1", port(), 60);
  proto::Request r;
  r.text = "Once upon a time";
  r.embed = true;
  r.stream = true;
  int frames = 0;
  const proto::Response last = c.generate(r, [&](const proto::Response&) { ++frames; });
  ASSERT_TRUE(last.error.empty()) << last.error;
  EXPECT_EQ(frames, 1);  // the final frame alone: nothing is generated
  EXPECT_EQ(last.finish, "stop");
  EXPECT_EQ(last.completion_tokens, 0);
  ASSERT_EQ(last.embedding.size(), size_t(model_->hparams().dim));
  double norm = 0;
  for (float x : last.embedding) norm += double(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-5);
  proto::Request ids = r;
  ids.text.clear();
  ids.tokens = tok_->encode("Once upon a time", true, true);
  EXPECT_EQ(c.generate(ids).embedding, last.embedding);

  const int hp = server_->port();
  const std::vector<std::string> inputs = {"The little dog", "Once upon a time", "A"};
  const auto [st, body] = http_post(hp, "/v1/embeddings", json{{"input", inputs}, {"encoding_format", "float"}}.dump());
  ASSERT_EQ(st, 200) << body;
  const json j = json::parse(body);
  ASSERT_EQ(j["data"].size(), 3u);
  EXPECT_EQ(j["data"][1]["embedding"].get<std::vector<float>>(), last.embedding);
  for (size_t i = 0; i < inputs.size(); ++i) {
    proto::Request one = r;
    one.text = inputs[i];
    EXPECT_EQ(j["data"][i]["embedding"].get<std::vector<float>>(), c.generate(one).embedding) << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<int64_t>(), j["usage"]["total_tokens"].get<int64_t>());
}

TEST_F(BinaryServer, StreamedGreedyTextEqualsGolden) {
  client::BinaryClient c("127.0.0.1", port(), 60);
  std::string text;
  std::vector<int32_t> tokens;
  int frames = 0;
  const proto::Response last = c.generate(greedy(100), [&](const proto::Response& r) {
    ++frames;
    text += r.text;
    tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
  });
  EXPECT_TRUE(last.error.empty()) << last.error;
  EXPECT_EQ(text, greedy_text_);
  ASSERT_GE(greedy_tokens_.size(), 100u);
  EXPECT_EQ(tokens, std::vector<int32_t>(greedy_tokens_.begin(), greedy_tokens_.begin() + 100));
  EXPECT_GE(frames, 100);  // a frame per token, then the last one
  EXPECT_EQ(last.finish, "length");
  EXPECT_EQ(last.prompt_tokens, int64_t(prompt_tokens_.size()));
  EXPECT_EQ(last.completion_tokens, 100);
  EXPECT_GT(last.timings.ttft, 0);
  EXPECT_GE(last.timings.total, last.timings.ttft);
}

TEST_F(BinaryServer, NonStreamedFromTokenIdsAndSequentialRequests) {
  client::BinaryClient c("127.0.0.1", port(), 60);
  proto::Request r = greedy(100);
  r.text.clear();
  r.tokens = prompt_tokens_;
  r.stream = false;
  int frames = 0;
  const proto::Response last = c.generate(r, [&](const proto::Response&) { ++frames; });
  EXPECT_EQ(frames, 1);
  EXPECT_EQ(last.text, greedy_text_);
  EXPECT_EQ(last.tokens.size(), 100u);
  // The same connection serves the next request.
  const proto::Response again = c.generate(greedy(5));
  EXPECT_EQ(again.completion_tokens, 5);
  EXPECT_EQ(again.text, greedy_text_.substr(0, again.text.size()));
}

TEST_F(BinaryServer, ErrorsAreALastFrameAndTheConnectionStaysUsable) {
  client::BinaryClient c("127.0.0.1", port(), 60);
  proto::Request too_long = greedy(100000);
  proto::Response r = c.generate(too_long);
  EXPECT_TRUE(r.last);
  EXPECT_EQ(r.finish, "error");
  EXPECT_NE(r.error.find("max_tokens"), std::string::npos) << r.error;
  proto::Request bad_token = greedy(5);
  bad_token.text.clear();
  bad_token.tokens = {1, 99999};
  r = c.generate(bad_token);
  EXPECT_NE(r.error.find("out of range"), std::string::npos) << r.error;
  proto::Request bad_temp = greedy(5);
  bad_temp.sampling.temperature = -1;
  r = c.generate(bad_temp);
  EXPECT_NE(r.error.find("temperature"), std::string::npos) << r.error;
  r = c.generate(greedy(3));
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.completion_tokens, 3);
}

// Each token's logprob and its best alternatives, on every frame (stream) or the last one: one
// entry per token, greedy's choice is the best alternative, and the alternatives are ordered.
TEST_F(BinaryServer, ReturnsLogprobs) {
  client::BinaryClient c("127.0.0.1", port(), 60);
  for (const bool stream : {true, false}) {
    proto::Request r = greedy(20);
    r.stream = stream;
    r.logprobs = 3;
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> lps;
    const proto::Response last = c.generate(r, [&](const proto::Response& f) {
      EXPECT_EQ(f.logprobs.size(), f.tokens.size());
      tokens.insert(tokens.end(), f.tokens.begin(), f.tokens.end());
      lps.insert(lps.end(), f.logprobs.begin(), f.logprobs.end());
    });
    ASSERT_TRUE(last.error.empty()) << last.error;
    EXPECT_EQ(tokens, std::vector<int32_t>(greedy_tokens_.begin(), greedy_tokens_.begin() + 20));
    ASSERT_EQ(lps.size(), tokens.size());
    for (size_t i = 0; i < lps.size(); ++i) {
      EXPECT_EQ(lps[i].token, tokens[i]);
      EXPECT_LE(lps[i].logprob, 0.0f);
      ASSERT_EQ(lps[i].top.size(), 3u);
      EXPECT_EQ(lps[i].top[0].first, tokens[i]) << "greedy takes the best";
      EXPECT_FLOAT_EQ(lps[i].top[0].second, lps[i].logprob);
      EXPECT_GE(lps[i].top[0].second, lps[i].top[1].second);
      EXPECT_GE(lps[i].top[1].second, lps[i].top[2].second);
    }
  }
  // Not asked: none.
  const proto::Response plain = c.generate(greedy(3));
  EXPECT_TRUE(plain.logprobs.empty());
  proto::Request bad = greedy(3);
  bad.logprobs = 21;
  EXPECT_NE(c.generate(bad).error.find("logprobs"), std::string::npos);
}

// max_tokens is any int64 on the wire: near INT64_MAX it is refused, not overflowed.
TEST_F(BinaryServer, HugeMaxTokensIsAnError) {
  client::BinaryClient c("127.0.0.1", port(), 60);
  for (const int64_t n : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 1,
                          std::numeric_limits<int64_t>::min()}) {
    const proto::Response r = c.generate(greedy(n));
    EXPECT_EQ(r.finish, "error") << n;
    EXPECT_NE(r.error.find("max_tokens"), std::string::npos) << r.error;
  }
  EXPECT_EQ(c.generate(greedy(2)).completion_tokens, 2);
}

TEST_F(BinaryServer, MalformedFramesCloseOnlyTheirConnection) {
  // A stream in progress on another connection...
  client::BinaryClient streaming("127.0.0.1", port(), 60);
  streaming.send_raw(proto::encode_request(greedy(100)));
  proto::Response first;
  ASSERT_TRUE(streaming.read_frame(first));
  std::string text = first.text;

  auto expect_closed = [&](const std::string& bytes, const char* what) {
    client::BinaryClient bad("127.0.0.1", port(), 30);
    bad.send_raw(bytes);
    proto::Response r;
    bool open = true;
    try {
      open = bad.read_frame(r);
    } catch (const Error&) {
      open = false;  // a reset reads as an error: closed all the same
    }
    EXPECT_FALSE(open) << what;
  };
  expect_closed(std::string("\0\0\0\0", 4), "zero length");
  expect_closed(std::string("\xFF\xFF\xFF\x7F", 4), "length over the limit");
  std::string garbage = std::string("\x10\0\0\0", 4) + std::string(16, '\xAB');
  expect_closed(garbage, "not a FlatBuffer");
  std::string req = proto::encode_request(greedy(5));
  req[proto::kFrameHeader] = '\xFF';  // the root offset points outside the buffer
  req[proto::kFrameHeader + 1] = '\xFF';
  expect_closed(req, "bad root offset");

  // ... completes, untouched.
  proto::Response r;
  while (!r.last) {
    ASSERT_TRUE(streaming.read_frame(r));
    text += r.text;
  }
  EXPECT_EQ(text, greedy_text_);
  EXPECT_EQ(r.finish, "length");
  // And the server still answers new connections.
  client::BinaryClient after("127.0.0.1", port(), 60);
  EXPECT_EQ(after.generate(greedy(4)).completion_tokens, 4);
}

TEST_F(BinaryServer, ClientLeavingMidStreamDoesNotDisturbOthers) {
  {
    client::BinaryClient leaving("127.0.0.1", port(), 60);
    leaving.send_raw(proto::encode_request(greedy(400)));
    proto::Response r;
    ASSERT_TRUE(leaving.read_frame(r));
  }  // closed mid-stream: its request is cancelled
  client::BinaryClient c("127.0.0.1", port(), 60);
  std::string text;
  const proto::Response r = c.generate(greedy(100), [&](const proto::Response& f) { text += f.text; });
  EXPECT_EQ(text, greedy_text_);
  EXPECT_EQ(r.finish, "length");
  EXPECT_EQ(r.completion_tokens, 100);
}

// --- limits: memory as bytes arrive, the frame timeout, connections per listener ---------------

int connect_tcp(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}
void send_all(int fd, const std::string& b) { EXPECT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size())); }
// True when the peer closes fd (EOF or reset) within timeout_s.
bool closed_by_peer(int fd, double timeout_s) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, int(timeout_s * 1000)) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, 0) <= 0;
}
std::string http_get(int port, const std::string& path) {
  const int fd = connect_tcp(port);
  send_all(fd, "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
  ::close(fd);
  return out;
}
int64_t rss_bytes() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}
// The value of one sample line ("name{labels} value") in a /metrics page, or -1.
double metric(const std::string& page, const std::string& sample) {
  const size_t at = page.find("\n" + sample + " ");
  return at == std::string::npos ? -1 : std::stod(page.substr(at + sample.size() + 2));
}

// A server with its own limits, on an engine of its own (a server shuts its engine down when it
// stops).
class LimitedServer {
 public:
  LimitedServer(const Model& model, const Tokenizer& tok, server::ServeConfig cfg) {
    EngineConfig ec;
    ec.runtime.threads = 1;
    ec.calibrate = false;
    engine_ = std::make_unique<Engine>(model, ec, [&tok](int32_t t) { return tok.is_eog(t); });
    const server::ServedModel m{&model, &tok, "stories260K", ChatFormat::ChatML};
    cfg.port = 0;
    cfg.binary_port_any = true;
    cfg.http_threads = 2;
    cfg.shutdown_timeout_s = 1;
    server_ = std::make_unique<server::Server>(*engine_, m, cfg);
    thread_ = std::thread([this] { server_->run(); });
    for (int i = 0; i < 3000 && server_->binary_port() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~LimitedServer() {
    server_->stop();
    thread_.join();
  }
  server::Server& operator*() { return *server_; }

 private:
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
};

// A length prefix claims 4 MiB; only what arrives is held, and a frame that does not complete in
// frame_timeout_s closes its connection (counted in /metrics). 40 such connections held 160 MiB
// before: the whole declared length was allocated (and zeroed) at the prefix.
TEST_F(BinaryServer, PartialFramesHoldOnlyTheirBytesAndTimeOut) {
  server::ServeConfig cfg;
  cfg.frame_timeout_s = 1.5;
  LimitedServer srv(*model_, *tok_, cfg);
  ASSERT_GT((*srv).binary_port(), 0);
  std::string prefix(proto::kFrameHeader, '\0');
  proto::put_frame_length(reinterpret_cast<uint8_t*>(prefix.data()), uint32_t(cfg.max_body_bytes));
  const int64_t rss0 = rss_bytes();
  std::vector<int> fds;
  for (int i = 0; i < 40; ++i) {
    fds.push_back(connect_tcp((*srv).binary_port()));
    send_all(fds.back(), prefix + std::string(100, 'x'));
  }
  const int partial_header = connect_tcp((*srv).binary_port());  // the prefix itself may stall
  send_all(partial_header, prefix.substr(0, 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(rss_bytes() - rss0, int64_t(40) << 20);
  const auto t0 = std::chrono::steady_clock::now();
  for (const int fd : fds) EXPECT_TRUE(closed_by_peer(fd, 10)) << "a stalled frame was not timed out";
  EXPECT_TRUE(closed_by_peer(partial_header, 10)) << "a stalled length prefix was not timed out";
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
  for (const int fd : fds) ::close(fd);
  ::close(partial_header);
  EXPECT_EQ(metric(http_get((*srv).port(), "/metrics"), "firsttoken:binary_frame_timeouts_total"), 41);
  // A client that sends its frame in pieces, slower than one read but within the timeout, is served.
  client::BinaryClient c("127.0.0.1", (*srv).binary_port(), 60);
  const std::string frame = proto::encode_request(greedy(3));
  c.send_raw(frame.substr(0, 3));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.send_raw(frame.substr(3, 10));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.send_raw(frame.substr(13));
  proto::Response r;
  while (!r.last) ASSERT_TRUE(c.read_frame(r));
  EXPECT_EQ(r.completion_tokens, 3);
}

// A stream that lasts longer than write_timeout_s completes: the read that watches for a
// disconnect has no timeout of its own (it kept the expiry of the response head's write, and
// closed every stream longer than write_timeout_s, 60 s by default).
TEST_F(BinaryServer, HttpStreamOutlastsTheWriteTimeout) {
  server::ServeConfig cfg;
  cfg.write_timeout_s = 0.05;  // (3,000 tokens: ~0.4 s in Release, ~8 s under ASan)
  LimitedServer srv(*model_, *tok_, cfg);
  ASSERT_GT((*srv).port(), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const auto [st, body] = http_post((*srv).port(), "/v1/completions",
                                    json{{"model", "stories260K"}, {"prompt", "Once upon a time"}, {"n", 4},
                                         {"max_tokens", 750}, {"ignore_eos", true}, {"stream", true}}.dump());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(st, 200);
  EXPECT_GT(secs, 3 * cfg.write_timeout_s) << "the stream was too short to test the timeout";
  int finished = 0;
  for (const json& ev : sse_events(body))
    for (const json& c : ev["choices"]) finished += c["finish_reason"] == "length";
  EXPECT_EQ(finished, 4);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos);
}

// Each listener holds at most max_connections: one more is refused at accept and counted (HTTP:
// answered 503 + Retry-After, then closed; binary: closed); a slot that frees up is taken again.
TEST_F(BinaryServer, ConnectionsPerListenerAreCapped) {
  server::ServeConfig cfg;
  cfg.max_connections = 3;
  LimitedServer srv(*model_, *tok_, cfg);
  ASSERT_GT((*srv).binary_port(), 0);
  for (const int port : {(*srv).binary_port(), (*srv).port()}) {
    std::vector<int> held;
    for (int i = 0; i < 3; ++i) held.push_back(connect_tcp(port));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // accepted
    if (port == (*srv).port()) {
      const std::string answer = http_get(port, "/health");  // reads to EOF
      EXPECT_EQ(answer.rfind("HTTP/1.1 503 ", 0), 0u) << answer;
      EXPECT_NE(answer.find("\r\nRetry-After: 1\r\n"), std::string::npos) << answer;
      EXPECT_NE(answer.find("too_many_connections"), std::string::npos) << answer;
    } else {
      const int extra = connect_tcp(port);
      EXPECT_TRUE(closed_by_peer(extra, 5)) << port;
      ::close(extra);
    }
    for (const int fd : held) EXPECT_FALSE(closed_by_peer(fd, 0.05)) << port;
    for (const int fd : held) ::close(fd);
  }
  // The binary listener serves again once its connections are gone.
  std::string page;
  for (int i = 0; i < 100; ++i) {
    page = http_get((*srv).port(), "/metrics");
    if (metric(page, "firsttoken:connections_open{listener=\"http\"}") == 1 &&
        metric(page, "firsttoken:connections_open{listener=\"binary\"}") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(metric(page, "firsttoken:connections_open{listener=\"binary\"}"), 0) << page;
  EXPECT_EQ(metric(page, "firsttoken:connections_open{listener=\"http\"}"), 1) << page;  // this one
  EXPECT_EQ(metric(page, "firsttoken:connections_refused_total{listener=\"binary\"}"), 1) << page;
  // At least the one above: a poll that came before the server saw its held connections close
  // was refused too.
  EXPECT_GE(metric(page, "firsttoken:connections_refused_total{listener=\"http\"}"), 1) << page;
  client::BinaryClient c("127.0.0.1", (*srv).binary_port(), 60);
  const proto::Response r = c.generate(greedy(2));
  EXPECT_EQ(r.completion_tokens, 2) << r.finish << ": " << r.error;
}

// decode_* take the bytes wherever they are: one frame read into a larger buffer, right after its
// length prefix or anywhere, decodes the same (FlatBuffers reads in place; fuzz_binary_frame found
// UBSan's misaligned loads when the bytes were not 8-aligned).
TEST(BinaryProto, DecodesAtAnyAlignment) {
  proto::Request r;
  r.tokens = {1, 2, 3};
  r.max_tokens = 1234567890123;
  r.sampling.seed = 99;
  r.seed_set = true;
  proto::Response z;
  z.last = true;
  z.finish = "length";
  z.completion_tokens = 77;
  z.timings.total = 2.5;
  const std::string rq = proto::encode_request(r), rs = proto::encode_response(z);
  for (size_t shift = 0; shift < 8; ++shift) {
    std::vector<uint64_t> storage((rq.size() + rs.size()) / 8 + 2);
    uint8_t* at = reinterpret_cast<uint8_t*>(storage.data()) + shift;
    std::memcpy(at, rq.data(), rq.size());
    proto::Request d;
    ASSERT_TRUE(proto::decode_request(at + proto::kFrameHeader, rq.size() - proto::kFrameHeader, d)) << shift;
    EXPECT_EQ(d.max_tokens, r.max_tokens);
    EXPECT_EQ(d.sampling.seed, 99u);
    EXPECT_EQ(d.tokens, r.tokens);
    std::memcpy(at, rs.data(), rs.size());
    proto::Response e;
    ASSERT_TRUE(proto::decode_response(at + proto::kFrameHeader, rs.size() - proto::kFrameHeader, e)) << shift;
    EXPECT_EQ(e.completion_tokens, 77);
    EXPECT_EQ(e.timings.total, 2.5);
  }
}

// A request target that is not UTF-8 gets its 404 (it once ended the server: the error body
// threw on the I/O thread), and the server goes on.
TEST_F(BinaryServer, NonUtf8TargetIs404) {
  LimitedServer srv(*model_, *tok_, server::ServeConfig{});
  const std::string answer = http_get((*srv).port(), "/\xff\xfe");
  EXPECT_EQ(answer.rfind("HTTP/1.1 404 ", 0), 0u) << answer;
  EXPECT_EQ(http_get((*srv).port(), "/health").rfind("HTTP/1.1 200 ", 0), 0u);
}

// HEAD: a GET route's status and headers without the body, and a keep-alive connection goes on
// to the next response (a body after HEAD's head was read as the start of the next response).
// An idle binary connection is closed after header_timeout_s as an idle HTTP one is (idle
// binary connections held every connection slot for good); one between frames of a running
// exchange is not.
TEST_F(BinaryServer, HeadHasNoBodyAndIdleBinaryConnectionsClose) {
  server::ServeConfig cfg;
  cfg.header_timeout_s = 1.0;
  LimitedServer srv(*model_, *tok_, cfg);
  const int fd = connect_tcp((*srv).port());
  send_all(fd, "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nHEAD /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"
               "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, size_t(n));
  ::close(fd);
  const size_t h1 = out.find("\r\n\r\n"), h2 = out.find("\r\n\r\n", h1 + 4);
  ASSERT_NE(h2, std::string::npos) << out;
  EXPECT_EQ(out.rfind("HTTP/1.1 200 ", 0), 0u) << out;
  EXPECT_EQ(out.compare(h1 + 4, 9, "HTTP/1.1 "), 0) << "a body followed HEAD's head:\n" << out;
  EXPECT_EQ(out.compare(h1 + 4, 13, "HTTP/1.1 405 "), 0) << out;  // (POST only)
  EXPECT_EQ(out.compare(h2 + 4, 13, "HTTP/1.1 200 "), 0) << out;
  EXPECT_NE(out.find("{", h2), std::string::npos) << "GET's body";

  const auto t0 = std::chrono::steady_clock::now();
  const int idle = connect_tcp((*srv).binary_port());
  EXPECT_FALSE(closed_by_peer(idle, 0.5)) << "closed before it was idle for header_timeout_s";
  client::BinaryClient c("127.0.0.1", (*srv).binary_port(), 60);
  for (int i = 0; i < 4; ++i) {  // requests 0.3 s apart: never idle for the whole timeout
    c.send_raw(proto::encode_request(greedy(2)));
    proto::Response r;
    while (!r.last) ASSERT_TRUE(c.read_frame(r));
    EXPECT_EQ(r.completion_tokens, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_TRUE(closed_by_peer(idle, 10)) << "an idle binary connection was never closed";
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), cfg.header_timeout_s);
  ::close(idle);
}

}  // namespace
}  // namespace ft
