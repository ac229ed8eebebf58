// Tokenizer: loading from GGUF metadata, special-token partitioning, encode/decode dispatch and
// the streaming detokenizer. The algorithms live in spm.cpp, bpe.cpp and pretokenize.cpp.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <span>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer_internal.h"

namespace ft {

using tok::Vocab;

struct Tokenizer::Impl {
  std::shared_ptr<const Vocab> vocab;
  std::optional<tok::PreTokenizer> pre;  // byte-level BPE only
};

namespace tok {

int32_t Vocab::piece_id_for(std::string_view bytes) {
  // Ids of pieces outside the vocabulary continue after it, in order of first use.
  return bytes_to_piece.insert(bytes, int32_t(bytes_to_piece.size()) + n_vocab() - n_bpe_tokens);
}

void partition_special(const Vocab& vocab, std::string_view text, bool parse_special,
                       std::vector<Fragment>& out) {
  const auto& trie = vocab.specials;
  const auto allowed = [&](TokenId t) {
    const TokenType type = vocab.type[t];
    return type == TokenType::USER_DEFINED ||
           (parse_special && (type == TokenType::CONTROL || type == TokenType::UNKNOWN));
  };

  // Every occurrence of every eligible special token: (priority, position, token).
  struct Hit {
    int32_t priority;
    size_t pos;
    TokenId token;
  };
  std::vector<Hit> hits;
  const size_t n = text.size();
  // Real vocabularies nest few special tokens in one another (a position starts 1-2 of them); one
  // whose specials nest hundreds deep would make positions x depth hits.
  constexpr size_t kMaxMatchesPerByte = 64;
  const size_t max_hits = kMaxMatchesPerByte * n + 4096;
  for (size_t i = 0; i < n; ++i) {
    int32_t node = trie.root[uint8_t(text[i])];
    for (size_t j = i; node >= 0;) {
      const TokenId t = trie.token_at[node];
      if (t >= 0 && allowed(t)) {
        if (hits.size() == max_hits)
          fail("tokenizer: the text matches more than ", max_hits, " special tokens (a vocabulary whose special tokens nest deeply)");
        hits.push_back({trie.priority[t], i, t});
      }
      if (++j == n) break;
      const int32_t* child = trie.edges.find((uint64_t(node) << 8) | uint8_t(text[j]));
      node = child ? *child : -1;
    }
  }
  if (hits.empty()) {
    out.push_back({-1, 0, n});
    return;
  }

  // Higher-priority tokens claim first; a token takes its leftmost occurrences that lie wholly
  // in unclaimed text, which is what repeated find() over the remaining fragments yields.
  std::sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.pos < b.pos;
  });
  std::map<size_t, Fragment> taken;  // by begin, disjoint: O(log) a hit
  for (const Hit& h : hits) {
    const size_t len = vocab.text[h.token].size();
    auto next = taken.lower_bound(h.pos);  // the first taken at or after h.pos
    if (next != taken.end() && next->first < h.pos + len) continue;
    if (next != taken.begin() && std::prev(next)->first + std::prev(next)->second.size > h.pos) continue;
    taken.emplace_hint(next, h.pos, Fragment{h.token, h.pos, len});
  }
  size_t pos = 0;
  for (const auto& [begin, f] : taken) {
    if (f.begin > pos) out.push_back({-1, pos, f.begin - pos});
    out.push_back(f);
    pos = f.begin + f.size;
  }
  if (pos < n) out.push_back({-1, pos, n - pos});
}

}  // namespace tok

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Texts of end-of-generation tokens used by common chat models, counted when they are control
// tokens (llama.cpp's list, abridged to the ones chat templates actually emit).
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>",      "<|im_end|>", "<|end|>",  "<end_of_turn>",          "<|endoftext|>",
    "<|eom_id|>",      "</s>",       "<EOT>",    "<|end_of_text|>",        "<end_of_utterance>",
    "<|return|>",      "<|call|>",   "<eos>",    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "\xE2\x96\x81<EOT>",  // CodeLlama's, after its infill
};

