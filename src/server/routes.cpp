#include "server/routes.h"

#include <algorithm>
#include <charconv>
#include <ctime>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "model/lora.h"
#include "server/server_impl.h"

namespace ft::server {

namespace {

namespace http = boost::beast::http;
using json = nlohmann::json;

// OpenAI's model object, with vLLM's max_model_len and Anthropic's type, display_name and
// created_at (its clients list models from the same route).
json model_card(const Server::Impl& srv) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char created_at[32];
  std::strftime(created_at, sizeof created_at, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return {{"id", srv.info.id},
          {"object", "model"},
          {"created", int64_t(now)},
          {"owned_by", "firsttoken"},
          {"max_model_len", srv.info.n_ctx},
          {"type", "model"},
          {"display_name", srv.info.id},
          {"created_at", created_at}};
}

// A LoRA adapter's card: vLLM's shape (root = its file, parent = the base model).
json adapter_card(const Server::Impl& srv, const std::string& name, const std::string& file) {
  json c = model_card(srv);
  c["id"] = name;
  c["display_name"] = name;
  c["root"] = file;
  c["parent"] = srv.info.id;
  return c;
}

json models(const Server::Impl& srv) {
  json data = json::array({model_card(srv)});
  for (const auto& [name, file] : srv.engine.adapter_files()) data.push_back(adapter_card(srv, name, file));
  // (Anthropic's page fields: one page)
  return {{"object", "list"}, {"data", data}, {"has_more", false}, {"first_id", data.front()["id"]}, {"last_id", data.back()["id"]}};
}

json model(const Server::Impl& srv, std::string_view raw_id) {
  // The id as clients put it in the path: percent-encoded (the Anthropic SDK sends org%2Fname).
  const std::optional<std::string> decoded = percent_decode(raw_id);
  if (!decoded)
    throw ApiError(400, cat("The model id in the path, '", raw_id, "', has a malformed percent escape ('%' must be "
                            "followed by two hex digits)"), "model");
  const std::string& id = *decoded;
  if (srv.info.canonical(id) == srv.info.id) return model_card(srv);
  if (const auto file = srv.engine.adapter_file(id)) return adapter_card(srv, id, *file);
  throw ApiError(404, cat("The model '", id, "' does not exist; this server serves '", srv.info.id, "'"), "model",
                 "invalid_request_error", "model_not_found");
}

// vLLM's dynamic LoRA endpoints: {"lora_name", "lora_path"[, "load_inplace"]} / {"lora_name"}.
// Errors: 400 (a bad name, a name loaded without load_inplace, a file that is not an adapter of
// this model, unloading one in use), 404 (unloading a name not loaded).
std::string lora_field(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty())
    throw ApiError(400, cat("'", key, "' must be a non-empty string"), key);
  return j[key].get<std::string>();
}

void load_lora(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  const json j = parse_json_object(req.body);
  for (const auto& [k, v] : j.items())
    if (k != "lora_name" && k != "lora_path" && k != "load_inplace")
      throw ApiError(400, "Unrecognized request argument supplied: " + k, k);
  const std::string name = lora_field(j, "lora_name"), path = lora_field(j, "lora_path");
  const bool inplace = j.contains("load_inplace") && get_bool(j, "load_inplace");  // (replaces one loaded)
  if (srv.info.canonical(name) == srv.info.id) throw ApiError(400, cat("'", name, "' is the base model's name"), "lora_name");
  // (Off the I/O threads: the file is mapped and validated there, and the engine thread, which
  // packs it between steps, waited for.)
  out.answer_later([&srv, name, path, inplace] {
    try {
      srv.engine.load_adapter(name, path, inplace);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "lora_path");
    }
    spdlog::info("loaded LoRA adapter '{}' from {}{}", name, path, inplace ? " (load_inplace)" : "");
    return Responder::Answer{200, "text/plain; charset=utf-8", cat("Success: LoRA adapter '", name, "' added successfully.")};
  });
}

