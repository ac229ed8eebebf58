// UTF-8 helpers and the GPT-2 byte-level alphabet.
#include <array>

#include "tokenizer/tokenizer_internal.h"

namespace ft::tok {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t decode_utf8(std::string_view s, size_t pos, uint32_t& cp) {
  const auto byte = [&](size_t i) { return uint8_t(s[i]); };
  const uint8_t c = byte(pos);
  size_t len;
  uint32_t min_cp;
  if (c < 0x80) {
    cp = c;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F, min_cp = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F, min_cp = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07, min_cp = 0x10000;
  } else {
    return 0;
  }
  if (pos + len > s.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    const uint8_t cc = byte(pos + i);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

size_t incomplete_utf8_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t c = uint8_t(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3;
    else if (c >= 0xF0 && c <= 0xF4) need = 4;
    return need > back ? back : 0;
  }
  return 0;  // no lead within reach: nothing that more bytes could complete
}

namespace {

struct Gpt2Alphabet {
  std::array<int16_t, 0x144> cp_to_byte{};  // every code point of the alphabet is below 0x144

  Gpt2Alphabet() {
    cp_to_byte.fill(-1);
    const auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? uint32_t(b) : next++;
      cp_to_byte[cp] = int16_t(b);
    }
  }
};

const Gpt2Alphabet& alphabet() {
  static const Gpt2Alphabet a;
  return a;
}

}  // namespace

int gpt2_codepoint_to_byte(uint32_t cp) {
  return cp < alphabet().cp_to_byte.size() ? alphabet().cp_to_byte[cp] : -1;
}

bool gpt2_decode(std::string_view text, std::string& raw) {
  raw.clear();
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp;
    const size_t len = decode_utf8(text, pos, cp);
    if (len == 0) return false;
    const int b = gpt2_codepoint_to_byte(cp);
    if (b < 0) return false;
    raw.push_back(char(b));
    pos += len;
  }
  return true;
}

}  // namespace ft::tok
