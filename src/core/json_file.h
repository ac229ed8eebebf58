// A JSON document a person wrote (a config file, a workload): parsed strictly, or an Error naming
// what is wrong. nlohmann keeps the last of two equal keys of an object without a word, so a
// setting written twice ({"server": {"threads": 1, "threads": 1000}}) silently took the second.
#pragma once
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_depth.h"

namespace ft {

// Throws Error "WHAT: not valid JSON", "WHAT: nests more than N levels" or "WHAT: the key 'a.b'
// is given twice" (the key's path of object keys).
inline nlohmann::json parse_json_file_text(std::string_view text, const std::string& what) {
  if (!json_depth_within(text)) fail(what, ": nests more than ", kMaxJsonDepth, " levels");
  struct Open {
    bool object;
    std::set<std::string> keys;  // an object's keys so far
  };
  std::vector<Open> open;         // the containers being read, innermost last
  std::vector<std::string> path;  // the keys leading to the value being read
  std::string duplicate;
  using E = nlohmann::json::parse_event_t;
  const auto value_done = [&] {  // a value ended: if it was a key's, that key is done
    if (!open.empty() && open.back().object) path.pop_back();
  };
  const auto cb = [&](int, E event, nlohmann::json& parsed) {
    switch (event) {
      case E::object_start:
      case E::array_start:
        open.push_back({event == E::object_start, {}});
        break;
      case E::key: {
        const std::string k = parsed.get<std::string>();
        if (!open.back().keys.insert(k).second && duplicate.empty()) {
          for (const std::string& p : path) duplicate += p + ".";
          duplicate += k;
        }
        path.push_back(k);
        break;
      }
      case E::object_end:
      case E::array_end:
        open.pop_back();
        value_done();
        break;
      case E::value:
        value_done();
        break;
    }
    return true;
  };
  const nlohmann::json doc = nlohmann::json::parse(text, cb, /*allow_exceptions=*/false);
  if (doc.is_discarded()) fail(what, ": not valid JSON");
  if (!duplicate.empty()) fail(what, ": the key '", duplicate, "' is given twice");
  return doc;
}

}  // namespace ft
