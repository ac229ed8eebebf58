// Load-generator workloads, SSE parsing, statistics, SLOs, SVG output, and the load generator
// itself against a fake server in this process.
#include <gtest/gtest.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "loadgen/loadgen.h"
#include "loadgen/report.h"
#include "loadgen/sse.h"
#include "loadgen/svg_plot.h"
#include "loadgen/workload.h"
#include "core/error.h"

namespace ft::loadgen {
namespace {

TEST(Summary, PercentilesInterpolateLikeNumpy) {
  const Summary s = summarize({5, 1, 4, 2, 3});  // sorted: 1 2 3 4 5
  EXPECT_EQ(s.n, 5u);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.p90, 4.6);   // numpy.percentile([1..5], 90)
  EXPECT_DOUBLE_EQ(s.p99, 4.96);
  EXPECT_DOUBLE_EQ(s.max, 5);
  const Summary one = summarize({7.5});
  EXPECT_DOUBLE_EQ(one.p99, 7.5);
  EXPECT_EQ(summarize({}).n, 0u);
}

TEST(Workload, MixedMatchesTheHeadlineWorkload) {
  const auto w = builtin_workload("mixed");
  ASSERT_TRUE(w);
  Workload m = *w;
  m.duration_s = 200;
  const auto plan = plan_arrivals(m, 1);
  int longs = 0, shorts = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (i) {
      EXPECT_LE(plan[i - 1].at_s, plan[i].at_s);
    }
    EXPECT_LT(plan[i].at_s, 200.0);
    const auto& c = m.classes[size_t(plan[i].class_index)];
    EXPECT_GE(plan[i].prompt_tokens, c.prompt_tokens.mean - c.prompt_tokens.spread);
    EXPECT_LE(plan[i].prompt_tokens, c.prompt_tokens.mean + c.prompt_tokens.spread);
    EXPECT_EQ(plan[i].output_tokens, 16);
    (c.name == "long" ? longs : shorts)++;
  }
  EXPECT_EQ(longs, 10);               // one every 20 s
  EXPECT_NEAR(shorts, 200, 3 * std::sqrt(200.0));  // Poisson 1/s: within 3 sigma
  EXPECT_FALSE(builtin_workload("nope"));
}

TEST(Workload, SameSeedSamePlanAndGammaBurstiness) {
  Workload w;
  w.duration_s = 500;
  w.classes = {{"a", {Arrivals::Kind::Gamma, 2.0, 0.25, 0}, {100, 10}, {8, 0}, 0}};
  const auto a = plan_arrivals(w, 7), b = plan_arrivals(w, 7), c = plan_arrivals(w, 8);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].at_s, b[i].at_s);
  EXPECT_NE(a.size() == c.size() && a[0].at_s == c[0].at_s, true);
  // Mean rate holds; burstiness 0.25 gives a coefficient of variation of gaps near 2 (1/sqrt(k)).
  EXPECT_NEAR(double(a.size()) / 500, 2.0, 0.3);
  std::vector<double> gaps;
  for (size_t i = 1; i < a.size(); ++i) gaps.push_back(a[i].at_s - a[i - 1].at_s);
  const Summary s = summarize(gaps);
  double var = 0;
  for (double g : gaps) var += (g - s.mean) * (g - s.mean);
  const double cv = std::sqrt(var / double(gaps.size())) / s.mean;
  EXPECT_GT(cv, 1.5);
}