void unload_lora(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  const json j = parse_json_object(req.body);
  for (const auto& [k, v] : j.items())
    if (k != "lora_name" && k != "lora_int_id") throw ApiError(400, "Unrecognized request argument supplied: " + k, k);
  const std::string name = lora_field(j, "lora_name");
  // (Off the I/O threads: the unload waits a moment for requests that still hold the adapter,
  // Engine::kAdapterUnloadGrace.)
  out.answer_later([&srv, name] {
    try {
      srv.engine.unload_adapter(name);
    } catch (const AdapterNotFound& e) {
      throw ApiError(404, e.what(), "lora_name", "invalid_request_error", "model_not_found");
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "lora_name");
    }
    spdlog::info("unloaded LoRA adapter '{}'", name);
    return Responder::Answer{200, "text/plain; charset=utf-8", cat("Success: LoRA adapter '", name, "' removed successfully.")};
  });
}

// /tokenize's answer with its tokens' texts (with_pieces, return_token_strs) is at most this many
// times max_body_bytes (64 MiB by default; a real prompt's is ~8x its text): beyond, a 400. A
// 4 MB prompt of one-byte tokens answered 103 MB, built as a JSON tree of 2.2 GB.
constexpr uint64_t kTokenizePiecesPerBodyByte = 16;

// POST /tokenize in vLLM's dialect ({"prompt"} or {"messages"} as chat takes them, rendered with
// the chat template; "return_token_strs") and llama.cpp's ({"content"}, "add_special",
// "with_pieces": tokens as {"id", "piece"}). Both answers' fields: tokens, count, max_model_len.
// The body is written as it is built (no JSON tree), in the order nlohmann's objects have.
std::string tokenize(const Server::Impl& srv, const RouteRequest& req) {
  json j = parse_json_object(req.body);
  const Tokenizer& tok = io_tokenizer();
  std::vector<int32_t> ids;
  const bool strs = j.contains("return_token_strs") && get_bool(j, "return_token_strs");
  const bool pieces = j.contains("with_pieces") && get_bool(j, "with_pieces");
  if (j.contains("messages")) {  // a chat, parsed as /v1/chat/completions parses it
    j.erase("return_token_strs");
    j.erase("with_pieces");
    if (!j.contains("model")) j["model"] = srv.info.id;
    ids = prompt_tokens(srv.gen, tok, parse_request(Endpoint::Chat, j.dump(), srv.info));
  } else {
    for (const auto& [k, v] : j.items())
      if (k != "prompt" && k != "content" && k != "add_special_tokens" && k != "add_special" && k != "model" &&
          k != "return_token_strs" && k != "with_pieces")
        throw ApiError(400, "Unrecognized request argument supplied: " + k, k);
    check_model(j, srv.info, false);
    const char* text = j.contains("prompt") ? "prompt" : "content";
    if (!j.contains(text) || !j[text].is_string()) throw ApiError(400, "'prompt' (or 'content') must be a string", text);
    bool add_special = true;
    for (const char* k : {"add_special_tokens", "add_special"})
      if (j.contains(k)) add_special = get_bool(j, k);
    ids = tok.encode(j[text].get<std::string>(), add_special && tok.add_bos_default(), true);
  }
  const uint64_t limit = kTokenizePiecesPerBodyByte * srv.cfg.max_body_bytes;
  const char* param = pieces ? "with_pieces" : "return_token_strs";
  const auto too_large = [&] {
    return ApiError(400, cat("the response would exceed ", limit, " bytes (", kTokenizePiecesPerBodyByte,
                             " x the body limit): the prompt has ", ids.size(), " tokens; ask for them without '", param,
                             "', or in parts"), param);
  };
  // (each token's least: {"id":0,"piece":""}, and "", with their commas)
  const uint64_t least = uint64_t(ids.size()) * ((pieces ? 20 : 2) + (strs ? 3 : 0));
  if ((pieces || strs) && least > limit) throw too_large();
  std::string body;
  body.reserve(size_t(std::min<uint64_t>(least + least / 2, limit) + 64));
  const auto text = [](const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); };
  body += cat("{\"count\":", ids.size(), ",\"max_model_len\":", srv.info.n_ctx);
  if (strs) {
    body += ",\"token_strs\":[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) body += ',';
      body += text(tok.token_text(ids[i]));
      if (body.size() > limit) throw too_large();
    }
    body += ']';
  }
  body += ",\"tokens\":[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) body += ',';
    if (pieces) {
      body += "{\"id\":" + std::to_string(ids[i]) + ",\"piece\":" + text(tok.token_to_piece(ids[i])) + "}";
      if (body.size() > limit) throw too_large();
    } else {
      body += std::to_string(ids[i]);
    }
  }
  body += "]}";
  return body;
}

