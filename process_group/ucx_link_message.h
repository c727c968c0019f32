#pragma once

// Internal to //process_group: the format of the messages on a UCX link (ucx_links.h), with
// no UCX in it, so that the fuzz target can read it alone.
//
// A message is [16-byte secret][1-byte type][...]:
//   kProbe:            nothing more, or the sender's arena offer (kArenaOfferBytes,
//                      shm_arena.h) when it is on the receiver's host.
//   kFrames:           wire frames (transport.h's format).
//   kFramesWithBodies: [u32 count][count x (u64 offset, u64 size, u64 tag)][wire frames with
//                      those bodies cut out]. Each body is the bytes of one large tensor,
//                      sent as a UCX message of its own (contiguous, so that UCX can move it
//                      with zero copies: cross-memory attach or RDMA) under `tag`; `offset`
//                      is where it belongs in the complete frames. All integers little-endian.
//   kFramesWithArenaBodies: as kFramesWithBodies, but each body waits in the sender's arena
//                      (the one its probe offered) and `tag` is its block's offset there.
// The head goes under the sender's rank as its tag. A body's tag has kLinkBodyTagBit set and
// 63 bits that only holders of the pair's secret can predict, and the receiver posts a
// receive for exactly that tag only after the head carried the secret: a body is never
// taken from anyone else.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "process_group/transport.h"

namespace drpc {

constexpr size_t kLinkSecretBytes = 16;
constexpr size_t kLinkPrefixBytes = kLinkSecretBytes + 1;
constexpr uint64_t kLinkBodyTagBit = uint64_t{1} << 63;
// What a probe tells the receiver about the sender's arena (shm_arena.h): [i32 System V
// segment id][u64 size][16-byte nonce found at the segment's start].
constexpr size_t kArenaOfferBytes = sizeof(int32_t) + sizeof(uint64_t) + 16;

enum class LinkMessageType : uint8_t { kFrames = 0, kProbe = 1, kFramesWithBodies = 2, kFramesWithArenaBodies = 3 };

// One large tensor's bytes, sent after the head as a message of its own.
struct LinkBody {
  uint64_t offset = 0;  // where the bytes go in the complete frames
  uint64_t size = 0;
  uint64_t tag = 0;  // an arena body's: its block's offset in the sender's arena
};

// 16 random bytes from /dev/urandom.
std::string random_link_secret();

// Whether `data` (at least kLinkSecretBytes) starts with `secret`, compared in constant time.
bool starts_with_link_secret(const uint8_t* data, const std::string& secret);

// The tag of the `counter`th body a sender sends under `secret`: kLinkBodyTagBit and 63 bits
// mixed from both (distinct counters give distinct tags, except with probability 2^-63).
uint64_t link_body_tag(const std::string& secret, uint64_t counter);

// What precedes the frames of a message of `type` (the prefix, and for messages with bodies
// the table of `bodies`).
std::string link_message_head(const std::string& secret, LinkMessageType type,
                              const std::vector<LinkBody>& bodies = {});
// A probe offering the sender's arena (`offer`: kArenaOfferBytes).
std::string link_probe_with_arena(const std::string& secret, const std::string& offer);

// A received head, checked. `frames` points into the bytes given to parse_link_message.
struct LinkMessage {
  LinkMessageType type = LinkMessageType::kFrames;
  std::vector<LinkBody> bodies;
  const uint8_t* arena_offer = nullptr;  // a probe's, if it has one (kArenaOfferBytes)
  const uint8_t* frames = nullptr;
  size_t frames_size = 0;
};

// Checks the secret and the head of a message of `size` bytes. Returns false, with `problem`
// set, for a message that is too short, carries another secret, has an unknown type, a probe
// with bytes other than an arena offer, or a body table that is malformed (bodies out of order, past the frames' end,
// empty, or a UCX body's tag without kLinkBodyTagBit). Allocates nothing in proportion to what a body claims.
bool parse_link_message(const uint8_t* data, size_t size, const std::string& secret, LinkMessage* message,
                        std::string* problem);

// Which frame a body of a kFramesWithBodies message belongs to, read from the head alone.
struct LinkBodyOwner {
  pg::FrameHeader::Kind kind = pg::FrameHeader::UNKNOWN;
  uint64_t seq = 0;
  uint32_t step = 0;
  int tensor = -1;  // the body is the bytes of this tensor of the frame
};

// The owner of each body of a parsed message (`owners` gets one per body), from the frame
// headers in its head, so that a receiver can choose where a body lands before it arrives.
// Returns false when the head's frames do not account for the bodies as the sender lays them
// out (each body one whole tensor); link_message_frames then says what is wrong. Reads at most
// the head's bytes and one header of at most kMaxFrameHeaderBytes at a time.
bool link_body_owners(const LinkMessage& message, std::vector<LinkBodyOwner>* owners);

// The frames of a parsed kFrames or kFramesWithBodies message; `bodies[i]` holds
// message.bodies[i].size bytes. `keepalive` owns all of them. Returns false, with `problem`
// set, when the frames are malformed (decode_wire_frames) or absent.
bool link_message_frames(const LinkMessage& message, const std::vector<ByteSpan>& bodies,
                         std::shared_ptr<void> keepalive, int source, std::vector<Frame>* frames,
                         std::string* problem);

}  // namespace drpc