// Fill-in-the-middle tokens by text where the file names none (llama.cpp's lists): StarCoder,
// Qwen, CodeGemma-style, DeepSeek Coder, CodeLlama.
constexpr std::string_view kFimPreTexts[] = {"<fim_prefix>", "<|fim_prefix|>", "<fim-prefix>",
                                             "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>", "\xE2\x96\x81<PRE>"};
constexpr std::string_view kFimSufTexts[] = {"<fim_suffix>", "<|fim_suffix|>", "<fim-suffix>",
                                             "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>", "\xE2\x96\x81<SUF>"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
constexpr std::string_view kFimMidTexts[] = {"<fim_middle>", "<|fim_middle|>", "<fim-middle>",
                                             "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>", "\xE2\x96\x81<MID>"};

const GGUFValue& require_array(const GGUFFile& f, std::string_view key) {
  const GGUFValue* v = f.find(key);
  if (!v) fail(f.path(), ": missing required key '", key, "'");
  if (v->type != GGUFValueType::ARRAY)
    fail(f.path(), ": key '", key, "': expected an array, got ", value_type_name(v->type));
  return *v;
}

void expect_length(const GGUFFile& f, std::string_view key, const GGUFValue& v, size_t n) {
  if (v.array.size() != n)
    fail(f.path(), ": key '", key, "' has ", v.array.size(),
         " entries but tokenizer.ggml.tokens has ", n);
}

std::string piece_of(const Vocab& v, TokenId id) {
  const std::string& text = v.text[id];
  switch (v.type[id]) {
    case TokenType::USER_DEFINED:
      return text;
    case TokenType::NORMAL: {
      if (v.model == Vocab::Model::SPM) {
        std::string out;
        for (size_t pos = 0; pos < text.size();) {
          if (text.compare(pos, kSpmSpace.size(), kSpmSpace) == 0) {
            out.push_back(' ');
            pos += kSpmSpace.size();
          } else {
            out.push_back(text[pos++]);
          }
        }
        return out;
      }
      // Byte-level: each character stands for one byte; anything outside the alphabet (not
      // produced by conversion tools, but possible) is kept as written.
      std::string out;
      for (size_t pos = 0; pos < text.size();) {
        uint32_t cp;
        const size_t len = tok::decode_utf8(text, pos, cp);
        const int b = len ? tok::gpt2_codepoint_to_byte(cp) : -1;
        if (b >= 0) {
          out.push_back(char(b));
          pos += len;
        } else {
          const size_t keep = len ? len : 1;
          out.append(text, pos, keep);
          pos += keep;
        }
      }
      return out;
    }
    case TokenType::BYTE: {
      // "<0xXX>"
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        const auto hex = [](char c) -> int {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          return -1;
        };
        const int hi = hex(text[3]), lo = hex(text[4]);
        if (hi >= 0 && lo >= 0) return std::string(1, char(hi * 16 + lo));
      }
      return text;
    }
    default:  // control, unknown, unused, undefined: not shown in generated text
      return {};
  }
}

void build_specials(Vocab& v) {
  auto& trie = v.specials;
  trie.root.fill(-1);
  trie.priority.assign(v.text.size(), -1);
  std::vector<TokenId> ids;
  for (TokenId id = 0; id < v.n_vocab(); ++id) {
    const TokenType t = v.type[id];
    if ((t == TokenType::CONTROL || t == TokenType::USER_DEFINED || t == TokenType::UNKNOWN) &&
        !v.text[id].empty())
      ids.push_back(id);
  }
  std::stable_sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) {
    return v.text[a].size() > v.text[b].size();
  });
  for (size_t rank = 0; rank < ids.size(); ++rank) {
    const TokenId id = ids[rank];
    trie.priority[id] = int32_t(rank);
    const std::string& text = v.text[id];
    int32_t& first = trie.root[uint8_t(text[0])];
    if (first < 0) {
      first = int32_t(trie.token_at.size());
      trie.token_at.push_back(-1);
    }
    int32_t node = first;
    for (size_t i = 1; i < text.size(); ++i) {
      const uint64_t key = (uint64_t(node) << 8) | uint8_t(text[i]);
      const auto [child, inserted] = trie.edges.insert(key, int32_t(trie.token_at.size()));
      if (inserted) trie.token_at.push_back(-1);
      node = *child;
    }
    if (trie.token_at[node] < 0) trie.token_at[node] = id;  // same text twice: first wins
  }
}