// POST /detokenize: {"tokens"} -> the text as "prompt" (vLLM) and "content" (llama.cpp).
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
  const std::string text = io_tokenizer().decode(ids);
  return {{"prompt", text}, {"content", text}};
}

// llama.cpp's GET /props: what its web UI and clients read of a server (the context, the sampling
// a /completion gets by default, the slots, the model file, the chat template).
json props(const Server::Impl& srv) {
  const SamplingParams& d = kCliSampling;
  const json params = {{"n_predict", -1}, {"temperature", d.temperature}, {"top_k", d.top_k}, {"top_p", d.top_p},
                       {"min_p", d.min_p}, {"typical_p", d.typical_p}, {"dynatemp_range", d.dynatemp_range},
                       {"dynatemp_exponent", d.dynatemp_exponent}, {"repeat_last_n", d.penalty_last_n},
                       {"repeat_penalty", d.repetition_penalty}, {"presence_penalty", d.presence_penalty},
                       {"frequency_penalty", d.frequency_penalty}, {"mirostat", d.mirostat},
                       {"mirostat_tau", d.mirostat_tau}, {"mirostat_eta", d.mirostat_eta}, {"min_keep", d.min_keep},
                       {"stop", json::array()}, {"ignore_eos", false}, {"stream", false}, {"n_probs", 0}};
  return {{"default_generation_settings", {{"id", 0}, {"n_ctx", srv.info.n_ctx}, {"params", params}}},
          {"total_slots", srv.engine.scheduler_config().max_num_seqs},
          {"model_path", srv.cfg.model},
          {"model_alias", srv.info.id},
          {"chat_template", srv.model.chat_template_source},
          {"modalities", {{"vision", false}, {"audio", false}}},
          {"build_info", "firsttoken"}};
}

// llama.cpp's POST /apply-template: a chat request's messages (and tools, chat_template_kwargs, ...)
// rendered as /v1/chat/completions would run them -> {"prompt": text}.
json apply_template(const Server::Impl& srv, const RouteRequest& req) {
  json j = parse_json_object(req.body);
  if (!j.contains("model")) j["model"] = srv.info.id;
  const ParsedRequest pr = parse_request(Endpoint::Chat, j.dump(), srv.info);
  try {
    return {{"prompt", render_chat(srv.gen.chat, pr)}};
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages");
  } catch (const json::exception& e) {  // (the template's values: as a chat request's render)
    throw ApiError(400, cat("chat template: ", e.what()), "messages");
  }
}

// Anthropic's POST /v1/messages/count_tokens: the prompt's tokens as /v1/messages would run it
// (system, messages, tools through the chat template) -> {"input_tokens": n}.
json count_tokens(const Server::Impl& srv, const RouteRequest& req) {
  return {{"input_tokens", prompt_tokens(srv.gen, io_tokenizer(), parse_messages_request(req.body, srv.info, true)).size()}};
}

// The Responses API's stored responses: GET /v1/responses/{id} (the response object), GET
// /v1/responses/{id}/input_items (the items it was generated from, a page of them) and DELETE
// /v1/responses/{id}. An id not stored (never, or evicted, or deleted): 404.
ApiError response_not_found(std::string_view id) {
  return ApiError(404, cat("Response with id '", id, "' not found."), "response_id");
}

// OpenAI's list: {"object": "list", "data", "first_id", "last_id", "has_more"} (the ids null when
// data is empty).
json item_list(json data, bool has_more) {
  json first = data.empty() ? json(nullptr) : data.front()["id"], last = data.empty() ? json(nullptr) : data.back()["id"];
  return {{"object", "list"}, {"data", std::move(data)}, {"first_id", std::move(first)}, {"last_id", std::move(last)},
          {"has_more", has_more}};
}

