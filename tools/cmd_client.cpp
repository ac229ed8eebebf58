// `firsttoken client`: generates through a running `serve --binary-port` with the binary
// protocol (src/client), printing the text as its frames arrive. `client --bench` measures the
// protocol against JSON/SSE (and end-to-end TTFT over each against a running server).
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "client/binary_client.h"
#include "core/error.h"
#include "server/api.h"
#include "tools/commands.h"

namespace ft::tools {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

// The median over reps of f()'s wall time (µs).
template <class F>
double median_us(int reps, F f) {
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    const auto t = Clock::now();
    f();
    v.push_back(us_since(t));
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

volatile size_t g_sink = 0;  // keeps the decoded results alive

// Encode+decode of a 1000-token request and of a streamed 1000-token response, JSON (what the
// HTTP API sends: a completions body parsed and validated by server::parse_request; SSE chunks
// formatted by server::stream_chunk and parsed by the client) vs FlatBuffers frames.
void bench_codec(int reps) {
  constexpr int kN = 1000;
  std::vector<int32_t> ids(kN);
  for (int i = 0; i < kN; ++i) ids[size_t(i)] = (i * 7919) % 32000;
  std::vector<std::string> pieces(kN);
  static const char* const kWords[] = {" the", " little", ",", " girl", " Lily"};
  for (int i = 0; i < kN; ++i) pieces[size_t(i)] = kWords[i % 5];
  const server::ModelInfo info{"m", 1 << 20, 32000, {}};

  size_t json_req_bytes = 0, fb_req_bytes = 0, json_resp_bytes = 0, fb_resp_bytes = 0;
  const double json_req = median_us(reps, [&] {
    json j = {{"model", "m"}, {"prompt", ids}, {"max_tokens", 16}, {"temperature", 0.7}, {"top_p", 0.9}, {"stream", true}};
    const std::string body = j.dump();
    json_req_bytes = body.size();
    const server::ParsedRequest r = server::parse_request(server::Endpoint::Completions, body, info);
    g_sink = g_sink + r.prompt_tokens.size();
  });
  const double fb_req = median_us(reps, [&] {
    proto::Request r;
    r.tokens = ids;
    r.max_tokens = 16;
    r.sampling.temperature = 0.7f;
    r.sampling.top_p = 0.9f;
    const std::string frame = proto::encode_request(r);
    fb_req_bytes = frame.size();
    proto::Request d;
    if (!proto::decode_request(reinterpret_cast<const uint8_t*>(frame.data()) + proto::kFrameHeader,
                               frame.size() - proto::kFrameHeader, d))
      fail("bench: decode failed");
    g_sink = g_sink + d.tokens.size();
  });
  const server::ResponseMeta meta{server::Endpoint::Completions, "cmpl-1", 1700000000, "m"};
  const double json_resp = median_us(reps, [&] {
    size_t bytes = 0, got = 0;
    for (int i = 0; i < kN; ++i) {
      const std::string ev = server::sse_event(server::stream_chunk(meta, pieces[size_t(i)], false, "", false));
      bytes += ev.size();
      // The client's side: strip "data: " and "\n\n", parse, take the text.
      const json j = json::parse(std::string_view(ev).substr(6, ev.size() - 8));
      got += j["choices"][0]["text"].get_ref<const std::string&>().size();
    }
    json_resp_bytes = bytes;
    g_sink = g_sink + got;
  });
  const double fb_resp = median_us(reps, [&] {
    size_t bytes = 0, got = 0;
    proto::Response r, d;
    for (int i = 0; i < kN; ++i) {
      r.tokens.assign(1, ids[size_t(i)]);
      r.text = pieces[size_t(i)];
      const std::string frame = proto::encode_response(r);
      bytes += frame.size();
      if (!proto::decode_response(reinterpret_cast<const uint8_t*>(frame.data()) + proto::kFrameHeader,
                                  frame.size() - proto::kFrameHeader, d))
        fail("bench: decode failed");
      got += d.text.size();
    }
    fb_resp_bytes = bytes;
    g_sink = g_sink + got;
  });
  std::printf("encode+decode, median of %d runs (JSON: completions body + parse_request / SSE chunks; "
              "FlatBuffers: frames + Verifier)\n", reps);
  std::printf("| %-36s | %10s | %10s | %10s | %10s | %10s | %8s |\n", "case", "JSON us", "FB us", "JSON/FB",
              "JSON bytes", "FB bytes", "bytes x");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(38, '-').c_str(), std::string(12, '-').c_str(),
              std::string(12, '-').c_str(), std::string(12, '-').c_str(), std::string(12, '-').c_str(),
              std::string(12, '-').c_str(), std::string(10, '-').c_str());
  auto row = [](const char* name, double j, double f, size_t jb, size_t fbb) {
    std::printf("| %-36s | %10.1f | %10.1f | %10.2f | %10zu | %10zu | %8.2f |\n", name, j, f, j / f, jb, fbb,
                double(jb) / double(fbb));
  };
  row("request, 1000 prompt token ids", json_req, fb_req, json_req_bytes, fb_req_bytes);
  row("streamed response, 1000 tokens", json_resp, fb_resp, json_resp_bytes, fb_resp_bytes);
}

// A blocking TCP connection with TCP_NODELAY (the HTTP side of the TTFT comparison).
int connect_tcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) fail("cannot resolve ", host);
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) fail("cannot connect to ", host, ":", port);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// End-to-end TTFT (request sent -> first token's bytes received, connection already open),
// streaming greedy "Once upon a time" over HTTP/SSE and over the binary protocol.
void bench_ttft(const std::string& host, int http_port, int bin_port, int reps) {
  std::vector<double> http_ms, bin_ms;
  if (http_port > 0) {
    const int fd = connect_tcp(host, http_port);
    for (int i = 0; i < reps; ++i) {
      // The model id is what /v1/models says; ask once.
      static std::string model_id;
      if (model_id.empty()) {
        const std::string q = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
        ::send(fd, q.data(), q.size(), MSG_NOSIGNAL);
        std::string got;
        char buf[4096];
        size_t head = std::string::npos, need = 0;
        while (head == std::string::npos || got.size() < head + 4 + need) {
          const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
          if (n <= 0) fail("bench: GET /v1/models failed");
          got.append(buf, size_t(n));
          if (head == std::string::npos && (head = got.find("\r\n\r\n")) != std::string::npos) {
            const size_t cl = got.find("Content-Length: ");
            if (cl == std::string::npos || cl > head) fail("bench: GET /v1/models: no Content-Length");
            need = std::stoul(got.substr(cl + 16));
          }
        }
        const json j = json::parse(got.substr(head + 4, need));
        model_id = j["data"][0]["id"].get<std::string>();
      }
      const std::string b = json({{"model", model_id}, {"prompt", "Once upon a time"}, {"max_tokens", 1},
                                  {"temperature", 0}, {"stream", true}}).dump();
      const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(b.size()) + "\r\n\r\n" + b;
      const auto t0 = Clock::now();
      ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
      std::string got;
      char buf[8192];
      bool first = false;
      while (got.find("data: [DONE]") == std::string::npos || got.find("\r\n0\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) fail("bench: the HTTP stream broke");
        got.append(buf, size_t(n));
        if (!first && got.find("\"text\"") != std::string::npos) {
          first = true;
          http_ms.push_back(us_since(t0) / 1000);
        }
      }
    }
    ::close(fd);
  }
  if (bin_port > 0) {
    client::BinaryClient c(host, bin_port);
    proto::Request r;
    r.text = "Once upon a time";
    r.max_tokens = 1;
    r.sampling.temperature = 0;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = Clock::now();
      bool first = false;
      c.generate(r, [&](const proto::Response& f) {
        if (!first && !f.tokens.empty()) {
          first = true;
          bin_ms.push_back(us_since(t0) / 1000);
        }
      });
    }
  }
  auto med = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("\nend-to-end TTFT against %s, greedy \"Once upon a time\", 1 token, median of %d (open connection)\n",
              host.c_str(), reps);
  std::printf("| %-20s | %10s |\n|%s|%s|\n", "protocol", "TTFT ms", std::string(22, '-').c_str(), std::string(12, '-').c_str());
  if (http_port > 0) std::printf("| %-20s | %10.3f |\n", "HTTP + SSE (JSON)", med(http_ms));
  if (bin_port > 0) std::printf("| %-20s | %10.3f |\n", "binary (FlatBuffers)", med(bin_ms));
  if (http_port > 0 && bin_port > 0) std::printf("HTTP/binary ratio: %.2f\n", med(http_ms) / med(bin_ms));
}

}  // namespace

