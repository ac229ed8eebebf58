// The HTTP route table: each row is a path, its method and the handler that answers it.
#pragma once
#include <boost/beast/http/verb.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api.h"
#include "server/server.h"

namespace ft::server {

class EventLog;

// What a handler answers through (the HTTP session implements it).
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send_json(const nlohmann::json& j) = 0;
  // extra: "Name: value\r\n" header lines.
  virtual void send_response(int status, std::string_view type, const std::string& body,
                             std::string_view extra = {}) = 0;
  // A completion: SSE chunks or one JSON body, as the request says.
  virtual void generate(Endpoint kind, const std::string& body) = 0;
  // A response whose work may block (a file to map, the engine thread to wait for): work runs
  // on the server's blocking-work thread, never an I/O thread, and what it returns (or the
  // ApiError it throws) is sent here. It must not touch the connection.
  struct Answer {
    int status = 200;
    std::string type, body;
  };
  virtual void answer_later(std::function<Answer()> work) = 0;
  // A background response's stream again (GET /v1/responses/{id}?stream=true): its events after
  // sequence number `after` (-1: all), then each as it comes, to its end.
  virtual void follow(const std::shared_ptr<EventLog>& log, int64_t after) = 0;
};

// What a handler reads of its request: the body, for a prefix route the path after it, and the
// query (after '?', undecoded).
struct RouteRequest {
  const std::string& body;
  std::string_view tail;  // "/v1/models/m" on the route "/v1/models/*": "m"
  std::string_view query = {};
};

struct Route {
  std::string_view path;  // a literal: NUL-terminated; "...*": a prefix (the rest is RouteRequest::tail)
  boost::beast::http::verb method;
  // Throws ApiError for the client.
  void (*handle)(Server::Impl& srv, Responder& out, const RouteRequest& req);
};

// A path segment's percent escapes decoded ("org%2Fstories" -> "org/stories"; '+' stays '+'), or
// nullopt when an escape is malformed ('%' not followed by two hex digits).
std::optional<std::string> percent_decode(std::string_view s);

// The row for path (without its query) and method, or null; a literal row before a prefix one.
const Route* find_route(std::string_view path, boost::beast::http::verb method);
// The methods path has rows for ("GET, DELETE"; "" when none): a 405's Allow.
std::string route_methods(std::string_view path);
// A query's value of key, percent-decoded ('+' as a space); nullopt when absent; ApiError (400
// naming key) when its escapes are malformed.
std::optional<std::string> query_value(std::string_view query, std::string_view key);

}  // namespace ft::server