void build_bpe(const GGUFFile& f, Vocab& v) {
  const GGUFValue& merges = require_array(f, "tokenizer.ggml.merges");
  if (merges.elem_type != GGUFValueType::STRING)
    fail(f.path(), ": key 'tokenizer.ggml.merges': expected an array of string, got array of ",
         value_type_name(merges.elem_type));
  if (merges.array.size() > size_t(std::numeric_limits<int32_t>::max() / 4))
    fail(f.path(), ": key 'tokenizer.ggml.merges': too many merges");

  std::string raw;
  v.bytes_to_piece.reserve(v.text.size() + merges.array.size() / 8 + 256);
  for (TokenId id = 0; id < v.n_vocab(); ++id) {
    // Tokens outside the byte alphabet (e.g. literal spaces in added tokens) can never be
    // produced by merges; only special-token matching reaches them.
    if (!v.text[id].empty() && tok::gpt2_decode(v.text[id], raw))
      v.bytes_to_piece.insert(raw, id);
  }
  v.n_bpe_tokens = int32_t(v.bytes_to_piece.size());
  for (int b = 0; b < 256; ++b) {
    v.byte_piece[b] = v.piece_id_for(std::string(1, char(b)));
    v.byte_token[b] = v.byte_piece[b] < v.n_vocab() ? v.byte_piece[b] : -1;
  }

  v.merges.reserve(merges.array.size());
  std::string left, right, both;
  for (size_t rank = 0; rank < merges.array.size(); ++rank) {
    const std::string& m = merges.array[rank].str;
    const size_t space = m.find(' ', 1);  // a pair's left half may itself be a space
    if (space == std::string::npos) continue;
    if (!tok::gpt2_decode(std::string_view(m).substr(0, space), left) ||
        !tok::gpt2_decode(std::string_view(m).substr(space + 1), right) || left.empty() ||
        right.empty())
      continue;  // cannot match byte-level text
    const int32_t l = v.piece_id_for(left);
    const int32_t r = v.piece_id_for(right);
    both.assign(left).append(right);
    const int32_t result = v.piece_id_for(both);
    v.merges.insert((uint64_t(uint32_t(l)) << 32) | uint32_t(r),
                    tok::BpeMerge{int32_t(rank), result});
  }
}

void build_spm(Vocab& v) {
  v.text_to_id.reserve(v.text.size());
  v.spm_words_independent = true;
  for (TokenId id = 0; id < v.n_vocab(); ++id) {
    const std::string& text = v.text[id];
    if (text.empty()) continue;
    v.text_to_id.insert(text, id);
    v.max_token_bytes = std::max(v.max_token_bytes, text.size());
    for (size_t p = text.find(kSpmSpace, 1); p != std::string::npos;
         p = text.find(kSpmSpace, p + 1)) {
      if (p < kSpmSpace.size() || text.compare(p - kSpmSpace.size(), kSpmSpace.size(), kSpmSpace))
        v.spm_words_independent = false;
    }
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string byte_text = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    TokenId id = v.text_to_id.find(byte_text);
    if (id < 0) id = v.text_to_id.find(std::string(1, char(b)));
    v.byte_token[b] = id;
  }
}

}  // namespace

