// Tokenizers built from GGUF metadata (tokenizer.ggml.*):
//   model "llama": SentencePiece-style BPE over scores, with byte fallback (<0xXX> tokens).
//   model "gpt2":  byte-level BPE over merges, after a pre-tokenizer chosen by tokenizer.ggml.pre
//                  (llama-bpe, qwen2, gpt-2, deepseek-llm, deepseek-coder, falcon, starcoder,
//                   refact, mpt; absent/"default" -> gpt-2).
// A Tokenizer is an immutable value: copy it to give each worker thread its own.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ft {

class GGUFFile;

using TokenId = int32_t;

enum class TokenType : int32_t {
  UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6,
};

class Tokenizer {
 public:
  // Throws ft::Error naming the key when the metadata is missing or inconsistent.
  static Tokenizer from_gguf(const GGUFFile& file);
  Tokenizer(const Tokenizer&);
  Tokenizer& operator=(const Tokenizer&);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_bos: prepend BOS when the vocabulary wants it (tokenizer.ggml.add_bos_token, default
  // true for "llama", false for "gpt2" unless set). parse_special: text of control/user-defined
  // tokens (e.g. "<|eot_id|>") becomes those tokens instead of being tokenized as plain text.
  std::vector<TokenId> encode(std::string_view text, bool add_bos, bool parse_special) const;

  // Raw bytes of one token as it appears in generated text (byte tokens -> their byte,
  // SentencePiece U+2581 -> ' ', byte-level BPE unicode -> bytes). Control tokens -> "".
  std::string token_to_piece(TokenId id) const;
  // Concatenated pieces; for "llama" vocabularies a single leading space after BOS/at the start
  // is removed (SentencePiece's add-space-prefix), so decode(encode(x)) == x.
  std::string decode(const std::vector<TokenId>& ids) const;

  int32_t n_vocab() const;
  TokenId bos() const;  // -1 when none
  TokenId eos() const;  // -1 when none
  bool add_bos_default() const;
  // Fill-in-the-middle tokens (the file's ids, else found by their text: <fim_prefix>,
  // <|fim_prefix|>, <PRE>, ...); -1 when the vocabulary has none.
  TokenId fim_prefix() const;
  TokenId fim_suffix() const;
  TokenId fim_middle() const;
  // Repository-level FIM (Qwen2.5-Coder's <|repo_name|>, <|file_sep|>; llama.cpp's lists): -1 when
  // none. Both end a generation, as llama.cpp has them.
  TokenId fim_repo() const;
  TokenId fim_file_sep() const;
  bool add_eos_default() const;  // tokenizer.ggml.add_eos_token: EOS after a prompt (embedding models)
  bool is_eog(TokenId id) const;  // EOS, EOT, EOM and other end-of-generation tokens
  bool is_control(TokenId id) const;
  const std::string& token_text(TokenId id) const;  // the vocabulary string as stored
  std::string_view model_name() const;                // "llama" | "gpt2"
  std::string_view pre_name() const;                  // pre-tokenizer in use

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: push token ids as they are generated, get back only text that is
// complete UTF-8; a partial multi-byte sequence is held until its last byte arrives. It streams a
// continuation, so nothing is stripped: a generated "▁there" yields " there".
// keep_special: control tokens come out as their vocabulary text ("<|im_end|>"), not as nothing
// (vLLM's skip_special_tokens = false).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool keep_special = false) : tok_(&tok), keep_special_(keep_special) {}
  std::string push(TokenId id);
  std::string flush();  // whatever is held (possibly invalid UTF-8 at end of stream)

 private:
  const Tokenizer* tok_;
  bool keep_special_;
  std::string pending_;
};

}  // namespace ft
