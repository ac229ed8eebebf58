// JSON text as nlohmann::ordered_json, its objects' keys in the text's order, in time linear in the
// text. A request's parse (nlohmann::json) sorts an object's keys; where the order is the client's
// meaning (a schema's properties, a call's arguments, a tool as a chat template shows it), the
// text is read again with this. nlohmann's own ordered parse scans an object's keys for each new
// one (200,000 properties: 2e10 comparisons).
#pragma once
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace ft {
namespace json_ordered_detail {

using json = nlohmann::ordered_json;

// nlohmann's SAX events into an ordered_json, an object's keys indexed while it is open (its
// members appended to its vector; a repeated key's value replaced in place).
class OrderedBuilder {
 public:
  json root;

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const std::string&) { return put(v); }
  bool string(std::string& v) { return put(std::move(v)); }
  bool binary(json::binary_t&) { return false; }  // (not in JSON text)
  bool start_object(size_t) { return open(json::object()); }
  bool start_array(size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    auto& members = static_cast<json::object_t::Container&>(open_.back().value->get_ref<json::object_t&>());
    const auto [it, fresh] = open_.back().keys.emplace(k, members.size());
    if (fresh) members.emplace_back(std::move(k), nullptr);
    slot_ = &members[it->second].second;
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

 private:
  struct Open {
    json* value;
    std::unordered_map<std::string, size_t> keys;  // an object's: key -> its index
  };
  json* place(json v) {
    if (open_.empty()) return &(root = std::move(v));
    json& top = *open_.back().value;
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    return &(*slot_ = std::move(v));
  }
  bool put(json v) {
    place(std::move(v));
    return true;
  }
  bool open(json v) {
    open_.push_back({place(std::move(v)), {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }
  // (A value's place stays put while it is open: only the innermost open value grows.)
  std::vector<Open> open_;
  json* slot_ = nullptr;  // the value of the key just read
};
}  // namespace json_ordered_detail

// text as ordered_json (a repeated key's last value, at its first place, as nlohmann's parse has
// it), or a discarded value when it is not JSON. Nesting is the caller's to bound (core/json_depth.h).
inline nlohmann::ordered_json parse_ordered_json(std::string_view text) {
  using json_ordered_detail::json;
  json_ordered_detail::OrderedBuilder b;
  if (!json::sax_parse(text.begin(), text.end(), &b)) return json(json::value_t::discarded);
  return std::move(b.root);
}

}  // namespace ft