namespace tok {

std::shared_ptr<Vocab> load_vocab(const GGUFFile& f) {
  auto v = std::make_shared<Vocab>();
  v->model_name = f.require_str("tokenizer.ggml.model");
  if (v->model_name == "llama") {
    v->model = Vocab::Model::SPM;
  } else if (v->model_name == "gpt2") {
    v->model = Vocab::Model::BPE;
  } else {
    fail(f.path(), ": key 'tokenizer.ggml.model': unsupported tokenizer model '", v->model_name,
         "' (supported: llama, gpt2)");
  }
  const bool spm = v->model == Vocab::Model::SPM;

  const GGUFValue& tokens = require_array(f, "tokenizer.ggml.tokens");
  if (tokens.elem_type != GGUFValueType::STRING)
    fail(f.path(), ": key 'tokenizer.ggml.tokens': expected an array of string, got array of ",
         value_type_name(tokens.elem_type));
  const size_t n = tokens.array.size();
  if (n == 0) fail(f.path(), ": key 'tokenizer.ggml.tokens' is empty");
  if (n > size_t(std::numeric_limits<int32_t>::max()))
    fail(f.path(), ": key 'tokenizer.ggml.tokens': too many tokens (", n, ")");
  v->text.reserve(n);
  for (const auto& t : tokens.array) v->text.push_back(t.str);

  v->score.assign(n, 0.0f);
  if (const GGUFValue* scores = f.find("tokenizer.ggml.scores")) {
    if (scores->type != GGUFValueType::ARRAY ||
        !(scores->elem_type == GGUFValueType::FLOAT32 ||
          scores->elem_type == GGUFValueType::FLOAT64 || scores->elem_type == GGUFValueType::INT32))
      fail(f.path(), ": key 'tokenizer.ggml.scores': expected an array of float32");
    expect_length(f, "tokenizer.ggml.scores", *scores, n);
    for (size_t i = 0; i < n; ++i) {
      const GGUFValue& s = scores->array[i];
      v->score[i] = s.is_float() ? float(s.f) : float(s.i);
    }
  }

  v->type.assign(n, TokenType::NORMAL);
  if (const GGUFValue* types = f.find("tokenizer.ggml.token_type")) {
    GGUFValue probe;
    probe.type = types->elem_type;
    if (types->type != GGUFValueType::ARRAY || !probe.is_integer())
      fail(f.path(), ": key 'tokenizer.ggml.token_type': expected an array of int32");
    expect_length(f, "tokenizer.ggml.token_type", *types, n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = types->array[i].i;
      v->type[i] = t >= 0 && t <= int64_t(TokenType::BYTE) ? TokenType(t) : TokenType::UNDEFINED;
    }
  }

  if (spm) {
    v->pre_name = f.get_str("tokenizer.ggml.pre", "default");
  } else {
    v->pre_name = f.get_str("tokenizer.ggml.pre", "");
    if (v->pre_name.empty() || v->pre_name == "default") v->pre_name = "gpt-2";
    if (!tok::PreTokenizer::is_known(v->pre_name))
      fail(f.path(), ": key 'tokenizer.ggml.pre': unsupported pre-tokenizer '", v->pre_name, "'");
  }

  // Special ids. "llama" vocabularies default to SentencePiece's <unk>=0 <s>=1 </s>=2.
  const auto read_id = [&](const char* key, TokenId dflt) -> TokenId {
    if (!f.has(key)) return dflt < int64_t(n) ? dflt : -1;
    const int64_t id = f.get_i64(key, -1);
    if (id < 0 || id == 0xFFFFFFFF) return -1;  // -1, or -1 written as uint32: none
    if (id >= int64_t(n))
      fail(f.path(), ": key '", key, "': token id ", id, " is outside the vocabulary (", n,
           " tokens)");
    return TokenId(id);
  };
  v->bos = read_id("tokenizer.ggml.bos_token_id", spm ? 1 : -1);
  v->eos = read_id("tokenizer.ggml.eos_token_id", spm ? 2 : -1);
  v->eot = read_id("tokenizer.ggml.eot_token_id", -1);
  v->eom = read_id("tokenizer.ggml.eom_token_id", -1);
  v->unk = read_id("tokenizer.ggml.unknown_token_id", spm ? 0 : -1);
  // FIM: the file's ids (today's keys, then the older prefix/suffix/middle ones), else by text.
  const auto fim = [&](const char* key, const char* old_key, std::span<const std::string_view> texts) {
    const auto optional_id = [&](const char* k) {  // (an unusable id: none, as llama.cpp takes it)
      const int64_t id = f.get_i64(k, -1);
      return id >= 0 && id < int64_t(n) ? TokenId(id) : TokenId(-1);
    };
    TokenId id = optional_id(key);
    if (id < 0 && old_key) id = optional_id(old_key);
    for (TokenId t = 0; id < 0 && t < TokenId(n); ++t)
      if (std::find(texts.begin(), texts.end(), v->text[t]) != texts.end()) id = t;
    return id;
  };
  v->fim_pre = fim("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id", kFimPreTexts);
  v->fim_suf = fim("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id", kFimSufTexts);
  v->fim_mid = fim("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id", kFimMidTexts);
  v->fim_rep = fim("tokenizer.ggml.fim_rep_token_id", nullptr, kFimRepTexts);
  v->fim_sep = fim("tokenizer.ggml.fim_sep_token_id", nullptr, kFimSepTexts);
  // Padding is never produced by the tokenizer; some converters write an id one past the
  // vocabulary, so an unusable value just means "none".
  {
    const int64_t pad = f.get_i64("tokenizer.ggml.padding_token_id", -1);
    v->pad = pad >= 0 && pad < int64_t(n) ? TokenId(pad) : -1;
  }

  v->add_bos = f.get_bool("tokenizer.ggml.add_bos_token", spm || (tok::PreTokenizer::adds_bos(v->pre_name) && v->bos >= 0));
  v->add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);
  v->add_space_prefix = spm && f.get_bool("tokenizer.ggml.add_space_prefix", true);
  if (v->add_bos && v->bos < 0)
    fail(f.path(), ": key 'tokenizer.ggml.add_bos_token' is true but "
                   "'tokenizer.ggml.bos_token_id' is not set");
  if (v->add_eos && v->eos < 0)
    fail(f.path(), ": key 'tokenizer.ggml.add_eos_token' is true but "
                   "'tokenizer.ggml.eos_token_id' is not set");