TEST(Workload, FromJsonAndItsErrors) {
  const auto j = nlohmann::json::parse(R"({"name": "x", "duration_s": 10, "classes": [
      {"name": "q", "arrival": {"type": "periodic", "rate": 2}, "prompt_tokens": {"mean": 30, "spread": 5},
       "output_tokens": 4, "shared_prefix_tokens": 10}]})");
  const Workload w = workload_from_json(j);
  ASSERT_EQ(w.classes.size(), 1u);
  EXPECT_EQ(w.classes[0].prompt_tokens.spread, 5);
  EXPECT_EQ(plan_arrivals(w, 1).size(), 20u);  // every 0.5 s for 10 s
  auto bad = [](const char* text, const char* needle) {
    try {
      workload_from_json(nlohmann::json::parse(text));
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad(R"({"classes": []})", "classes");
  bad(R"({"clases": []})", "unknown key 'clases'");
  bad(R"({"classes": [{"arrival": {"rate": 1}, "prompt_tokens": 0, "output_tokens": 1}]})", "prompt_tokens");
  bad(R"({"classes": [{"arrival": {"type": "burst", "rate": 1}, "prompt_tokens": 5, "output_tokens": 1}]})", "burst");
  bad(R"({"classes": [{"arrival": {"rate": -1}, "prompt_tokens": 5, "output_tokens": 1}]})", "rate");
  bad(R"({"classes": [{"arrival": {"rate": 1}, "prompt_tokens": 5, "output_tokens": 1, "shared_prefix_tokens": 9}]})",
      "shared_prefix_tokens");
}

// Keys of the wrong type are errors naming the key (not nlohmann's type_error), and nothing
// unbounded reaches the plan: lengths, duration, start_s, and the planned count (rate x duration).
TEST(Workload, WrongTypesAndUnboundedPlansAreErrorsNamingTheKey) {
  auto bad = [](const std::string& text, const char* needle) {
    try {
      workload_from_json(nlohmann::json::parse(text));
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string cls = R"("prompt_tokens": 5, "output_tokens": 1)";
  bad(R"({"name": 5, "classes": [{"arrival": {"rate": 1}, )" + cls + "}]}", "'name' must be a string");
  bad(R"({"classes": [{"name": ["x"], "arrival": {"rate": 1}, )" + cls + "}]}", "'classes[0].name' must be a string");
  bad(R"({"classes": [{"arrival": {"type": 1, "rate": 1}, )" + cls + "}]}", "'classes[0].arrival.type' must be a string");
  bad(R"({"classes": [{"arrival": {"type": "periodic", "rate": 1, "start_s": -1e15}, )" + cls + "}]}",
      "'classes[0].arrival.start_s' must be in [0, ");
  bad(R"({"duration_s": 10, "classes": [{"arrival": {"rate": 1, "start_s": 1e300}, )" + cls + "}]}", "start_s");
  bad(R"({"duration_s": 1e9, "classes": [{"arrival": {"rate": 1}, )" + cls + "}]}", "'duration_s' must be in (0, ");
  bad(R"({"classes": [{"arrival": {"rate": 1}, "prompt_tokens": 1000000000000, "output_tokens": 1}]})",
      "'classes[0].prompt_tokens' must stay within 16777216 tokens");
  bad(R"({"classes": [{"arrival": {"rate": 1}, "prompt_tokens": 5, "output_tokens": {"mean": 16777216, "spread": 1}}]})",
      "'classes[0].output_tokens' must stay within");
  // The plan stops at kMaxPlannedRequests, naming the rate and the duration.
  Workload w = workload_from_json(nlohmann::json::parse(
      R"({"duration_s": 2, "classes": [{"name": "flood", "arrival": {"type": "periodic", "rate": 1e6}, )" + cls + "}]}"));
  try {
    plan_arrivals(w, 1);
    ADD_FAILURE() << "planned 2e6 requests";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1048576 requests (class 'flood': rate 1e+06/s x duration 2 s)"),
              std::string::npos) << e.what();
  }
  w.duration_s = std::numeric_limits<double>::infinity();  // (a --duration that skipped its check)
  EXPECT_THROW(plan_arrivals(w, 1), Error);
}

TEST(Sse, EventsSurviveAnySplit) {
  const std::string stream =
      "data: {\"a\":1}\n\n: a comment\r\nevent: x\r\ndata: line1\r\ndata:line2\r\n\r\ndata: [DONE]\r\rid: 3\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "line1\nline2", "[DONE]"};
  for (size_t step = 1; step <= stream.size(); ++step) {
    SseParser p;
    std::vector<std::string> got;
    for (size_t i = 0; i < stream.size(); i += step)
      for (auto& e : p.feed(std::string_view(stream).substr(i, step))) got.push_back(e);
    EXPECT_EQ(got, want) << "pieces of " << step;
  }
  SseParser p;
  EXPECT_TRUE(p.feed("data: unfinished\n").empty());  // no blank line yet
  EXPECT_EQ(p.feed("\n"), std::vector<std::string>{"unfinished"});
}

TEST(Sse, ChunkMeaning) {
  using K = StreamChunk::Kind;
  auto c = interpret_chunk(R"({"choices":[{"index":0,"text":"Hi","finish_reason":null}],"usage":null})");
  EXPECT_EQ(c.kind, K::Token);
  EXPECT_EQ(c.text, "Hi");
  EXPECT_EQ(c.completion_tokens, -1);
  c = interpret_chunk(R"({"choices":[{"index":0,"delta":{"content":"yo"}}]})");
  EXPECT_EQ(c.kind, K::Token);
  EXPECT_EQ(c.text, "yo");
  EXPECT_EQ(interpret_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})").kind, K::Empty);
  EXPECT_EQ(interpret_chunk(R"({"choices":[{"text":"","finish_reason":"length"}]})").kind, K::Empty);
  c = interpret_chunk(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":16}})");
  EXPECT_EQ(c.kind, K::Empty);
  EXPECT_EQ(c.completion_tokens, 16);
  EXPECT_EQ(interpret_chunk("[DONE]").kind, K::Done);
  c = interpret_chunk(R"({"error":{"message":"cancelled","type":"server_error"}})");
  EXPECT_EQ(c.kind, K::Error);
  EXPECT_EQ(c.error, "cancelled");
  EXPECT_EQ(interpret_chunk("{not json").kind, K::Error);
  EXPECT_EQ(interpret_chunk("42").kind, K::Error);
}

TEST(Url, ParsesHostPortAndPrefix) {
  ServerUrl u = parse_url("http://127.0.0.1:8000");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, "8000");
  EXPECT_EQ(u.path("completions"), "/v1/completions");
  u = parse_url("localhost:9000/v1/");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.path("chat/completions"), "/v1/chat/completions");
  u = parse_url("http://example.org/proxy");
  EXPECT_EQ(u.port, "80");
  EXPECT_EQ(u.path("models"), "/proxy/v1/models");
  u = parse_url("http://[::1]:8080");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, "8080");
  for (const char* bad : {"https://api.openai.com", "ftp://x", "http://", "http://h:99999", "http://h:abc", "http://:80"})
    EXPECT_THROW(parse_url(bad), Error) << bad;
}

