// Byte-level BPE pre-tokenizers: llama.cpp's regex chains (src/llama-vocab.cpp, llm_tokenizer_bpe)
// run with PCRE2.
//
// llama.cpp evaluates these with hand-written matchers (gpt2, llama3) or std::regex over a
// text whose non-ASCII code points are collapsed to one byte per Unicode category. Both agree
// with a real Unicode regex engine when \s means llama.cpp's whitespace set (Unicode
// White_Space), which PCRE2's UCP \s is not quite (it misses U+0085), so \s and \S are spelt out.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/tokenizer_internal.h"

namespace ft::tok {

namespace {

#define FT_WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define FT_S "[" FT_WS "]"
#define FT_NOT_S "[^" FT_WS "]"

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" FT_WS "\\p{L}\\p{N}]+|" FT_S "+(?!" FT_NOT_S
    ")|" FT_S "+";

// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
#define FT_LLAMA3_LIKE(DIGITS)                                                                  \
  "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" DIGITS \
  "| ?[^" FT_WS "\\p{L}\\p{N}]+[\\r\\n]*|" FT_S "*[\\r\\n]+|" FT_S "+(?!" FT_NOT_S ")|" FT_S "+"
constexpr const char* kLlama3 = FT_LLAMA3_LIKE("\\p{N}{1,3}");
// Qwen2: as Llama 3 but one digit per piece.
constexpr const char* kQwen2 = FT_LLAMA3_LIKE("\\p{N}");

// GPT-4o's o200k (Phi-4, gpt-oss: "gpt-4o") and Mistral's Tekken ("tekken": Nemo, Small 3,
// Devstral): letters split at lower-to-upper case changes, as their tokenizer.json says:
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+C?|
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*C?|
//   DIGITS| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with C = (?i:'s|'t|'re|'ve|'m|'ll|'d) and DIGITS = \p{N}{1,3} for o200k, no C and DIGITS = \p{N}
// for Tekken. (llama.cpp runs a std::regex stand-in for the case classes, letters that are not
// a-z / not A-Z, which differs from these on non-ASCII cased letters and on combining marks
// (\p{M}: Devanagari, Thai, Arabic vowel signs), which it does not count as letters; PCRE2 runs
// the originals.)
#define FT_CASED_SPLIT(C, DIGITS)                                                                              \
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" C          \
  "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" C "|" DIGITS \
  "| ?[^" FT_WS "\\p{L}\\p{N}]+[\\r\\n/]*|" FT_S "*[\\r\\n]+|" FT_S "+(?!" FT_NOT_S ")|" FT_S "+"
constexpr const char* kO200k = FT_CASED_SPLIT("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?", "\\p{N}{1,3}");
constexpr const char* kTekken = FT_CASED_SPLIT("", "\\p{N}");

// Cased letters (Unicode L&) as listed by DeepSeek LLM's tokenizer.
constexpr const char* kDeepseekLetters =
    "\\x{41}-\\x{5A}\\x{61}-\\x{7A}\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}"
    "\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}"
    "\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
    "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}"
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}"
    "\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}"
    "\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}"
    "\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}"
    "\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}"
    "\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}"
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
    "\\x{1E900}-\\x{1E943}";
// CJK ideographs (U+4E00..U+9FA5), U+0800..U+4E00 and Hangul (U+AC00..U+D7FF).
#define FT_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

struct PreSpec {
  const char* name;
  bool ignore_merges;
  std::vector<std::string> regexes;
  bool add_bos = false;  // llama.cpp's default where tokenizer.ggml.add_bos_token is absent
};

const std::vector<PreSpec>& specs() {
  static const std::vector<PreSpec> all = [] {
    const std::vector<std::string> gpt2 = {kGpt2};
    const std::vector<std::string> llama3 = {kLlama3};
    const std::vector<std::string> qwen2 = {kQwen2};
    const std::vector<std::string> o200k = {kO200k};
    const std::vector<std::string> tekken = {kTekken};
    const std::vector<std::string> starcoder = {"\\p{N}", kGpt2};
    const std::vector<std::string> deepseek_llm = {
        "[\\r\\n]",
        std::string(FT_S "?[") + kDeepseekLetters + "]+",
        FT_S "?[\\x{21}-\\x{2F}\\x{3A}-\\x{7E}\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}"
             "\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
        FT_S "+$",
        FT_DEEPSEEK_CJK,
        "\\p{N}+",
    };
    const std::vector<std::string> deepseek_coder = {
        "[\\r\\n]", FT_S "?\\p{L}+", FT_S "?\\p{P}+", FT_DEEPSEEK_CJK, "\\p{N}",
    };
    const std::vector<std::string> falcon = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"};
    return std::vector<PreSpec>{
        {"gpt-2", false, gpt2},
        {"default", false, gpt2},
        {"mpt", false, gpt2},
        {"phi-2", false, gpt2},
        {"olmo", false, gpt2},
        {"llama-bpe", true, llama3, true},
        {"llama3", true, llama3, true},
        {"llama-v3", true, llama3, true},
        {"dbrx", false, llama3},
        {"smaug-bpe", false, llama3},
        {"qwen2", false, qwen2},
        {"deepseek-r1-qwen", false, qwen2},
        {"stablelm2", false, qwen2},
        {"deepseek-llm", false, deepseek_llm},
        {"deepseek-coder", false, deepseek_coder},
        {"falcon", false, falcon},
        {"starcoder", false, starcoder},
        {"refact", false, starcoder},
        {"smollm", false, starcoder},
        {"gpt-4o", false, o200k},
        {"tekken", true, tekken, true},  // (llama.cpp: ignore_merges, add_bos)
    };
  }();
  return all;
}

const PreSpec* find_spec(std::string_view name) {
  for (const auto& s : specs())
    if (name == s.name) return &s;
  return nullptr;
}

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

struct PreTokenizer::Compiled {
  struct Regex {
    std::unique_ptr<pcre2_code, CodeDeleter> code;
    bool jit;  // pcre2_jit_match: the JIT fast path without pcre2_match's per-call checks
  };
  const PreSpec* spec = nullptr;
  std::vector<Regex> regexes;
};

// Per-copy matching state: PCRE2 match data and JIT stack must not be shared between threads.
struct PreTokenizer::Scratch {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  std::vector<Span> next;  // pieces produced by the regex being applied

