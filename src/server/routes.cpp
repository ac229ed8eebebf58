#include "server/routes.h"

#include <ctime>

#include "core/error.h"
#include "server/server_impl.h"

namespace ft::server {

namespace {

namespace http = boost::beast::http;
using json = nlohmann::json;

json model_card(const Server::Impl& srv) {
  return {{"id", srv.info.id},
          {"object", "model"},
          {"created", int64_t(std::time(nullptr))},
          {"owned_by", "firsttoken"},
          {"max_model_len", srv.info.n_ctx}};
}

json models(const Server::Impl& srv) { return {{"object", "list"}, {"data", json::array({model_card(srv)})}}; }

json model(const Server::Impl& srv, std::string_view id) {
  if (id != srv.info.id)
    throw ApiError(404, cat("The model '", id, "' does not exist; this server serves '", srv.info.id, "'"), "model",
                   "invalid_request_error", "model_not_found");
  return model_card(srv);
}

json tokenize(const Server::Impl& srv, const RouteRequest& req) {
  const json j = parse_json_object(req.body);
  for (const auto& [k, v] : j.items())
    if (k != "prompt" && k != "add_special_tokens" && k != "model")
      throw ApiError(400, "Unrecognized request argument supplied: " + k, k);
  check_model(j, srv.info, false);
  if (!j.contains("prompt") || !j["prompt"].is_string()) throw ApiError(400, "'prompt' must be a string", "prompt");
  bool add_special = true;
  if (j.contains("add_special_tokens")) {
    if (!j["add_special_tokens"].is_boolean())
      throw ApiError(400, "'add_special_tokens' must be a boolean", "add_special_tokens");
    add_special = j["add_special_tokens"].get<bool>();
  }
  const Tokenizer& tok = io_tokenizer();
  const auto ids = tok.encode(j["prompt"].get<std::string>(), add_special && tok.add_bos_default(), true);
  return {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", srv.info.n_ctx}};
}

json detokenize(const Server::Impl& srv, const RouteRequest& req) {
  const json j = parse_json_object(req.body);
  for (const auto& [k, v] : j.items())
    if (k != "tokens" && k != "model") throw ApiError(400, "Unrecognized request argument supplied: " + k, k);
  if (!j.contains("tokens") || !j["tokens"].is_array())
    throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
  std::vector<int32_t> ids;
  for (const json& t : j["tokens"]) {
    if (!t.is_number_integer()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
    ids.push_back(check_token_id(t.get<int64_t>(), srv.info.n_vocab, "tokens"));
  }
  return {{"prompt", io_tokenizer().decode(ids)}};
}

const Route kRoutes[] = {
    {"/health", http::verb::get, [](Server::Impl&, Responder& out, const RouteRequest&) { out.send_json({{"status", "ok"}}); }},
    {"/v1/models", http::verb::get, [](Server::Impl& srv, Responder& out, const RouteRequest&) { out.send_json(models(srv)); }},
    {"/v1/models/*", http::verb::get,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) { out.send_json(model(srv, req.tail)); }},
    {"/metrics", http::verb::get,
     [](Server::Impl& srv, Responder& out, const RouteRequest&) {
       out.send_response(200, "text/plain; version=0.0.4; charset=utf-8", srv.metrics.render(srv.engine.metrics()));
     }},
    {"/tokenize", http::verb::post,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) { out.send_json(tokenize(srv, req)); }},
    {"/detokenize", http::verb::post,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) { out.send_json(detokenize(srv, req)); }},
    {"/v1/completions", http::verb::post,
     [](Server::Impl&, Responder& out, const RouteRequest& req) { out.generate(Endpoint::Completions, req.body); }},
    {"/v1/responses", http::verb::post,
     [](Server::Impl&, Responder& out, const RouteRequest& req) { out.generate(Endpoint::Responses, req.body); }},
    {"/v1/chat/completions", http::verb::post,
     [](Server::Impl&, Responder& out, const RouteRequest& req) { out.generate(Endpoint::Chat, req.body); }},
};

}  // namespace

const Route* find_route(std::string_view path) {
  for (const Route& r : kRoutes)
    if (r.path == path) return &r;
  for (const Route& r : kRoutes)
    if (r.path.ends_with('*') && path.size() >= r.path.size() && path.starts_with(r.path.substr(0, r.path.size() - 1)))
      return &r;
  return nullptr;
}

}  // namespace ft::server