// A page of items (oldest first), parsed, as item_list; query: limit 1..100 (20), order asc | desc
// (desc: the latest first), after (an item id: the page starts after it; not among them, a 400
// naming what they are, `among`).
json item_page(std::vector<const ResponseStore::Item*> items, std::string_view query, std::string_view among) {
  int64_t limit = 20;
  if (const auto v = query_value(query, "limit")) {
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), limit);
    if (ec != std::errc() || end != v->data() + v->size() || limit < 1 || limit > 100)
      throw ApiError(400, cat("'limit' must be an integer in [1, 100], got '", *v, "'"), "limit");
  }
  const std::string order = query_value(query, "order").value_or("desc");
  if (order != "asc" && order != "desc") throw ApiError(400, cat("'order' must be 'asc' or 'desc', got '", order, "'"), "order");
  if (order == "desc") std::reverse(items.begin(), items.end());
  if (query_value(query, "before")) throw ApiError(400, "'before' is not supported: page with 'after'", "before");
  size_t from = 0;
  if (const auto after = query_value(query, "after")) {
    const auto it = std::find_if(items.begin(), items.end(), [&](const ResponseStore::Item* x) { return x->id == *after; });
    if (it == items.end()) throw ApiError(400, cat("'after': no item '", *after, "' among ", among), "after");
    from = size_t(it - items.begin()) + 1;
  }
  const size_t to = std::min(items.size(), from + size_t(limit));
  json data = json::array();
  for (size_t i = from; i < to; ++i) data.push_back(json::parse(items[i]->json));
  return item_list(std::move(data), to < items.size());
}

// Its conversation before its output: its chain's items, then its request's own input (a chain's
// links no longer stored are left out), a page of them (item_page).
json input_items(const ResponseStore& store, const std::string& id, std::string_view query) {
  ResponseStore::Chain chain = store.chain(id);
  if (chain.links.empty()) throw response_not_found(id);
  return item_page(ResponseStore::items(chain, /*last_output=*/false), query, "the response's input items");
}

// A 405 for a path of a prefix route whose rows' methods do not all apply to it; allow: its own.
void not_allowed(Responder& out, std::string_view method, std::string_view path, std::string_view allow) {
  const ApiError e(405, cat("method ", method, " is not allowed on ", path), "", "invalid_request_error", "method_not_allowed");
  out.send_response(405, "application/json", error_body(e), cat("Allow: ", allow, "\r\n"));
}

void get_response(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  constexpr std::string_view kItems = "/input_items";
  if (req.tail.ends_with(kItems)) {
    const std::string id(req.tail.substr(0, req.tail.size() - kItems.size()));
    return out.send_json(input_items(srv.responses, id, req.query));
  }
  const std::string id(req.tail);
  const auto e = srv.responses.get(id);
  if (!e) throw response_not_found(id);
  // stream=true: a background stream's events again, after starting_after (a sequence number).
  if (const auto stream = query_value(req.query, "stream"); stream && *stream == "true") {
    if (!e->events)
      throw ApiError(400, "only a response created with background: true and stream: true can be streamed again; "
                          "without 'stream' it is answered whole", "stream");
    int64_t after = -1;
    if (const auto v = query_value(req.query, "starting_after")) {
      const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), after);
      if (ec != std::errc() || end != v->data() + v->size() || after < -1)
        throw ApiError(400, cat("'starting_after' must be an event's sequence number, got '", *v, "'"), "starting_after");
    }
    return out.follow(e->events, after);
  }
  out.send_json(ResponseStore::object(*e));
}

// A background response's status, stored in place of its pending self (its output so far is none).
void store_status(Server::Impl& srv, const ResponseStore::Entry& e, const char* status) {
  ResponseStore::Entry c = e;
  json r = json::parse(c.response);
  r["status"] = status;
  c.response = ResponseStore::text(r);
  c.pending = false;
  srv.responses.replace(std::move(c));
}

// POST /v1/responses/{id}/cancel: a background response still generating stops, stored as
// cancelled; one that ended is answered as stored (OpenAI's: cancelling is idempotent). Not a
// background response: 400. POST /v1/responses/{id} itself: 405, as before this route.
void cancel_response(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  constexpr std::string_view kCancel = "/cancel";
  if (!req.tail.ends_with(kCancel) || req.tail.size() == kCancel.size())
    return not_allowed(out, "POST", cat("/v1/responses/", req.tail), "GET, DELETE");
  const std::string id(req.tail.substr(0, req.tail.size() - kCancel.size()));
  const bool running = srv.background.cancel(id);  // (first: one evicted from the store still stops)
  const auto e = srv.responses.get(id);
  if (!e) throw response_not_found(id);
  if (running) {
    store_status(srv, *e, "cancelled");
    if (const auto now = srv.responses.get(id)) return out.send_json(ResponseStore::object(*now));
  }
  json r = ResponseStore::object(*e);
  if (!r.value("background", false))
    throw ApiError(400, cat("Response with id '", id, "' was not created with background: true; only background "
                            "responses can be cancelled."), "response_id");
  out.send_json(r);
}