  explicit Scratch(const Compiled& compiled) {
    uint32_t max_pairs = 1;
    for (const auto& regex : compiled.regexes) {
      uint32_t n = 0;
      pcre2_pattern_info(regex.code.get(), PCRE2_INFO_CAPTURECOUNT, &n);
      max_pairs = std::max(max_pairs, n + 1);
    }
    match_data = pcre2_match_data_create(max_pairs, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (!match_data || !context || !jit_stack) {
      release();
      throw std::bad_alloc();
    }
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~Scratch() { release(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  void release() {
    if (match_data) pcre2_match_data_free(match_data);
    if (context) pcre2_match_context_free(context);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    match_data = nullptr, context = nullptr, jit_stack = nullptr;
  }
};

bool PreTokenizer::is_known(std::string_view name) { return find_spec(name) != nullptr; }
bool PreTokenizer::adds_bos(std::string_view name) {
  const PreSpec* s = find_spec(name);
  return s && s->add_bos;
}

PreTokenizer::PreTokenizer(std::string_view name) {
  const PreSpec* spec = find_spec(name);
  if (!spec) fail("unknown pre-tokenizer '", name, "'");
  auto compiled = std::make_shared<Compiled>();
  compiled->spec = spec;
  for (const auto& pattern : spec->regexes) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    // MATCH_INVALID_UTF: malformed UTF-8 is never part of a match, so it ends up in the gaps
    // between matches instead of failing the whole call. DOLLAR_ENDONLY: '$' is the end of the
    // piece as in ECMAScript, not also "before a final newline".
    pcre2_code* code = pcre2_compile(
        reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &err, &err_offset,
        nullptr);
    if (!code)
      fail("pre-tokenizer '", name, "': regex does not compile at offset ", err_offset, ": ",
           pcre2_message(err));
    const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // else interpreted
    compiled->regexes.push_back({std::unique_ptr<pcre2_code, CodeDeleter>(code), jit});
  }
  compiled_ = std::move(compiled);
  scratch_ = std::make_unique<Scratch>(*compiled_);
}

PreTokenizer::PreTokenizer(const PreTokenizer& other)
    : compiled_(other.compiled_), scratch_(std::make_unique<Scratch>(*compiled_)) {}

PreTokenizer& PreTokenizer::operator=(const PreTokenizer& other) {
  if (this != &other) {
    auto scratch = std::make_unique<Scratch>(*other.compiled_);
    compiled_ = other.compiled_;
    scratch_ = std::move(scratch);
  }
  return *this;
}

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

bool PreTokenizer::ignore_merges() const { return compiled_->spec->ignore_merges; }

void PreTokenizer::split(std::string_view text, std::vector<Span>& out) const {
  if (text.empty()) return;
  Scratch& s = *scratch_;
  const size_t first_out = out.size();
  out.push_back({0, text.size()});
  const auto* subject_base = reinterpret_cast<PCRE2_SPTR>(text.data());

  for (const auto& regex : compiled_->regexes) {
    s.next.clear();
    for (size_t p = first_out; p < out.size(); ++p) {
      const Span piece = out[p];
      PCRE2_SPTR subject = subject_base + piece.begin;
      size_t pos = 0;
      size_t gap = 0;  // start of the text not yet emitted
      while (pos < piece.size) {
        const int rc =
            regex.jit ? pcre2_jit_match(regex.code.get(), subject, piece.size, pos, 0,
                                        s.match_data, s.context)
                      : pcre2_match(regex.code.get(), subject, piece.size, pos, 0, s.match_data,
                                    s.context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) fail("pre-tokenizer: regex match failed: ", pcre2_message(rc));
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.match_data);
        const size_t begin = ovector[0], end = ovector[1];
        if (end == begin) {  // none of the patterns can match empty; step over it regardless
          pos = begin + 1;
          while (pos < piece.size && (uint8_t(subject[pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (begin > gap) s.next.push_back({piece.begin + gap, begin - gap});
        s.next.push_back({piece.begin + begin, end - begin});
        gap = pos = end;
      }
      if (gap < piece.size) s.next.push_back({piece.begin + gap, piece.size - gap});
    }
    out.resize(first_out);
    out.insert(out.end(), s.next.begin(), s.next.end());
  }
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  std::vector<Span> spans;
  split(text, spans);
  std::vector<std::string> pieces;
  pieces.reserve(spans.size());
  for (const Span& sp : spans) pieces.emplace_back(text.substr(sp.begin, sp.size));
  return pieces;
}

}  // namespace ft::tok