  v->eog.assign(n, 0);
  for (const TokenId id : {v->eos, v->eot, v->eom, v->fim_rep, v->fim_sep})
    if (id >= 0) v->eog[id] = 1;
  for (TokenId id = 0; id < TokenId(n); ++id) {
    if (v->type[id] != TokenType::CONTROL) continue;
    for (const std::string_view eog_text : kEogTexts)
      if (v->text[id] == eog_text) v->eog[id] = 1;
  }
  // gpt-oss's harmony format (o200k_harmony): <|end|> ends a message, not the generation (the
  // analysis channel's message is followed by the final one); <|return|> and <|call|> end it.
  // llama.cpp's rule: a vocabulary with both of those does not stop at <|end|>.
  auto eog_named = [&](std::string_view text) {
    for (TokenId id = 0; id < TokenId(n); ++id)
      if (v->eog[id] && v->text[id] == text) return id;
    return TokenId(-1);
  };
  if (eog_named("<|return|>") >= 0 && eog_named("<|call|>") >= 0)
    for (TokenId end; (end = eog_named("<|end|>")) >= 0;) v->eog[end] = 0;

  v->byte_token.fill(-1);
  v->byte_piece.fill(-1);
  if (spm) build_spm(*v);
  else build_bpe(f, *v);
  build_specials(*v);

  v->piece.reserve(n);
  for (TokenId id = 0; id < TokenId(n); ++id) v->piece.push_back(piece_of(*v, id));
  return v;
}

}  // namespace tok