TEST(Slo, ParseAndMeet) {
  const Slo s = parse_slo("ttft:500,tpot:100");
  EXPECT_EQ(s.ttft_ms, 500);
  EXPECT_EQ(s.tpot_ms, 100);
  EXPECT_FALSE(s.e2e_ms);
  EXPECT_EQ(parse_slo("e2e:2000.5,itl:50").e2e_ms, 2000.5);
  for (const char* bad : {"", "ttft", "ttft:", "ttft:abc", "ttft:-5", "ttft:0", "latency:5", "ttft:5,", "ttft:5ms"})
    EXPECT_THROW(parse_slo(bad), Error) << bad;
  RequestRecord r;
  r.ttft_s = 0.2;
  r.e2e_s = 1.2;
  r.output_tokens = 11;  // TPOT = 1.0 s / 10 = 100 ms
  r.itl_s = {0.1, 0.12};
  EXPECT_TRUE(meets_slo(r, s));
  EXPECT_FALSE(meets_slo(r, parse_slo("ttft:199")));
  EXPECT_FALSE(meets_slo(r, parse_slo("tpot:99")));
  EXPECT_FALSE(meets_slo(r, parse_slo("itl:110")));
  EXPECT_TRUE(meets_slo(r, Slo{}));
  r.error = "http_429";
  EXPECT_FALSE(meets_slo(r, Slo{}));
}

