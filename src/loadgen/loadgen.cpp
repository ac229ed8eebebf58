#include "loadgen/loadgen.h"

#include <unistd.h>

#include <algorithm>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"

namespace ft::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Seconds as a timer offset, saturated to [0, 1e9 s] (~31 years; a steady_clock time point plus it
// stays far inside int64 nanoseconds): a larger double overflowed the cast, to a deadline in the past.
std::chrono::nanoseconds secs(double s) {
  constexpr double kMaxS = 1e9;
  if (!(s > 0)) return std::chrono::nanoseconds(0);  // (NaN too)
  if (s > kMaxS) s = kMaxS;
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s));
}
double since(Clock::time_point t0, Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); }

std::string error_kind(const beast::error_code& ec) {
  if (ec == beast::error::timeout) return "timeout";
  return "connection";
}

}  // namespace

std::vector<int32_t> prompt_token_ids(const PlannedRequest& p, const RequestClass& c, uint64_t salt,
                                      uint64_t request_index, int32_t lo, int32_t hi) {
  std::vector<int32_t> ids;
  ids.reserve(size_t(p.prompt_tokens));
  const uint64_t span = uint64_t(int64_t(hi) - lo + 1);  // (int64: 0:INT32_MAX overflowed int32)
  const uint64_t cls = uint64_t(p.class_index) + 1;
  std::seed_seq shared_seed{salt, salt >> 32, cls, uint64_t(0)};
  std::mt19937_64 shared(shared_seed);
  const int64_t n_shared = std::min(c.shared_prefix_tokens, p.prompt_tokens);
  for (int64_t i = 0; i < n_shared; ++i) ids.push_back(lo + int32_t(shared() % span));
  std::seed_seq own_seed{salt, salt >> 32, cls, request_index + 1, request_index >> 32};
  std::mt19937_64 own(own_seed);
  while (int64_t(ids.size()) < p.prompt_tokens) ids.push_back(lo + int32_t(own() % span));
  return ids;
}

std::string prompt_text(int64_t n) {
  std::string s;
  s.reserve(size_t(n) * 6);
  for (int64_t i = 0; i < n; ++i) s += i ? " hello" : "hello";
  return s;
}

HttpReply http_request(const ServerUrl& url, const std::string& method, const std::string& path,
                       const std::string& body, double timeout_s) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::request<http::string_body> req{http::string_to_verb(method), path, 11};
  req.set(http::field::host, url.host + ":" + url.port);
  req.set(http::field::user_agent, "firsttoken-bench");
  if (!body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  req.keep_alive(false);
  beast::error_code result;
  tcp::resolver resolver(io);
  const auto deadline = Clock::now() + secs(timeout_s);
  tcp::resolver::results_type eps;
  try {
    eps = resolver.resolve(url.host, url.port);
  } catch (const std::exception& e) {
    fail("cannot resolve ", url.str(), ": ", e.what());
  }
  stream.expires_at(deadline);
  stream.async_connect(eps, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      result = ec;
      return;
    }
    http::async_write(stream, req, [&](beast::error_code ec2, size_t) {
      if (ec2) {
        result = ec2;
        return;
      }
      http::async_read(stream, buf, res, [&](beast::error_code ec3, size_t) { result = ec3; });
    });
  });
  io.run();
  if (result == beast::error::timeout) fail("no answer from ", url.str(), path, " within ", timeout_s, " s");
  if (result) fail("cannot reach ", url.str(), path, ": ", result.message());
  return {int(res.result_int()), res.body()};
}

namespace {

struct Loadgen;

// One request on its own connection: connect, write, read the head, then the body piece by piece
// (chunked decoding by Beast's parser into a fixed buffer), SSE events timestamped per read.
struct Call : std::enable_shared_from_this<Call> {
  Loadgen& lg;
  size_t index;
  beast::tcp_stream stream;
  http::request<http::string_body> req;
  beast::flat_buffer buf;
  http::response_parser<http::buffer_body> parser;
  std::string error_body;
  char piece[16384];
  SseParser sse;
  Clock::time_point t0, last_chunk;
  bool done_seen = false;

