// A UCX link's message decoder (process_group/ucx_links.cc) on hostile bytes: what a peer,
// or anyone who can reach this worker's UCX address, puts in a message. The first input
// byte chooses whether the message starts with the pair's secret (a peer that holds it)
// or is taken as it is (anyone else).
// Properties: a message without the secret is refused whatever follows; one with it is
// either a probe of exactly the prefix, or frames that decode_wire_frames accepts (the
// same frames), or refused with the reason; nothing else happens.

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/check.h"
#include "process_group/transport.h"
#include "process_group/ucx_links.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string secret(drpc::kLinkSecretBytes, '\x5a');
  const bool with_secret = data[0] & 1;
  std::string message(reinterpret_cast<const char*>(data + 1), size - 1);
  if (with_secret) message = secret + message;

  bool is_probe = false;
  std::vector<drpc::Frame> frames;
  std::string problem;
  const bool ok = drpc::decode_link_message(reinterpret_cast<const uint8_t*>(message.data()), message.size(), secret,
                                            nullptr, 1, &is_probe, &frames, &problem);
  const bool has_secret = message.size() >= drpc::kLinkSecretBytes &&
                          message.compare(0, drpc::kLinkSecretBytes, secret) == 0;
  if (!has_secret) {
    FUZZ_CHECK(!ok, "a message without the secret was accepted");
    return 0;
  }
  if (!ok) {
    FUZZ_CHECK(!problem.empty(), "a refused message has no reason");
    return 0;
  }
  const size_t prefix = drpc::kLinkSecretBytes + 1;
  if (is_probe) {
    FUZZ_CHECK(message.size() == prefix, "a probe with a body was accepted");
    FUZZ_CHECK(frames.empty(), "a probe carried frames");
    return 0;
  }
  FUZZ_CHECK(!frames.empty(), "a frames message without frames was accepted");
  const auto* body = reinterpret_cast<const uint8_t*>(message.data()) + prefix;
  const auto again = drpc::decode_wire_frames({drpc::ByteSpan{body, message.size() - prefix}}, nullptr, 1);
  FUZZ_CHECK(again.size() == frames.size(), "the frames differ from decode_wire_frames'");
  for (size_t i = 0; i < frames.size(); ++i) {
    FUZZ_CHECK(frames[i].source == 1, "a frame lost its source");
    FUZZ_CHECK(frames[i].header.SerializeAsString() == again[i].header.SerializeAsString(), "a header differs");
  }
  return 0;
}