TEST(Report, ClassStatsCountsErrorsAndGoodput) {
  auto ok = [](int32_t cls, double ttft, double e2e, int64_t n) {
    RequestRecord r;
    r.class_index = cls;
    r.ttft_s = ttft;
    r.e2e_s = e2e;
    r.output_tokens = r.chunks = n;
    for (int64_t i = 1; i < n; ++i) r.itl_s.push_back((e2e - ttft) / double(n - 1));
    return r;
  };
  std::vector<RequestRecord> rs = {ok(0, 0.1, 0.5, 5), ok(0, 0.3, 0.7, 5), ok(1, 1.0, 3.0, 3)};
  RequestRecord e;
  e.class_index = 1;
  e.error = "http_429";
  rs.push_back(e);
  e.error = "timeout";
  rs.push_back(e);
  rs.push_back(e);
  const auto st = class_stats(rs, {"short", "long"}, 2.0, parse_slo("ttft:200"));
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].name, "short");
  EXPECT_EQ(st[0].sent, 2u);
  EXPECT_EQ(st[0].completed, 2u);
  EXPECT_TRUE(st[0].errors.empty());
  EXPECT_DOUBLE_EQ(st[0].ttft_ms.mean, 200);
  EXPECT_DOUBLE_EQ(st[0].tpot_ms.mean, 100);   // (0.4 s) / 4 both
  EXPECT_EQ(st[0].itl_ms.n, 8u);
  EXPECT_EQ(st[0].slo_met, 1u);                // only the 100 ms TTFT
  EXPECT_DOUBLE_EQ(st[0].goodput_rps, 0.5);
  EXPECT_DOUBLE_EQ(st[0].output_tokens_per_s, 5);
  EXPECT_EQ(st[1].sent, 4u);
  EXPECT_EQ(st[1].completed, 1u);
  EXPECT_EQ(st[1].errors.at("http_429"), 1u);
  EXPECT_EQ(st[1].errors.at("timeout"), 2u);
  EXPECT_DOUBLE_EQ(st[1].tpot_ms.mean, 1000);
  EXPECT_EQ(st[2].name, "all");
  EXPECT_EQ(st[2].sent, 6u);
  EXPECT_EQ(st[2].completed, 3u);
  EXPECT_DOUBLE_EQ(st[2].requests_per_s, 1.5);
  const auto j = class_stats_json(st[1]);
  EXPECT_EQ(j["error_count"], 3);
  EXPECT_EQ(j["errors"]["timeout"], 2);
  EXPECT_DOUBLE_EQ(j["ttft_ms"]["p99"].get<double>(), 1000);
  const auto rj = record_json(rs[3], {"short", "long"});
  EXPECT_EQ(rj["class"], "long");
  EXPECT_EQ(rj["error"], "http_429");
  EXPECT_TRUE(rj["ttft_s"].is_null());
  const std::string text = format_report(st, 2.0, parse_slo("ttft:200"));
  EXPECT_NE(text.find("http_429 1, timeout 2"), std::string::npos) << text;
  EXPECT_NE(text.find("goodput"), std::string::npos);
  // One token: no TPOT.
  EXPECT_FALSE(ok(0, 0.1, 0.1, 1).tpot_s());
}

TEST(Prompts, ExactLengthsAndSharedPrefix) {
  RequestClass c;
  c.shared_prefix_tokens = 8;
  PlannedRequest p{0, 0, 20, 4};
  const auto a = prompt_token_ids(p, c, 1, 0, 100, 255), b = prompt_token_ids(p, c, 1, 1, 100, 255);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 8, b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 8, a.end(), b.begin() + 8));
  for (int32_t t : a) EXPECT_TRUE(t >= 100 && t <= 255) << t;
  EXPECT_EQ(a, prompt_token_ids(p, c, 1, 0, 100, 255));  // deterministic
  const auto other_run = prompt_token_ids(p, c, 2, 0, 100, 255);
  EXPECT_NE(std::vector<int32_t>(a.begin(), a.begin() + 4), std::vector<int32_t>(other_run.begin(), other_run.begin() + 4));
  PlannedRequest q = p;
  q.class_index = 1;  // another class: another shared prefix
  const auto other_class = prompt_token_ids(q, c, 1, 0, 100, 255);
  EXPECT_NE(std::vector<int32_t>(a.begin(), a.begin() + 4), std::vector<int32_t>(other_class.begin(), other_class.begin() + 4));
  c.shared_prefix_tokens = 0;
  const auto x = prompt_token_ids(p, c, 1, 0, 100, 255), y = prompt_token_ids(p, c, 1, 1, 100, 255);
  EXPECT_NE(std::vector<int32_t>(x.begin(), x.begin() + 4), std::vector<int32_t>(y.begin(), y.begin() + 4));
  EXPECT_EQ(prompt_text(3), "hello hello hello");
}