  Call(Loadgen& l, size_t i, asio::io_context& io) : lg(l), index(i), stream(io) {}
  void start();
  void on_connect(beast::error_code ec);
  void on_write(beast::error_code ec);
  void on_header(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  void finish(const std::string& kind, const std::string& message);
};

struct Loadgen {
  const LoadgenOptions& opt;
  asio::io_context io;
  tcp::resolver::results_type endpoints;
  std::string model, route;
  uint64_t salt = 0;
  std::vector<PlannedRequest> plan;
  std::vector<RequestRecord> records;  // one per started request, index = Call::index
  std::vector<std::string> bodies;     // built before the run (no JSON work on the timing path)
  Clock::time_point t0;
  asio::steady_timer arrivals{io}, progress{io};
  size_t next = 0, in_flight = 0, finished = 0, errors = 0, total = 0;
  bool tty = isatty(STDERR_FILENO);
  double last_progress_line = -1e9;

  explicit Loadgen(const LoadgenOptions& o) : opt(o) {}

  std::string body_for(size_t i) {
    const PlannedRequest& p = plan[i % plan.size()];
    const RequestClass& c = opt.workload.classes[size_t(p.class_index)];
    nlohmann::json j = {{"model", model},
                        {"max_tokens", p.output_tokens},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
    if (opt.chat || opt.text_prompts) {
      // The shared part first, then a per-request tag so only the shared part can be cached.
      // The run's salt and the class lead, so prompts of other runs and classes share no prefix.
      const int64_t n_shared = std::min(c.shared_prefix_tokens, p.prompt_tokens);
      std::string text = "s" + std::to_string(salt % 1000000) + "c" + std::to_string(p.class_index);
      if (n_shared > 1) text += " " + prompt_text(n_shared - 1);
      text += " r" + std::to_string(i);
      if (p.prompt_tokens - std::max<int64_t>(n_shared, 1) > 1)
        text += " " + prompt_text(p.prompt_tokens - std::max<int64_t>(n_shared, 1) - 1);
      if (opt.chat) j["messages"] = {{{"role", "user"}, {"content", text}}};
      else j["prompt"] = text;
    } else {
      j["prompt"] = prompt_token_ids(p, c, salt, i, opt.token_lo, opt.token_hi);
    }
    return j.dump();
  }

  void launch() {
    const size_t i = records.size();
    const PlannedRequest& p = plan[i % plan.size()];
    RequestRecord r;
    r.class_index = p.class_index;
    r.scheduled_s = opt.concurrency > 0 ? since(t0, Clock::now()) : p.at_s;
    r.start_s = since(t0, Clock::now());
    r.prompt_tokens = p.prompt_tokens;
    r.max_tokens = p.output_tokens;
    records.push_back(r);
    ++in_flight;
    std::make_shared<Call>(*this, i, io)->start();
  }

  void schedule_arrivals() {
    const auto now = Clock::now();
    while (next < total && t0 + secs(plan[next].at_s) <= now) {
      ++next;
      launch();
    }
    if (next < total) {
      arrivals.expires_at(t0 + secs(plan[next].at_s));
      arrivals.async_wait([this](beast::error_code ec) {
        if (!ec) schedule_arrivals();
      });
    }
  }

  void on_finished() {
    --in_flight;
    ++finished;
    if (opt.concurrency > 0 && next < total && since(t0, Clock::now()) < opt.workload.duration_s) {
      ++next;
      launch();
    }
    if (opt.concurrency > 0 && in_flight == 0) next = total;  // out of time: nothing more starts
    if (all_done()) progress.cancel();
  }
  bool all_done() const { return next >= total && in_flight == 0; }

  void print_progress(bool final) {
    if (!opt.progress) return;
    const double el = since(t0, Clock::now());
    if (!tty && !final && el - last_progress_line < 10) return;  // a log file: a line per 10 s
    last_progress_line = el;
    std::fprintf(stderr, "%s[%7.1f/%.0f s] sent %zu/%zu  done %zu  in flight %zu  errors %zu%s",
                 tty ? "\r\033[K" : "", el, opt.workload.duration_s, records.size(), total, finished - errors,
                 in_flight, errors, tty && !final ? "" : "\n");
    std::fflush(stderr);
  }

  void tick() {
    print_progress(false);
    progress.expires_after(secs(opt.progress_tick_s));
    // (All done is checked here too: a cancel() does not reach a wait that has already
    // expired and whose handler is queued, which then re-armed the timer forever: io.run()
    // never returned. A 1 us tick hung every run, 250 ms about one run in ~200: tested.)
    progress.async_wait([this](beast::error_code ec) {
      if (!ec && !all_done()) tick();
    });
  }
};

void Call::start() {
  t0 = Clock::now();
  const auto& o = lg.opt;
  req = {http::verb::post, lg.route, 11};
  req.set(http::field::host, o.url.host + ":" + o.url.port);
  req.set(http::field::user_agent, "firsttoken-bench");
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  req.body() = std::move(lg.bodies[index]);
  req.prepare_payload();
  req.keep_alive(false);
  parser.body_limit(std::uint64_t(1) << 30);
  parser.header_limit(64 * 1024);
  stream.expires_at(t0 + secs(std::min(o.connect_timeout_s, o.timeout_s)));
  stream.async_connect(lg.endpoints, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
    self->on_connect(ec);
  });
}

void Call::on_connect(beast::error_code ec) {
  if (ec)
    return finish(ec == beast::error::timeout ? "timeout" : "connection",
                  ec == beast::error::timeout ? "connect timed out" : "connect: " + ec.message());
  stream.socket().set_option(tcp::no_delay(true), ec);
  stream.expires_at(t0 + secs(lg.opt.timeout_s));
  http::async_write(stream, req, [self = shared_from_this()](beast::error_code e, size_t) { self->on_write(e); });
}

void Call::on_write(beast::error_code ec) {
  if (ec) return finish(error_kind(ec), "write: " + ec.message());
  http::async_read_header(stream, buf, parser,
                          [self = shared_from_this()](beast::error_code e, size_t) { self->on_header(e); });
}

void Call::on_header(beast::error_code ec) {
  if (ec) return finish(error_kind(ec), "reading the response head: " + ec.message());
  if (parser.is_done()) {  // no body at all
    const int status = int(parser.get().result_int());
    if (status != 200) return finish("http_" + std::to_string(status), "(no body)");
    return finish("stream", "an empty response");
  }
  read_body();
}

void Call::read_body() {
  parser.get().body().data = piece;
  parser.get().body().size = sizeof piece;
  http::async_read_some(stream, buf, parser,
                        [self = shared_from_this()](beast::error_code e, size_t) { self->on_body(e); });
}

void Call::on_body(beast::error_code ec) {
  const auto now = Clock::now();
  if (ec == http::error::need_buffer) ec = {};
  const size_t got = sizeof piece - parser.get().body().size;
  RequestRecord& r = lg.records[index];
  const int status = int(parser.get().result_int());
  if (status != 200) {
    error_body.append(piece, got);
    if (ec || parser.is_done()) {
      std::string msg = error_body;
      const auto j = nlohmann::json::parse(error_body, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
          j["error"].contains("message") && j["error"]["message"].is_string())
        msg = j["error"]["message"].get<std::string>();
      return finish("http_" + std::to_string(status), msg.substr(0, 500));
    }
    return read_body();
  }
  for (std::string& data : sse.feed(std::string_view(piece, got))) {
    const StreamChunk c = interpret_chunk(data);
    if (c.completion_tokens >= 0) r.output_tokens = c.completion_tokens;
    switch (c.kind) {
      case StreamChunk::Kind::Token:
        if (r.chunks == 0) r.ttft_s = since(t0, now);
        else r.itl_s.push_back(since(last_chunk, now));
        last_chunk = now;
        ++r.chunks;
        break;
      case StreamChunk::Kind::Done: done_seen = true; break;
      case StreamChunk::Kind::Error: return finish("stream", c.error);
      case StreamChunk::Kind::Empty: break;
    }
  }
  if (ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof)
      return finish("connection", "the server closed the stream before its end");
    return finish(error_kind(ec), "reading the stream: " + ec.message());
  }
  if (!parser.is_done()) return read_body();
  r.e2e_s = since(t0, now);
  if (!done_seen) return finish("stream", "the stream ended without data: [DONE]");
  finish("", "");
}

void Call::finish(const std::string& kind, const std::string& message) {
  RequestRecord& r = lg.records[index];
  r.error = kind;
  r.error_message = message;
  if (r.output_tokens == 0) r.output_tokens = r.chunks;
  if (!kind.empty()) ++lg.errors;
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream.close();
  lg.on_finished();
}

}  // namespace

