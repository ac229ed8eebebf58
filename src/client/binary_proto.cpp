#include "client/binary_proto.h"

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "proto/firsttoken_generated.h"  // flatc --cpp output in the build dir (namespace ft::fbs)

namespace ft::proto {

namespace fb = ::flatbuffers;

namespace {

// Finishes a frame: the length header, then the builder's bytes.
std::string frame(const fb::FlatBufferBuilder& b) {
  std::string out(kFrameHeader + b.GetSize(), '\0');
  put_frame_length(reinterpret_cast<uint8_t*>(out.data()), uint32_t(b.GetSize()));
  std::memcpy(out.data() + kFrameHeader, b.GetBufferPointer(), b.GetSize());
  return out;
}

fbs::Finish finish_enum(const std::string& s) {
  if (s == "stop") return fbs::Finish::Stop;
  if (s == "length") return fbs::Finish::Length;
  if (s == "cancelled") return fbs::Finish::Cancelled;
  if (s == "error") return fbs::Finish::Error;
  return fbs::Finish::None;
}
const char* finish_name(fbs::Finish f) {
  switch (f) {
    case fbs::Finish::Stop: return "stop";
    case fbs::Finish::Length: return "length";
    case fbs::Finish::Cancelled: return "cancelled";
    case fbs::Finish::Error: return "error";
    default: return "";
  }
}

// FlatBuffers reads scalars in place, so a buffer must start aligned for the largest in the
// schema (8 bytes: long, double); bytes that do not (a frame inside a larger buffer) are copied
// to the heap (operator new aligns for every scalar type).
class Aligned {
 public:
  Aligned(const uint8_t* data, size_t n) : data_(data) {
    if (n > 0 && reinterpret_cast<uintptr_t>(data) % alignof(uint64_t) != 0) {
      copy_.assign(data, data + n);
      data_ = copy_.data();
    }
  }
  const uint8_t* data() const { return data_; }

 private:
  const uint8_t* data_;
  std::vector<uint8_t> copy_;
};

template <class T>
const T* verified_root(const uint8_t* data, size_t n) {
  if (data == nullptr || n < sizeof(fb::uoffset_t)) return nullptr;
  fb::Verifier v(data, n, /*max_depth=*/16, /*max_tables=*/10000);
  if (!v.VerifyBuffer<T>(nullptr)) return nullptr;
  return fb::GetRoot<T>(data);
}

}  // namespace

std::string encode_request(const Request& r) {
  fb::FlatBufferBuilder b(256 + r.tokens.size() * 4 + r.text.size());
  fb::Offset<fb::Vector<int32_t>> tokens;
  fb::Offset<fb::String> text;
  fb::Offset<fb::Vector<fb::Offset<fb::String>>> stop;
  if (!r.tokens.empty()) tokens = b.CreateVector(r.tokens);
  else text = b.CreateString(r.text);
  if (!r.stop.empty()) stop = b.CreateVectorOfStrings(r.stop);
  const SamplingParams& s = r.sampling;
  const auto sampling = fbs::CreateSampling(b, s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty,
                                            s.presence_penalty, s.frequency_penalty, s.seed, r.seed_set, s.typical_p,
                                            s.dynatemp_range, s.dynatemp_exponent, s.mirostat, s.mirostat_tau,
                                            s.mirostat_eta, s.min_keep, s.penalty_last_n);
  b.Finish(fbs::CreateRequest(b, tokens, text, r.add_bos, sampling, r.max_tokens, stop, r.stream, r.ignore_eos,
                              r.logprobs, r.embed));
  return frame(b);
}

namespace {
// s with each byte that does not begin or continue a well-formed UTF-8 sequence as U+FFFD (a
// FlatBuffers string is UTF-8; a generation's text can end inside a character, cut by the length
// limit, or hold a byte token; the HTTP API's JSON replaces them the same way).
std::string valid_utf8(const std::string& s) {
  const auto seq_len = [&](size_t i) -> size_t {  // the well-formed sequence at i, or 0
    const auto c = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char b = c(i);
    if (b < 0x80) return 1;
    const size_t n = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k)
      if ((c(i + k) & 0xC0) != 0x80) return 0;
    // (overlong three- and four-byte forms, surrogates, past U+10FFFF)
    if ((b == 0xE0 && c(i + 1) < 0xA0) || (b == 0xED && c(i + 1) > 0x9F) || (b == 0xF0 && c(i + 1) < 0x90) ||
        (b == 0xF4 && c(i + 1) > 0x8F))
      return 0;
    return n;
  };
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (const size_t n = seq_len(i)) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}
}  // namespace