bool well_formed_ish(const std::string& svg) {
  if (svg.rfind("<svg", 0) != 0) return false;
  const std::string end = "</svg>\n";
  return svg.size() > end.size() && svg.compare(svg.size() - end.size(), end.size(), end) == 0 &&
         svg.find("nan") == std::string::npos && svg.find("inf") == std::string::npos;
}

TEST(Svg, FiguresAreSelfContainedAndEscaped) {
  std::vector<RequestRecord> rs;
  for (int i = 0; i < 20; ++i) {
    RequestRecord r;
    r.class_index = i % 2;
    r.start_s = i * 0.5;
    r.ttft_s = (i % 2 ? 1.0 : 0.01) * (1 + i);
    r.e2e_s = r.ttft_s + 0.1;
    rs.push_back(r);
  }
  const std::string fig = svg_ttft_figure("TTFT <mixed> & more", rs, {"short", "long"});
  EXPECT_TRUE(well_formed_ish(fig)) << fig.substr(0, 200);
  EXPECT_NE(fig.find("TTFT &lt;mixed&gt; &amp; more"), std::string::npos);
  EXPECT_NE(fig.find("<polyline"), std::string::npos);
  EXPECT_NE(fig.find("<circle"), std::string::npos);
  EXPECT_TRUE(well_formed_ish(svg_ttft_figure("empty", {}, {"a"})));  // no data: axes only
  const std::string bars = svg_bar_chart("configs", "ms", {"auto", "chunk256"}, {"short p99", "long p99"},
                                         {{10, 2000}, {12, 0}}, true);
  EXPECT_TRUE(well_formed_ish(bars));
  EXPECT_EQ(std::count(bars.begin(), bars.end(), '\n') > 5, true);
  size_t rects = 0;
  for (size_t at = bars.find("<rect x="); at != std::string::npos; at = bars.find("<rect x=", at + 1)) ++rects;
  EXPECT_EQ(rects, 1u /* frame */ + 3u /* bars: the 0 is dropped on a log axis */ + 2u /* legend */);
  EXPECT_EQ(xml_escape("a<b>\"c\"&'"), "a&lt;b&gt;&quot;c&quot;&amp;&apos;");
}

}  // namespace
}  // namespace ft::loadgen

// --- the load generator against a fake OpenAI-compatible server (in process; runs under ASan) ---

