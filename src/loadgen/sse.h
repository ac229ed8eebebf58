// Client side of OpenAI-style streaming: an incremental Server-Sent-Events parser (bytes in as
// they arrive, complete events' `data` out), the meaning of one streamed chunk, and server URLs.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ft::loadgen {

// Feed any split of the byte stream; each call returns the data of the events it completed
// (multi-line data joined by '\n'). Lines end in \n, \r\n or \r; ':' lines are comments; fields
// other than data are ignored; an event without data lines yields nothing.
class SseParser {
 public:
  std::vector<std::string> feed(std::string_view bytes);

 private:
  void line(std::string_view l, std::vector<std::string>& out);
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool after_cr_ = false;  // a \r ended the previous line: a following \n belongs to it
};

// One event's data, as an OpenAI-compatible server streams it.
struct StreamChunk {
  enum class Kind { Token, Empty, Done, Error };
  Kind kind = Kind::Empty;
  std::string text;                // completions: choices[0].text; chat: choices[0].delta.content
  int64_t completion_tokens = -1;  // usage.completion_tokens when the chunk reports it
  std::string error;               // Kind::Error: the server's message (or why it did not parse)
};
// Token: non-empty text. Empty: a chunk without text (chat's role chunk, the finish chunk, the
// usage-only chunk). Done: "[DONE]". Error: {"error": ...} or data that is not a JSON object.
StreamChunk interpret_chunk(std::string_view data);

// "http://host[:port][/prefix]". The API path is prefix + "/v1/<route>", or prefix + "/<route>"
// when the prefix already ends in "/v1". Throws ft::Error (https is not supported).
struct ServerUrl {
  std::string host;
  std::string port = "80";
  std::string prefix;  // no trailing '/'
  std::string path(std::string_view route) const;  // route: "completions", "models", ...
  std::string str() const { return "http://" + host + ":" + port + prefix; }
};
ServerUrl parse_url(const std::string& url);

}  // namespace ft::loadgen