std::string encode_response(const Response& r) {
  fb::FlatBufferBuilder b(64 + r.tokens.size() * 4 + r.text.size() + r.error.size());
  fb::Offset<fb::Vector<int32_t>> tokens;
  fb::Offset<fb::String> text, error;
  fb::Offset<fbs::Timings> timings;
  if (!r.tokens.empty()) tokens = b.CreateVector(r.tokens);
  if (!r.text.empty()) text = b.CreateString(valid_utf8(r.text));
  if (!r.error.empty()) error = b.CreateString(valid_utf8(r.error));
  fb::Offset<fb::Vector<fb::Offset<fbs::TokenLogprob>>> logprobs;
  if (!r.logprobs.empty()) {
    std::vector<fb::Offset<fbs::TokenLogprob>> lps;
    std::vector<fbs::Alternative> top;
    for (const TokenLogprobs& t : r.logprobs) {
      top.clear();
      for (const auto& [id, lp] : t.top) top.emplace_back(id, lp);
      lps.push_back(fbs::CreateTokenLogprob(b, t.token, t.logprob, b.CreateVectorOfStructs(top)));
    }
    logprobs = b.CreateVector(lps);
  }
  if (r.last) {
    const Timings& t = r.timings;
    timings = fbs::CreateTimings(b, t.tokenize, t.queue, t.prefill, t.ttft, t.decode, t.total);
  }
  fb::Offset<fb::Vector<float>> embedding;
  if (!r.embedding.empty()) embedding = b.CreateVector(r.embedding);
  b.Finish(fbs::CreateResponse(b, tokens, text, r.last, finish_enum(r.finish), r.prompt_tokens, r.completion_tokens,
                               timings, error, logprobs, embedding));
  return frame(b);
}

bool decode_request(const uint8_t* data, size_t n, Request& out) {
  const Aligned bytes(data, n);
  const fbs::Request* r = verified_root<fbs::Request>(bytes.data(), n);
  if (!r) return false;
  out = Request{};
  if (r->tokens()) out.tokens.assign(r->tokens()->begin(), r->tokens()->end());
  if (r->text()) out.text = r->text()->str();
  out.add_bos = r->add_bos();
  if (const fbs::Sampling* s = r->sampling()) {  // (absent: the profile's value, from Request{})
    SamplingParams& p = out.sampling;
    p.temperature = s->temperature().value_or(p.temperature);
    p.top_k = s->top_k().value_or(p.top_k);
    p.top_p = s->top_p().value_or(p.top_p);
    p.min_p = s->min_p().value_or(p.min_p);
    p.repetition_penalty = s->repetition_penalty().value_or(p.repetition_penalty);
    p.presence_penalty = s->presence_penalty().value_or(p.presence_penalty);
    p.frequency_penalty = s->frequency_penalty().value_or(p.frequency_penalty);
    p.seed = s->seed().value_or(p.seed);
    out.seed_set = s->seed_set();
    p.typical_p = s->typical_p().value_or(p.typical_p);
    p.dynatemp_range = s->dynatemp_range().value_or(p.dynatemp_range);
    p.dynatemp_exponent = s->dynatemp_exponent().value_or(p.dynatemp_exponent);
    p.mirostat = s->mirostat().value_or(p.mirostat);
    p.mirostat_tau = s->mirostat_tau().value_or(p.mirostat_tau);
    p.mirostat_eta = s->mirostat_eta().value_or(p.mirostat_eta);
    p.min_keep = s->min_keep().value_or(p.min_keep);
    p.penalty_last_n = s->penalty_last_n().value_or(p.penalty_last_n);
  }
  out.max_tokens = r->max_tokens();
  if (r->stop()) {
    size_t budget = kMaxDecodeGrowth * n;  // (each string's bytes, however many entries share it)
    for (const fb::String* x : *r->stop()) {
      if (x->size() + sizeof(std::string) > budget) return false;
      budget -= x->size() + sizeof(std::string);
      out.stop.push_back(x->str());
    }
  }
  out.stream = r->stream();
  out.ignore_eos = r->ignore_eos();
  out.logprobs = r->logprobs();
  out.embed = r->embed();
  return true;
}

bool decode_response(const uint8_t* data, size_t n, Response& out) {
  const Aligned bytes(data, n);
  const fbs::Response* r = verified_root<fbs::Response>(bytes.data(), n);
  if (!r) return false;
  out = Response{};
  if (r->tokens()) out.tokens.assign(r->tokens()->begin(), r->tokens()->end());
  if (r->text()) out.text = r->text()->str();
  out.last = r->last();
  out.finish = finish_name(r->finish());
  out.prompt_tokens = r->prompt_tokens();
  out.completion_tokens = r->completion_tokens();
  if (const fbs::Timings* t = r->timings())
    out.timings = {t->tokenize(), t->queue(), t->prefill(), t->ttft(), t->decode(), t->total()};
  if (r->error()) out.error = r->error()->str();
  if (r->logprobs()) {
    size_t budget = kMaxDecodeGrowth * n;  // (each entry's alternatives, however many share them)
    for (const fbs::TokenLogprob* t : *r->logprobs()) {
      const size_t top = t->top() ? t->top()->size() : 0;
      const size_t bytes = sizeof(TokenLogprobs) + top * sizeof(std::pair<int32_t, float>);
      if (bytes > budget) return false;
      budget -= bytes;
      TokenLogprobs& x = out.logprobs.emplace_back();
      x.token = t->token();
      x.logprob = t->logprob();
      if (t->top())
        for (const fbs::Alternative* a : *t->top()) x.top.emplace_back(a->token(), a->logprob());
    }
  }
  if (r->embedding()) out.embedding.assign(r->embedding()->begin(), r->embedding()->end());
  return true;
}

}  // namespace ft::proto
