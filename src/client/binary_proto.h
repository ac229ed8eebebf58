// The binary protocol's messages as plain structs, and their frames (proto/firsttoken.fbs):
// a frame is a u32 little-endian length N then N bytes of FlatBuffer. encode_* return a whole
// frame; decode_* take the N bytes after the length, run the FlatBuffers Verifier and return
// false on anything malformed (never read out of bounds). Shared by the server, the client
// library and the benchmark.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"

namespace ft::proto {

inline constexpr size_t kFrameHeader = 4;  // u32 LE length

struct Request {
  std::vector<int32_t> tokens;  // non-empty: the prompt as ids; else `text`
  std::string text;
  bool add_bos = true;
  SamplingParams sampling = kBinarySampling;
  bool seed_set = false;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;
  bool stream = true;
  bool ignore_eos = false;
  int32_t logprobs = -1;  // -1: off; N: each token's logprob and its N best alternatives
  bool embed = false;     // the prompt's embedding (Response::embedding), not a generation
};

struct Timings {  // ms
  double tokenize = 0, queue = 0, prefill = 0, ttft = 0, decode = 0, total = 0;
};

struct Response {
  std::vector<int32_t> tokens;
  std::string text;
  bool last = false;  // the final frame of a response
  std::string finish;  // last: "stop" | "length" | "cancelled" | "error"; else ""
  int64_t prompt_tokens = 0, completion_tokens = 0;
  Timings timings;
  std::string error;  // final frame of a failed request
  std::vector<TokenLogprobs> logprobs;  // one per token, when requested
  std::vector<float> embedding;         // last, of an embed request: L2-normalized
};

std::string encode_request(const Request& r);
std::string encode_response(const Response& r);
// False for a frame the FlatBuffers Verifier refuses, or whose decoded values would take more than
// kMaxDecodeGrowth x its own bytes: the Verifier lets many vector entries share one string or
// table, so a 128 KB frame of 16K references to one 64 KB stop string decoded into 1 GB.
inline constexpr size_t kMaxDecodeGrowth = 8;  // (an honest frame: at most ~5x, a default-valued entry)
bool decode_request(const uint8_t* data, size_t n, Request& out);
bool decode_response(const uint8_t* data, size_t n, Response& out);

// The frame header: length <-> 4 bytes little-endian.
inline uint32_t frame_length(const uint8_t* h) {
  return uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 | uint32_t(h[3]) << 24;
}
inline void put_frame_length(uint8_t* h, uint32_t n) {
  for (int i = 0; i < 4; ++i) h[i] = uint8_t(n >> (8 * i));
}

}  // namespace ft::proto
