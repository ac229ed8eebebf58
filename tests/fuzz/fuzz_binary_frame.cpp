// libFuzzer target: the binary protocol's frame decoder (client/binary_proto.cpp) on a byte
// stream cut into frames as a session cuts it (u32 LE length, then that many bytes), each frame
// decoded as a Request and as a Response, also where it sits right after its length prefix in one
// buffer (4 bytes past an 8-aligned start: 8-byte fields misaligned). Whatever decodes must encode
// again and decode to the same message.
// FT_FUZZ_WRITE_SEEDS=DIR fuzz_binary_frame writes the seed corpus (corpus/fuzz_binary_frame) and exits.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "client/binary_proto.h"
#include "fuzz_util.h"

namespace proto = ft::proto;

namespace {

const uint8_t* body(const std::string& frame) {
  return reinterpret_cast<const uint8_t*>(frame.data()) + proto::kFrameHeader;
}

void check_request(const uint8_t* p, size_t n) {
  proto::Request a, b;
  if (!proto::decode_request(p, n, a)) return;
  const std::string f = proto::encode_request(a);
  FT_FUZZ_CHECK(proto::frame_length(reinterpret_cast<const uint8_t*>(f.data())) == f.size() - proto::kFrameHeader);
  FT_FUZZ_CHECK(proto::decode_request(body(f), f.size() - proto::kFrameHeader, b));
  FT_FUZZ_CHECK(a.tokens == b.tokens && a.max_tokens == b.max_tokens && a.stop == b.stop && a.stream == b.stream);
  FT_FUZZ_CHECK(a.add_bos == b.add_bos && a.ignore_eos == b.ignore_eos && a.logprobs == b.logprobs);
  FT_FUZZ_CHECK(a.seed_set == b.seed_set && a.sampling.seed == b.sampling.seed && a.sampling.top_k == b.sampling.top_k);
  if (a.tokens.empty()) FT_FUZZ_CHECK(a.text == b.text);  // (ids win over text when both came)
}

void check_response(const uint8_t* p, size_t n) {
  proto::Response a, b;
  if (!proto::decode_response(p, n, a)) return;
  const std::string f = proto::encode_response(a);
  FT_FUZZ_CHECK(proto::decode_response(body(f), f.size() - proto::kFrameHeader, b));
  FT_FUZZ_CHECK(a.tokens == b.tokens && a.last == b.last);
  // Text and error are written as UTF-8 (encode_response makes each byte outside a well-formed
  // sequence U+FFFD): unchanged unless a replacement was made, and exact from then on.
  const std::string_view kReplacement = "\xEF\xBF\xBD";
  FT_FUZZ_CHECK(a.text == b.text || b.text.find(kReplacement) != std::string::npos);
  FT_FUZZ_CHECK(a.error == b.error || b.error.find(kReplacement) != std::string::npos);
  proto::Response c;
  const std::string g = proto::encode_response(b);
  FT_FUZZ_CHECK(proto::decode_response(body(g), g.size() - proto::kFrameHeader, c));
  FT_FUZZ_CHECK(b.text == c.text && b.error == c.error);
  FT_FUZZ_CHECK(a.prompt_tokens == b.prompt_tokens && a.completion_tokens == b.completion_tokens);
  FT_FUZZ_CHECK(a.logprobs.size() == b.logprobs.size());
  // An unknown finish code reads as none ("") and is written back as none.
  FT_FUZZ_CHECK(a.finish == b.finish);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("FT_FUZZ_WRITE_SEEDS");
  if (!dir) return 0;
  auto write = [&](const char* name, const std::string& bytes) {
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << bytes;
  };
  proto::Request q;
  q.tokens = {1, 403, 407};
  q.max_tokens = 8;
  q.stop = {"\n", "The end"};
  q.logprobs = 2;
  q.seed_set = true;
  q.sampling.seed = 7;
  write("request_tokens", proto::encode_request(q));
  proto::Request t;
  t.text = "Once upon a time";
  t.stream = false;
  t.sampling.temperature = 0;
  write("request_text", proto::encode_request(t));
  proto::Response a;
  a.tokens = {5};
  a.text = "x";
  a.logprobs = {{5, -0.5f, {{5, -0.5f}, {9, -1.5f}}}};
  proto::Response z;
  z.last = true;
  z.finish = "length";
  z.prompt_tokens = 3;
  z.completion_tokens = 1;
  z.timings = {1, 2, 3, 4, 5, 6};
  write("response_stream", proto::encode_response(a) + proto::encode_response(z));
  proto::Response e;
  e.last = true;
  e.finish = "error";
  e.error = "too many requests";
  write("response_error", proto::encode_request(q) + proto::encode_response(e));
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> shifted(proto::kFrameHeader + size);
  while (size >= proto::kFrameHeader) {
    const size_t n = proto::frame_length(data);
    if (n > size - proto::kFrameHeader) break;  // a partial frame: a session waits for more
    const uint8_t* frame = data + proto::kFrameHeader;
    check_request(frame, n);
    check_response(frame, n);
    std::memcpy(shifted.data() + proto::kFrameHeader, frame, n);
    check_request(shifted.data() + proto::kFrameHeader, n);
    check_response(shifted.data() + proto::kFrameHeader, n);
    data += proto::kFrameHeader + n;
    size -= proto::kFrameHeader + n;
  }
  return 0;
}