void add_client(CLI::App& app, ClientArgs& a) {
  CLI::App* c = app.add_subcommand("client", "Generate through a running server's binary protocol (serve --binary-port)");
  c->add_option("--host", a.host, "Server address (default 127.0.0.1)");
  c->add_option("--port", a.port, "The server's --binary-port");
  auto* p = c->add_option("-p,--prompt", a.prompt, "Prompt text (tokenized by the server)");
  auto* t = c->add_option("--tokens", a.tokens, "Prompt as comma-separated token ids, e.g. 1,2,3");
  p->excludes(t);
  c->add_option("-n,--n-predict", a.n_predict, "Tokens to generate (default 128)");
  c->add_option("--temp", a.temperature, "Temperature (default 0 = greedy)");
  c->add_option("--seed", a.seed, "Sampling seed (default: the server draws one)")->each([&a](const std::string&) { a.seed_set = true; });
  c->add_flag("--ignore-eos", a.ignore_eos, "Keep generating past end-of-generation tokens");
  c->add_flag("--embed", a.embed, "Print the prompt's embedding (the server's --pooling, L2-normalized) instead of generating");
  c->add_flag("--stats", a.stats, "Print usage and timings to stderr at the end");
  c->add_flag("--bench", a.bench,
              "Benchmark: encode+decode of a 1000-token request and streamed response, JSON vs FlatBuffers; "
              "with --port/--http-port also end-to-end TTFT over each against that server");
  c->add_option("--http-port", a.http_port, "--bench: the server's HTTP port (TTFT over HTTP/SSE)");
  c->add_option("--reps", a.reps, "--bench: repetitions (default 50)");
}