Tokenizer Tokenizer::from_gguf(const GGUFFile& f) {
  auto impl = std::make_unique<Impl>();
  impl->vocab = tok::load_vocab(f);
  if (impl->vocab->model == Vocab::Model::BPE) impl->pre.emplace(impl->vocab->pre_name);
  return Tokenizer(std::move(impl));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(const Tokenizer& other) : impl_(std::make_unique<Impl>(*other.impl_)) {}
Tokenizer& Tokenizer::operator=(const Tokenizer& other) {
  if (this != &other) impl_ = std::make_unique<Impl>(*other.impl_);
  return *this;
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  const Vocab& v = *impl_->vocab;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && v.add_bos && v.bos >= 0) out.push_back(v.bos);
  if (text.empty()) return out;

  std::vector<tok::Fragment> fragments;
  tok::partition_special(v, text, parse_special, fragments);

  if (v.model == Vocab::Model::SPM) {
    // The space prefix goes on the text at the start and after every special token, as in
    // llama.cpp (and Hugging Face's Llama tokenizer): "<s>[INST]" -> <s> "▁[" "INST" "]".
    bool after_special = true;
    std::string escaped;
    for (const auto& frag : fragments) {
      if (frag.token >= 0) {
        out.push_back(frag.token);
        after_special = true;
        continue;
      }
      escaped.clear();
      if (v.add_space_prefix && after_special) escaped += kSpmSpace;
      for (const char c : text.substr(frag.begin, frag.size)) {
        if (c == ' ') escaped += kSpmSpace;
        else escaped.push_back(c);
      }
      tok::spm_tokenize(v, escaped, out);
      after_special = false;
    }
    return out;
  }

  const tok::PreTokenizer& pre = *impl_->pre;
  tok::BpeSession session(v, pre.ignore_merges());
  std::vector<tok::Span> words;
  for (const auto& frag : fragments) {
    if (frag.token >= 0) {
      out.push_back(frag.token);
      continue;
    }
    const std::string_view part = text.substr(frag.begin, frag.size);
    words.clear();
    pre.split(part, words);
    for (const tok::Span& w : words) session.tokenize_word(part.substr(w.begin, w.size), out);
  }
  return out;
}

namespace {
void check_id(const Vocab& v, TokenId id) {
  if (id < 0 || id >= v.n_vocab())
    fail("token id ", id, " is outside the vocabulary (", v.n_vocab(), " tokens)");
}
}  // namespace

std::string Tokenizer::token_to_piece(TokenId id) const {
  check_id(*impl_->vocab, id);
  return impl_->vocab->piece[id];
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids) const {
  const Vocab& v = *impl_->vocab;
  std::string out;
  bool strip_space = v.add_space_prefix;  // undo the SentencePiece prefix once, on the first text
  for (const TokenId id : ids) {
    check_id(v, id);
    const std::string& piece = v.piece[id];
    if (strip_space && !piece.empty()) {
      out.append(piece, piece[0] == ' ' ? 1 : 0);
      strip_space = false;
    } else {
      out += piece;
    }
  }
  return out;
}

int32_t Tokenizer::n_vocab() const { return impl_->vocab->n_vocab(); }
TokenId Tokenizer::bos() const { return impl_->vocab->bos; }
TokenId Tokenizer::eos() const { return impl_->vocab->eos; }
bool Tokenizer::add_bos_default() const { return impl_->vocab->add_bos; }

TokenId Tokenizer::fim_prefix() const { return impl_->vocab->fim_pre; }
TokenId Tokenizer::fim_suffix() const { return impl_->vocab->fim_suf; }
TokenId Tokenizer::fim_middle() const { return impl_->vocab->fim_mid; }
TokenId Tokenizer::fim_repo() const { return impl_->vocab->fim_rep; }
TokenId Tokenizer::fim_file_sep() const { return impl_->vocab->fim_sep; }
bool Tokenizer::add_eos_default() const { return impl_->vocab->add_eos; }

bool Tokenizer::is_eog(TokenId id) const {
  const Vocab& v = *impl_->vocab;
  return id >= 0 && id < v.n_vocab() && v.eog[id] != 0;
}

bool Tokenizer::is_control(TokenId id) const {
  const Vocab& v = *impl_->vocab;
  return id >= 0 && id < v.n_vocab() && v.type[id] == TokenType::CONTROL;
}

const std::string& Tokenizer::token_text(TokenId id) const {
  check_id(*impl_->vocab, id);
  return impl_->vocab->text[id];
}

std::string_view Tokenizer::model_name() const { return impl_->vocab->model_name; }
std::string_view Tokenizer::pre_name() const { return impl_->vocab->pre_name; }

std::string StreamDecoder::push(TokenId id) {
  pending_ += keep_special_ && tok_->is_control(id) ? tok_->token_text(id) : tok_->token_to_piece(id);
  const size_t ready = pending_.size() - tok::incomplete_utf8_tail(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace ft