namespace ft::loadgen {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

// One thread per connection, blocking I/O. POST .../completions: a prompt of more than 1000 ids
// gets 400; max_tokens 99 never answers (a hang); otherwise max_tokens SSE chunks, each event
// split over two TCP writes, then the finish chunk, a usage chunk and [DONE].
class FakeServer {
 public:
  FakeServer() : acceptor_(io_, tcp::endpoint(asio::ip::address_v4::loopback(), 0)) {
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~FakeServer() {
    stop_ = true;
    boost::system::error_code ec;
    tcp::socket wake(io_);
    wake.connect(tcp::endpoint(asio::ip::address_v4::loopback(), port_), ec);
    accept_thread_.join();
    for (auto& t : conns_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void accept_loop() {
    while (!stop_) {
      auto s = std::make_shared<tcp::socket>(io_);
      boost::system::error_code ec;
      acceptor_.accept(*s, ec);
      if (ec || stop_) break;
      conns_.emplace_back([this, s] { handle(*s); });
    }
  }
  void handle(tcp::socket& s) {
    boost::system::error_code ec;
    boost::beast::flat_buffer buf;
    http::request<http::string_body> req;
    http::read(s, buf, req, ec);
    if (ec) return;
    auto send = [&](const std::string& bytes) { asio::write(s, asio::buffer(bytes), ec); };
    if (req.target().ends_with("/models")) {
      const std::string body = R"({"object":"list","data":[{"id":"fake"}]})";
      send("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n\r\n" + body);
      return;
    }
    const auto j = nlohmann::json::parse(req.body());
    const int64_t n = j.value("max_tokens", 16);
    const bool chat = j.contains("messages");
    if (j.contains("prompt") && j["prompt"].is_array() && j["prompt"].size() > 1000) {
      const std::string body = R"({"error":{"message":"prompt too long for the context","type":"invalid_request_error"}})";
      send("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
      return;
    }
    if (n == 98) {  // a refusal without a body
      send("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      return;
    }
    if (n == 99) {
      for (int i = 0; i < 300 && !stop_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    auto chunk = [&](const std::string& data) {  // one HTTP chunk per half event
      std::ostringstream hex;
      hex << std::hex << data.size();
      send(hex.str() + "\r\n" + data + "\r\n");
    };
    for (int64_t i = 0; i < n && !ec; ++i) {
      const std::string ev = chat ? R"(data: {"choices":[{"delta":{"content":"tok"}}]})" "\n\n"
                                  : R"(data: {"choices":[{"text":"tok","finish_reason":null}]})" "\n\n";
      chunk(ev.substr(0, 10));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      chunk(ev.substr(10));
    }
    chunk(R"(data: {"choices":[{"text":"","finish_reason":"length"}]})" "\n\n"
          "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":" + std::to_string(n) + "}}\n\n"
          "data: [DONE]\n\n");
    send("0\r\n\r\n");
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::vector<std::thread> conns_;  // only the accept thread adds; joined after it ends
};

// Aborts the test binary, naming the stage, if not destroyed within `limit`: once (2026-12-05,
// the full suite at -j2) this test ran into ctest's 600 s limit (the progress timer's re-arm,
// below); a hang now fails in 90 s and says where.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit)
      : thread_([this, limit] {
          std::unique_lock lock(mutex_);
          if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
          std::fprintf(stderr, "watchdog: still in '%s' after %lld s\n", stage_, static_cast<long long>(limit.count()));
          std::fflush(stderr);
          std::abort();
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void stage(const char* s) {
    std::lock_guard lock(mutex_);
    stage_ = s;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  const char* stage_ = "start";
  std::thread thread_;
};

TEST(Loadgen, ClassesErrorsAndTimeoutsAgainstAFakeServer) {
  Watchdog watchdog(std::chrono::seconds(90));  // (destroyed last: covers the server's shutdown)
  watchdog.stage("the open-loop run");
  FakeServer fake;
  LoadgenOptions o;
  o.url = parse_url(fake.url());
  o.progress = false;
  o.timeout_s = 3;  // "hang" must time out; 1 s once timed out an "ok" request on a loaded 2-core machine
  o.workload = workload_from_json(nlohmann::json::parse(R"({"name": "f", "duration_s": 1, "classes": [
    {"name": "ok", "arrival": {"type": "periodic", "rate": 4}, "prompt_tokens": 12, "output_tokens": 5},
    {"name": "big", "arrival": {"type": "periodic", "rate": 2}, "prompt_tokens": 2000, "output_tokens": 5},
    {"name": "hang", "arrival": {"type": "periodic", "rate": 1}, "prompt_tokens": 3, "output_tokens": 99},
    {"name": "503", "arrival": {"type": "periodic", "rate": 1}, "prompt_tokens": 3, "output_tokens": 98}]})"));
  const LoadgenResult r = run_loadgen(o);
  EXPECT_EQ(r.model, "fake");
  ASSERT_EQ(r.records.size(), 8u);  // 4 + 2 + 1 + 1
  for (const RequestRecord& q : r.records) {
    if (q.class_index == 0) {
      EXPECT_TRUE(q.ok()) << q.error << ": " << q.error_message;
      EXPECT_EQ(q.chunks, 5);
      EXPECT_EQ(q.output_tokens, 5);
      EXPECT_EQ(q.itl_s.size(), 4u);
      EXPECT_GT(q.ttft_s, 0);
      EXPECT_LE(q.ttft_s, q.e2e_s);
    } else if (q.class_index == 1) {
      EXPECT_EQ(q.error, "http_400");
      EXPECT_EQ(q.error_message, "prompt too long for the context");
    } else if (q.class_index == 2) {
      EXPECT_EQ(q.error, "timeout") << q.error_message;
    } else {
      EXPECT_EQ(q.error, "http_503") << q.error_message;
    }
  }
  const auto st = class_stats(r.records, {"ok", "big", "hang", "503"}, r.wall_s, Slo{});
  EXPECT_EQ(st[4].completed, 4u);
  EXPECT_EQ(st[4].errors.at("http_400"), 2u);
  EXPECT_EQ(st[4].errors.at("timeout"), 1u);
  EXPECT_EQ(st[4].errors.at("http_503"), 1u);

  // Closed loop over the chat endpoint: exactly max_requests, at most `concurrency` at once.
  watchdog.stage("the closed-loop run");
  o.chat = true;
  o.concurrency = 2;
  o.max_requests = 5;
  o.workload.classes.resize(1);
  o.workload.duration_s = 30;
  o.timeout_s = kMaxTimeoutS;  // its deadline in the future (1e10 s overflowed to the past: every request timed out)
  const LoadgenResult c = run_loadgen(o);
  ASSERT_EQ(c.records.size(), 5u);
  for (const auto& q : c.records) {
    EXPECT_TRUE(q.ok()) << q.error_message;
    EXPECT_EQ(q.chunks, 5);
  }

  // The run ends with its last request even when the progress timer's handler is already
  // queued then (a 1 us tick: always): that handler once re-armed the timer forever.
  watchdog.stage("a closed-loop run with a 1 us progress tick");
  o.progress_tick_s = 1e-6;
  EXPECT_EQ(run_loadgen(o).records.size(), 5u);
  watchdog.stage("the fake server's shutdown");
}

TEST(Loadgen, OutOfRangeOptionsAreErrorsBeforeAnyRequest) {
  LoadgenOptions o;
  o.url = parse_url("http://127.0.0.1:1");
  o.progress = false;
  o.workload = *builtin_workload("short");
  auto bad = [&](const char* needle) {
    try {
      run_loadgen(o);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  o.timeout_s = 1e10;
  bad("timeout_s must be in (0, 1e+06]");
  o.timeout_s = 1;
  o.max_requests = 1000000000000;
  bad("max_requests must be in [0, 1048576]");
}

// Every request's body is made before the run: their prompt tokens together are bounded (10,000
// prompts of 2^24 tokens each: ~600 GB of bodies), checked before any request is sent.
TEST(Loadgen, BodiesOfTheWholeRunAreBounded) {
  FakeServer fake;
  LoadgenOptions o;
  o.url = parse_url(fake.url());
  o.progress = false;
  o.workload = workload_from_json(nlohmann::json::parse(R"({"duration_s": 10000, "classes": [
    {"arrival": {"type": "periodic", "rate": 1}, "prompt_tokens": 16777216, "output_tokens": 1}]})"));
  try {
    run_loadgen(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the run's 10000 requests hold 167772160000 prompt tokens, more than 134217728"),
              std::string::npos) << e.what();
  }
}

// The full int32 token-id range: its width (2^31) overflowed int32.
TEST(Prompts, FullTokenIdRange) {
  RequestClass c;
  const PlannedRequest p{0, 0, 64, 1};
  const auto ids = prompt_token_ids(p, c, 1, 0, 0, std::numeric_limits<int32_t>::max());
  ASSERT_EQ(ids.size(), 64u);
  for (int32_t t : ids) EXPECT_GE(t, 0);
}

TEST(Loadgen, UnreachableServerIsAnError) {
  int port = 0;
  {
    FakeServer gone;
    port = std::stoi(parse_url(gone.url()).port);
  }
  LoadgenOptions o;
  o.url = parse_url("http://127.0.0.1:" + std::to_string(port));
  o.progress = false;
  o.workload = *builtin_workload("short");
  try {
    run_loadgen(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot reach"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ft::loadgen
