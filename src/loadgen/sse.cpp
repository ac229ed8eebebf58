#include "loadgen/sse.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ft::loadgen {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> out;
  for (char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;
    }
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      line(line_, out);
      line_.clear();
    } else {
      line_ += c;
    }
  }
  return out;
}

void SseParser::line(std::string_view l, std::vector<std::string>& out) {
  if (l.empty()) {  // blank line: dispatch
    if (has_data_) out.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

StreamChunk interpret_chunk(std::string_view data) {
  StreamChunk c;
  if (data == "[DONE]") {
    c.kind = StreamChunk::Kind::Done;
    return c;
  }
  const auto j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    c.kind = StreamChunk::Kind::Error;
    c.error = "malformed stream chunk: " + std::string(data.substr(0, 200));
    return c;
  }
  if (j.contains("error")) {
    c.kind = StreamChunk::Kind::Error;
    const auto& e = j["error"];
    c.error = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                  : e.dump();
    return c;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const auto& u = j["usage"];
    if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
      c.completion_tokens = u["completion_tokens"].get<int64_t>();
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const auto& ch = j["choices"][0];
    if (ch.is_object()) {
      if (ch.contains("text") && ch["text"].is_string()) c.text = ch["text"].get<std::string>();
      else if (ch.contains("delta") && ch["delta"].is_object() && ch["delta"].contains("content") &&
               ch["delta"]["content"].is_string())
        c.text = ch["delta"]["content"].get<std::string>();
    }
  }
  c.kind = c.text.empty() ? StreamChunk::Kind::Empty : StreamChunk::Kind::Token;
  return c;
}

std::string ServerUrl::path(std::string_view route) const {
  const bool has_v1 = prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0;
  return prefix + (has_v1 ? "/" : "/v1/") + std::string(route);
}

ServerUrl parse_url(const std::string& url) {
  ServerUrl u;
  std::string rest = url;
  if (rest.rfind("https://", 0) == 0) fail("--url '", url, "': https is not supported (use http://)");
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos) fail("--url '", url, "': only http:// URLs are supported");
  const size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  u.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  if (hostport.empty()) fail("--url '", url, "': no host (expected http://HOST:PORT)");
  const size_t bracket = hostport.find(']');
  const size_t colon = hostport.rfind(':');
  if (colon != std::string::npos && (bracket == std::string::npos || colon > bracket)) {
    u.port = hostport.substr(colon + 1);
    hostport = hostport.substr(0, colon);
    if (u.port.empty() || u.port.size() > 5 || u.port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(u.port) < 1 || std::stoi(u.port) > 65535)
      fail("--url '", url, "': bad port '", u.port, "'");
  }
  if (hostport.size() >= 2 && hostport.front() == '[' && hostport.back() == ']')
    hostport = hostport.substr(1, hostport.size() - 2);
  if (hostport.empty()) fail("--url '", url, "': no host (expected http://HOST:PORT)");
  u.host = hostport;
  return u;
}

}  // namespace ft::loadgen