void delete_response(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  const std::string id(req.tail);
  srv.background.cancel(id);  // (a background response still generating stops first)
  if (!srv.responses.erase(id)) throw response_not_found(id);
  out.send_json({{"id", id}, {"object", "response"}, {"deleted", true}});
}

// --- the Conversations API ---------------------------------------------------------------------
// POST /v1/conversations {items?, metadata?}; GET, POST {metadata} and DELETE /v1/conversations/{id};
// GET (a page) and POST {items} /v1/conversations/{id}/items; GET and DELETE
// /v1/conversations/{id}/items/{item_id}. A conversation or an item not stored: 404.

// A conversations body: an object (empty: {}) of `known` fields only (a null one is absent).
json conversation_body(const RouteRequest& req, std::initializer_list<std::string_view> known) {
  json j = req.body.empty() ? json::object() : parse_json_object(req.body);
  for (auto it = j.begin(); it != j.end();) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      throw ApiError(400, "Unrecognized request argument supplied: " + it.key(), it.key());
    it = it.value().is_null() ? j.erase(it) : std::next(it);
  }
  return j;
}

// Its metadata's text (absent: {}), checked.
std::string conversation_metadata(const json& j) {
  const json m = j.value("metadata", json::object());
  check_metadata(m, "metadata");
  return ResponseStore::text(m);
}

ConversationStore::Conversation stored_conversation(const Server::Impl& srv, const std::string& id) {
  std::optional<ConversationStore::Conversation> c = srv.conversations.get(id);
  if (!c) throw conversation_not_found(id, "conversation_id");
  return std::move(*c);
}

ApiError item_not_found(const std::string& id, const std::string& item_id) {
  return ApiError(404, cat("Item with id '", item_id, "' not found in conversation '", id, "'."), "item_id");
}

// A change's refusal (Change::kDone: none).
void check_change(ConversationStore::Change change, const Server::Impl& srv, const std::string& id,
                  const std::string& item_id = "") {
  using Change = ConversationStore::Change;
  switch (change) {
    case Change::kDone:
      return;
    case Change::kNoConversation:
      throw conversation_not_found(id, "conversation_id");
    case Change::kNoItem:
      throw item_not_found(id, item_id);
    case Change::kDuplicate:
      throw ApiError(400, cat("Duplicate item found with id '", item_id, "': conversation '", id, "' holds it already."),
                     "items");
    case Change::kOverTheCap:
      throw ApiError(400, conversation_over_cap(id, srv.conversations.max_conversation_bytes()), "items");
    case Change::kBusy:
      throw conversation_locked();
  }
}

void create_conversation(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  const json j = conversation_body(req, {"items", "metadata"});
  if (srv.conversations.max_conversations() <= 0 || srv.conversations.max_bytes() == 0)
    throw ApiError(400, needs_the_store("conversations"));
  ConversationStore::Conversation c;
  c.id = new_item_id("conv_");
  c.created_at = int64_t(std::time(nullptr));
  c.metadata = conversation_metadata(j);
  if (j.contains("items"))
    for (ResponseStore::Item& it : ResponseStore::to_items(conversation_items(j["items"], &srv.responses)))
      c.items.push_back(std::make_shared<const ResponseStore::Item>(std::move(it)));
  const json object = ConversationStore::object(c);
  if (!srv.conversations.put(std::move(c)))
    throw ApiError(400, conversation_over_cap("", srv.conversations.max_conversation_bytes()), "items");
  out.send_json(object);
}

// A path's tail: "{id}", "{id}/items" or "{id}/items/{item_id}" (else: a 404, no such route).
struct ConversationPath {
  std::string id;
  bool items = false;
  std::string item;  // "" when none
};
ConversationPath conversation_path(std::string_view tail) {
  ConversationPath p;
  const size_t slash = tail.find('/');
  p.id = tail.substr(0, slash);
  const std::string_view rest = slash == std::string_view::npos ? std::string_view() : tail.substr(slash);
  constexpr std::string_view kItems = "/items", kItem = "/items/";
  if (rest == kItems) {
    p.items = true;
  } else if (rest.starts_with(kItem) && rest.size() > kItem.size() && rest.find('/', kItem.size()) == std::string_view::npos) {
    p.items = true;
    p.item = rest.substr(kItem.size());
  } else if (!rest.empty() || p.id.empty()) {
    throw ApiError(404, cat("no route for /v1/conversations/", tail), "", "invalid_request_error", "not_found");
  }
  return p;
}