LoadgenResult run_loadgen(const LoadgenOptions& opt) {
  if (opt.workload.classes.empty()) fail("bench: the workload has no classes");
  if (opt.token_lo < 0 || opt.token_hi < opt.token_lo) fail("bench: bad token id range");
  if (opt.max_requests < 0 || opt.max_requests > kMaxPlannedRequests)
    fail("bench: max_requests must be in [0, ", kMaxPlannedRequests, "], got ", opt.max_requests);
  if (!(opt.timeout_s > 0 && opt.timeout_s <= kMaxTimeoutS))
    fail("bench: timeout_s must be in (0, ", kMaxTimeoutS, "], got ", opt.timeout_s);
  Loadgen lg(opt);
  lg.model = opt.model;
  // Reachability (and the model id) before anything is timed.
  {
    const HttpReply models = http_request(opt.url, "GET", opt.url.path("models"), "", opt.connect_timeout_s);
    if (lg.model.empty()) {
      const auto j = nlohmann::json::parse(models.body, nullptr, false);
      if (models.status != 200 || j.is_discarded() || !j.contains("data") || !j["data"].is_array() ||
          j["data"].empty() || !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
        fail("GET ", opt.url.str(), opt.url.path("models"), " gave HTTP ", models.status,
             " without a model id: pass --model");
      lg.model = j["data"][0]["id"].get<std::string>();
    }
  }
  lg.route = opt.url.path(opt.chat ? "chat/completions" : "completions");
  tcp::resolver resolver(lg.io);
  lg.endpoints = resolver.resolve(opt.url.host, opt.url.port);

  lg.salt = opt.prompt_salt;
  if (lg.salt == 0) {
    std::random_device rd;
    lg.salt = (uint64_t(rd()) << 32 | rd()) | 1;
  }
  lg.plan = plan_arrivals(opt.workload, opt.seed);
  if (lg.plan.empty()) fail("bench: the workload plans no request in ", opt.workload.duration_s, " s");
  lg.total = lg.plan.size();
  if (opt.max_requests > 0 && (opt.concurrency > 0 || size_t(opt.max_requests) < lg.total))
    lg.total = size_t(opt.max_requests);
  int64_t prompt_tokens = 0;  // (each <= kMaxRequestTokens, at most kMaxPlannedRequests of them: no overflow)
  for (size_t i = 0; i < lg.total; ++i) prompt_tokens += lg.plan[i % lg.plan.size()].prompt_tokens;
  if (prompt_tokens > kMaxRunPromptTokens)
    fail("bench: the run's ", lg.total, " requests hold ", prompt_tokens, " prompt tokens, more than ", kMaxRunPromptTokens,
         " (every body is made before the run): fewer requests or shorter prompts");
  lg.records.reserve(lg.total);
  for (size_t i = 0; i < lg.total; ++i) lg.bodies.push_back(lg.body_for(i));

  lg.t0 = Clock::now();
  if (opt.concurrency > 0) {
    for (int k = 0; k < opt.concurrency && lg.next < lg.total; ++k) {
      ++lg.next;
      lg.launch();
    }
  } else {
    lg.schedule_arrivals();
  }
  lg.tick();
  lg.io.run();
  lg.print_progress(true);

  LoadgenResult res;
  res.model = lg.model;
  res.prompt_salt = lg.salt;
  res.wall_s = since(lg.t0, Clock::now());
  res.records = std::move(lg.records);
  return res;
}

}  // namespace ft::loadgen
