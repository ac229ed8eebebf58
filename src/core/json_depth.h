// A bound on how deeply JSON text nests arrays and objects, checked on the text before it is
// parsed: nlohmann's parser is iterative, but copying and dumping a tree recurse per level, and
// so does the chat-template renderer (a 200 KB request body of '[' overflowed a thread's stack).
#pragma once
#include <string_view>

namespace ft {

inline constexpr int kMaxJsonDepth = 128;

// Whether the arrays and objects of text (strings skipped) nest at most max_depth deep. Text
// that is not JSON passes or not; its parse decides.
inline bool json_depth_within(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace ft