void get_conversation(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  const ConversationPath p = conversation_path(req.tail);
  const ConversationStore::Conversation c = stored_conversation(srv, p.id);
  if (!p.items) return out.send_json(ConversationStore::object(c));
  const std::vector<const ResponseStore::Item*> items = ConversationStore::items(c);
  if (p.item.empty()) return out.send_json(item_page(items, req.query, "the conversation's items"));
  for (const ResponseStore::Item* it : items)
    if (it->id == p.item) return out.send_response(200, "application/json", it->json);
  throw item_not_found(p.id, p.item);
}

void post_conversation(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  const ConversationPath p = conversation_path(req.tail);
  if (!p.item.empty()) return not_allowed(out, "POST", cat("/v1/conversations/", req.tail), "GET, DELETE");
  if (!p.items) {  // its metadata set (null or absent: none)
    json object;  // (as the change left it: a delete meanwhile does not turn it into a 404)
    check_change(srv.conversations.set_metadata(p.id, conversation_metadata(conversation_body(req, {"metadata"})), &object),
                 srv, p.id);
    return out.send_json(object);
  }
  const json j = conversation_body(req, {"items"});
  if (!j.contains("items")) throw ApiError(400, "'items' is required", "items");
  json items = conversation_items(j["items"], &srv.responses);
  std::string duplicate;
  check_change(srv.conversations.add(p.id, ResponseStore::to_items(items), &duplicate), srv, p.id, duplicate);
  out.send_json(item_list(std::move(items), false));
}

void delete_conversation(Server::Impl& srv, Responder& out, const RouteRequest& req) {
  const ConversationPath p = conversation_path(req.tail);
  if (p.items && p.item.empty()) return not_allowed(out, "DELETE", cat("/v1/conversations/", req.tail), "GET, POST");
  if (p.items) {  // (OpenAI's answer: the conversation)
    json object;
    check_change(srv.conversations.erase_item(p.id, p.item, &object), srv, p.id, p.item);
    return out.send_json(object);
  }
  if (!srv.conversations.erase(p.id)) throw conversation_not_found(p.id, "conversation_id");
  out.send_json({{"id", p.id}, {"object", "conversation.deleted"}, {"deleted", true}});
}

void health(Server::Impl&, Responder& out, const RouteRequest&) { out.send_json({{"status", "ok"}}); }
void list_models(Server::Impl& srv, Responder& out, const RouteRequest&) { out.send_json(models(srv)); }

// A route that generates: the HTTP session's one generation path, as endpoint E.
template <Endpoint E>
void generate(Server::Impl&, Responder& out, const RouteRequest& req) {
  out.generate(E, req.body);
}