int cmd_client(const ClientArgs& a) {
  if (a.bench) {
    if (a.reps < 1) fail("--reps must be >= 1");
    bench_codec(a.reps);
    if (a.port > 0 || a.http_port > 0) bench_ttft(a.host, a.http_port, a.port, a.reps);
    return 0;
  }
  if (a.port <= 0) fail("--port (the server's --binary-port) is required");
  proto::Request req;
  if (!a.tokens.empty()) {
    std::stringstream ss(a.tokens);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        size_t used = 0;
        const long long id = std::stoll(item, &used);
        // (Checked before the int32 cast: 4294967297 was sent as token 1.)
        if (used != item.size() || id < 0 || id > std::numeric_limits<int32_t>::max()) throw std::invalid_argument(item);
        req.tokens.push_back(int32_t(id));
      } catch (const std::exception&) {
        fail("--tokens: '", item, "' is not a token id (0 to ", std::numeric_limits<int32_t>::max(), ")");
      }
    }
    if (req.tokens.empty()) fail("--tokens is empty");
  } else if (!a.prompt.empty()) {
    req.text = a.prompt;
  } else {
    fail("give -p PROMPT or --tokens 1,2,3");
  }
  if (a.n_predict < 1) fail("-n must be >= 1");
  req.max_tokens = a.n_predict;
  req.sampling.temperature = a.temperature;
  req.sampling.seed = a.seed;
  req.seed_set = a.seed_set;
  req.ignore_eos = a.ignore_eos;
  req.stream = true;
  req.embed = a.embed;

  client::BinaryClient c(a.host, a.port);
  if (a.embed) {  // one line: the vector's values, space-separated, shortest form
    const proto::Response last = c.generate(req);
    if (!last.error.empty()) fail("the server answered: ", last.error);
    std::string line;
    char buf[32];
    for (float x : last.embedding) {
      if (!line.empty()) line += ' ';
      line.append(buf, size_t(std::to_chars(buf, buf + sizeof buf, x).ptr - buf));
    }
    std::puts(line.c_str());
    return 0;
  }
  if (!a.prompt.empty()) std::fputs(a.prompt.c_str(), stdout);
  const proto::Response last = c.generate(req, [](const proto::Response& r) {
    std::fwrite(r.text.data(), 1, r.text.size(), stdout);
    std::fflush(stdout);  // each piece as it arrives
  });
  std::fputc('\n', stdout);
  if (!last.error.empty()) fail("the server answered: ", last.error);
  if (a.stats) {
    const proto::Timings& t = last.timings;
    std::fprintf(stderr,
                 "finish=%s prompt=%lld generated=%lld tokenize=%.2fms queue=%.2fms prefill=%.2fms ttft=%.2fms "
                 "decode=%.2fms total=%.2fms\n",
                 last.finish.c_str(), (long long)last.prompt_tokens, (long long)last.completion_tokens, t.tokenize,
                 t.queue, t.prefill, t.ttft, t.decode, t.total);
  }
  return 0;
}

}  // namespace ft::tools
