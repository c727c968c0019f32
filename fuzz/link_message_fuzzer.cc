// A UCX link's message format (process_group/ucx_link_message.h) on hostile bytes: what a
// peer, or anyone who can reach this worker's UCX address, puts in a message. The first input
// byte chooses whether the message starts with the pair's secret (a peer that holds it) or
// is taken as it is (anyone else).
// Properties: a message without the secret is refused whatever follows; one with it is a
// probe of exactly the prefix (or the prefix and an arena offer), or frames (with bodies
// spliced in where the table says) that decode_wire_frames reads the same from the message
// made whole, or refused with the reason. The blocks an arena message names are looked up
// in a real arena (shm_arena.h) with one block sent: a lookup never yields bytes outside a
// sent block, and a block is yielded once.

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/check.h"
#include "process_group/shm_arena.h"
#include "process_group/transport.h"
#include "process_group/ucx_link_message.h"

namespace {

// An arena of 1 MiB with one block of 4096 bytes sent, attached as a receiver would, made once.
struct FuzzArena {
  std::unique_ptr<drpc::ShmArena> arena;
  std::shared_ptr<drpc::ArenaMapping> mapping;
  uint64_t block = 0;

  FuzzArena() {
    std::string why;
    arena = drpc::ShmArena::create(1 << 20, &why);
    FUZZ_CHECK(arena != nullptr, "no arena");
    mapping = drpc::ArenaMapping::attach(reinterpret_cast<const uint8_t*>(arena->offer().data()), arena->offer().size(),
                                         &why);
    FUZZ_CHECK(mapping != nullptr, "no mapping");
    block = *arena->allocate(4096);
  }
};

// Takes every body an arena message names, as the receiver does, and gives them back.
void take_arena_bodies(const drpc::LinkMessage& message) {
  static FuzzArena fuzz;
  std::vector<std::shared_ptr<uint8_t>> taken;
  for (const auto& body : message.bodies) {
    std::string problem;
    auto bytes = fuzz.mapping->take(body.tag, body.size, &problem);
    if (bytes == nullptr) {
      FUZZ_CHECK(!problem.empty(), "a refused block has no reason");
      continue;
    }
    FUZZ_CHECK(body.tag == fuzz.block && body.size <= 4096, "bytes outside the sent block were taken");
    taken.push_back(std::move(bytes));
  }
  FUZZ_CHECK(taken.size() <= 1, "a block was taken twice");
  taken.clear();  // released: the sender takes it back and sends it again
  if (fuzz.arena->bytes_in_use() == 0) fuzz.block = *fuzz.arena->allocate(4096);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string secret(drpc::kLinkSecretBytes, '\x5a');
  const bool with_secret = data[0] & 1;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (with_secret) bytes = secret + bytes;

  drpc::LinkMessage message;
  std::string problem;
  const bool ok = drpc::parse_link_message(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), secret,
                                           &message, &problem);
  const bool has_secret = bytes.size() >= drpc::kLinkSecretBytes && bytes.compare(0, drpc::kLinkSecretBytes, secret) == 0;
  if (!has_secret) {
    FUZZ_CHECK(!ok, "a message without the secret was accepted");
    return 0;
  }
  if (!ok) {
    FUZZ_CHECK(!problem.empty(), "a refused message has no reason");
    return 0;
  }
  if (message.type == drpc::LinkMessageType::kProbe) {
    const bool offer = message.arena_offer != nullptr;
    FUZZ_CHECK(bytes.size() == drpc::kLinkPrefixBytes + (offer ? drpc::kArenaOfferBytes : 0),
               "a probe with a body was accepted");
    return 0;
  }
  const bool in_arena = message.type == drpc::LinkMessageType::kFramesWithArenaBodies;
  std::vector<drpc::LinkBodyOwner> arena_owners;  // as the receiver: whole tensors only
  if (in_arena && drpc::link_body_owners(message, &arena_owners)) take_arena_bodies(message);
  // The bodies, as the receiver would get them (here: zeros), within reason for memory.
  uint64_t body_bytes = 0;
  for (const auto& body : message.bodies) {
    FUZZ_CHECK(body.size > 0 && (in_arena || (body.tag & drpc::kLinkBodyTagBit)),
               "an empty or head-tagged body was accepted");
    body_bytes += body.size;
    if (body_bytes > (1u << 20)) return 0;
  }
  std::vector<std::string> storage;
  std::vector<drpc::ByteSpan> bodies;
  for (const auto& body : message.bodies) storage.emplace_back(body.size, '\0');
  for (const auto& body : storage) bodies.push_back({reinterpret_cast<const uint8_t*>(body.data()), body.size()});
  std::vector<drpc::Frame> frames;
  if (!drpc::link_message_frames(message, bodies, nullptr, 1, &frames, &problem)) {
    FUZZ_CHECK(!problem.empty(), "refused frames have no reason");
    return 0;
  }
  FUZZ_CHECK(!frames.empty(), "a frames message without frames was accepted");
  // Where the receiver would place each body, read from the head alone: the frame and tensor
  // the complete message puts it in.
  std::vector<drpc::LinkBodyOwner> owners;
  if (drpc::link_body_owners(message, &owners)) {
    FUZZ_CHECK(owners.size() == message.bodies.size(), "a body has no owner");
    for (size_t i = 0; i < owners.size(); ++i) {
      bool found = false;
      for (const auto& frame : frames) {
        if (owners[i].tensor < 0 || owners[i].tensor >= static_cast<int>(frame.tensors.size())) continue;
        size_t offset = 0;
        for (int t = 0; t < owners[i].tensor; ++t) offset += frame.tensors[t].nbytes;
        size_t skip = offset;
        const uint8_t* start = nullptr;
        for (const auto& span : frame.body) {
          if (skip < span.size) {
            start = span.data + skip;
            break;
          }
          skip -= span.size;
        }
        found = found || (start == bodies[i].data && frame.header.seq() == owners[i].seq &&
                          frame.header.step() == owners[i].step && frame.header.kind() == owners[i].kind);
      }
      FUZZ_CHECK(found, "a body's owner is not the frame that holds it");
    }
  }
  // The same frames from the message made whole in one piece.
  std::string whole(reinterpret_cast<const char*>(message.frames), message.frames_size);
  uint64_t cut = 0;
  for (size_t i = 0; i < message.bodies.size(); ++i) {
    whole.insert(message.bodies[i].offset, storage[i]);
    cut += message.bodies[i].size;
  }
  FUZZ_CHECK(whole.size() == message.frames_size + cut, "bodies were spliced outside the frames");
  const auto again = drpc::decode_wire_frames({drpc::ByteSpan{reinterpret_cast<const uint8_t*>(whole.data()),
                                                              whole.size()}}, nullptr, 1);
  FUZZ_CHECK(again.size() == frames.size(), "the frames differ from decode_wire_frames'");
  for (size_t i = 0; i < frames.size(); ++i) {
    FUZZ_CHECK(frames[i].source == 1, "a frame lost its source");
    FUZZ_CHECK(frames[i].header.SerializeAsString() == again[i].header.SerializeAsString(), "a header differs");
    FUZZ_CHECK(frames[i].body_size() == again[i].body_size(), "a body's size differs");
  }
  return 0;
}