const Route kRoutes[] = {
    {"/health", http::verb::get, health},
    {"/v1/health", http::verb::get, health},  // (llama.cpp serves both paths, and /models)
    {"/v1/models", http::verb::get, list_models},
    {"/models", http::verb::get, list_models},
    {"/v1/models/*", http::verb::get,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) { out.send_json(model(srv, req.tail)); }},
    {"/metrics", http::verb::get,
     [](Server::Impl& srv, Responder& out, const RouteRequest&) {
       std::string text = srv.metrics.render(srv.engine.metrics());
       // The stores, as --max-stored-responses and --max-stored-bytes count them.
       render_gauge(text, "firsttoken:stored_responses", "Responses stored (the Responses API).", double(srv.responses.size()));
       render_gauge(text, "firsttoken:stored_response_bytes", "Bytes of the stored responses.", double(srv.responses.bytes()));
       render_gauge(text, "firsttoken:stored_conversations", "Conversations stored (the Conversations API).",
                    double(srv.conversations.size()));
       render_gauge(text, "firsttoken:stored_conversation_bytes", "Bytes of the stored conversations.",
                    double(srv.conversations.bytes()));
       out.send_response(200, "text/plain; version=0.0.4; charset=utf-8", text);
     }},
    {"/tokenize", http::verb::post,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) {
       out.send_response(200, "application/json", tokenize(srv, req));
     }},
    {"/detokenize", http::verb::post,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) { out.send_json(detokenize(srv, req)); }},
    {"/props", http::verb::get, [](Server::Impl& srv, Responder& out, const RouteRequest&) { out.send_json(props(srv)); }},
    {"/apply-template", http::verb::post,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) { out.send_json(apply_template(srv, req)); }},
    {"/v1/load_lora_adapter", http::verb::post, load_lora},
    {"/v1/unload_lora_adapter", http::verb::post, unload_lora},
    {"/v1/completions", http::verb::post, generate<Endpoint::Completions>},
    {"/v1/responses", http::verb::post, generate<Endpoint::Responses>},
    {"/v1/responses/*", http::verb::get, get_response},
    {"/v1/responses/*", http::verb::delete_, delete_response},
    {"/v1/responses/*", http::verb::post, cancel_response},
    {"/v1/conversations", http::verb::post, create_conversation},
    {"/v1/conversations/*", http::verb::get, get_conversation},
    {"/v1/conversations/*", http::verb::post, post_conversation},
    {"/v1/conversations/*", http::verb::delete_, delete_conversation},
    {"/v1/chat/completions", http::verb::post, generate<Endpoint::Chat>},
    {"/chat/completions", http::verb::post, generate<Endpoint::Chat>},  // (llama.cpp serves both paths)
    {"/v1/embeddings", http::verb::post, generate<Endpoint::Embeddings>},
    // llama.cpp's own embeddings answer, on both of its paths.
    {"/embedding", http::verb::post, generate<Endpoint::NativeEmbeddings>},
    {"/embeddings", http::verb::post, generate<Endpoint::NativeEmbeddings>},
    {"/v1/messages", http::verb::post, generate<Endpoint::Messages>},  // Anthropic's
    {"/v1/messages/count_tokens", http::verb::post,
     [](Server::Impl& srv, Responder& out, const RouteRequest& req) { out.send_json(count_tokens(srv, req)); }},
    // llama.cpp's native completion (both of its paths) and fill-in-the-middle.
    {"/completion", http::verb::post, generate<Endpoint::Native>},
    {"/completions", http::verb::post, generate<Endpoint::Native>},
    {"/infill", http::verb::post, generate<Endpoint::Infill>},
};

}  // namespace

namespace {
bool literal_match(const Route& r, std::string_view path) { return r.path == path; }
bool prefix_match(const Route& r, std::string_view path) {
  return r.path.ends_with('*') && path.size() >= r.path.size() && path.starts_with(r.path.substr(0, r.path.size() - 1));
}
}  // namespace

const Route* find_route(std::string_view path, http::verb method) {
  for (auto match : {literal_match, prefix_match})
    for (const Route& r : kRoutes)
      if (r.method == method && match(r, path)) return &r;
  return nullptr;
}

std::string route_methods(std::string_view path) {
  std::string out;
  for (auto match : {literal_match, prefix_match}) {
    for (const Route& r : kRoutes)
      if (match(r, path)) {
        const std::string m(http::to_string(r.method));
        if (out.find(m) == std::string::npos) out += (out.empty() ? "" : ", ") + m;
      }
    if (!out.empty()) return out;  // (a literal path's methods are its own, not a prefix row's)
  }
  return out;
}

std::optional<std::string> query_value(std::string_view query, std::string_view key) {
  for (size_t at = 0; at <= query.size();) {
    const size_t amp = std::min(query.find('&', at), query.size());
    const std::string_view pair = query.substr(at, amp - at);
    const size_t eq = std::min(pair.find('='), pair.size());
    if (pair.substr(0, eq) == key) {
      std::string raw(pair.substr(std::min(eq + 1, pair.size())));
      std::replace(raw.begin(), raw.end(), '+', ' ');
      std::optional<std::string> v = percent_decode(raw);
      if (!v) throw ApiError(400, cat("the query's '", key, "' has a malformed percent escape"), std::string(key));
      return v;
    }
    at = amp + 1;
  }
  return std::nullopt;
}

std::optional<std::string> percent_decode(std::string_view s) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return std::nullopt;  // (a '%' without two characters after it)
    const int a = hex(s[i + 1]), b = hex(s[i + 2]);
    if (a < 0 || b < 0) return std::nullopt;
    out += char(a * 16 + b);
    i += 2;
  }
  return out;
}

}  // namespace ft::server
