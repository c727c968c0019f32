// The format of the messages on a UCX link (ucx_link_message.h).

#include "process_group/ucx_link_message.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "common/error.h"

namespace drpc {
namespace {

constexpr size_t kBodyEntryBytes = 3 * sizeof(uint64_t);

// Little-endian hosts only (x86_64, aarch64), as the frames' length prefix.
template <typename T>
T read_at(const uint8_t* data) {
  T value;
  std::memcpy(&value, data, sizeof(T));
  return value;
}

template <typename T>
void append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

bool parse_bodies(const uint8_t* data, size_t size, bool in_arena, LinkMessage* message, std::string* problem) {
  if (size < sizeof(uint32_t)) {
    *problem = "a message with bodies has no body count";
    return false;
  }
  const uint32_t count = read_at<uint32_t>(data);
  size -= sizeof(uint32_t);
  data += sizeof(uint32_t);
  if (count == 0 || count > size / kBodyEntryBytes) {
    *problem = "a message claims " + std::to_string(count) + " bodies";
    return false;
  }
  message->frames = data + count * kBodyEntryBytes;
  message->frames_size = size - count * kBodyEntryBytes;
  uint64_t end_of_previous = 0;  // in the complete frames
  uint64_t cut_so_far = 0;       // bytes of the complete frames that are in bodies
  for (uint32_t i = 0; i < count; ++i) {
    LinkBody body;
    body.offset = read_at<uint64_t>(data + i * kBodyEntryBytes);
    body.size = read_at<uint64_t>(data + i * kBodyEntryBytes + 8);
    body.tag = read_at<uint64_t>(data + i * kBodyEntryBytes + 16);
    const std::string which = "body " + std::to_string(i);
    if (body.size == 0 || body.size > UINT64_MAX - body.offset) {
      *problem = which + " has size " + std::to_string(body.size);
      return false;
    }
    if (body.offset < end_of_previous || body.offset - cut_so_far > message->frames_size) {
      *problem = which + " at offset " + std::to_string(body.offset) + " is out of order or past the frames";
      return false;
    }
    if (!in_arena && (body.tag & kLinkBodyTagBit) == 0) {
      *problem = which + " has a head's tag";
      return false;
    }
    end_of_previous = body.offset + body.size;
    cut_so_far += body.size;
    message->bodies.push_back(body);
  }
  return true;
}

}  // namespace

std::string random_link_secret() {
  std::random_device device;  // /dev/urandom
  std::string secret(kLinkSecretBytes, '\0');
  for (size_t i = 0; i < secret.size(); i += sizeof(uint32_t)) {
    const uint32_t word = device();
    std::memcpy(&secret[i], &word, sizeof(word));
  }
  return secret;
}

bool starts_with_link_secret(const uint8_t* data, const std::string& secret) {
  if (secret.size() != kLinkSecretBytes) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < kLinkSecretBytes; ++i) diff |= data[i] ^ static_cast<uint8_t>(secret[i]);
  return diff == 0;
}

uint64_t link_body_tag(const std::string& secret, uint64_t counter) {
  uint64_t key[2] = {0, 0};  // the secret's two words (called per body: no copy of it)
  std::memcpy(key, secret.data(), std::min(secret.size(), sizeof(key)));
  // splitmix64's finalizer (a bijection) on a secret starting point, then a secret mask.
  uint64_t x = key[0] + counter * 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= (x >> 31) ^ key[1];
  return kLinkBodyTagBit | x;
}

std::string link_message_head(const std::string& secret, LinkMessageType type, const std::vector<LinkBody>& bodies) {
  std::string head = secret;
  head.resize(kLinkSecretBytes);
  head.push_back(static_cast<char>(type));
  if (type != LinkMessageType::kFramesWithBodies && type != LinkMessageType::kFramesWithArenaBodies) return head;
  append(head, static_cast<uint32_t>(bodies.size()));
  for (const auto& body : bodies) {
    append(head, body.offset);
    append(head, body.size);
    append(head, body.tag);
  }
  return head;
}

std::string link_probe_with_arena(const std::string& secret, const std::string& offer) {
  return link_message_head(secret, LinkMessageType::kProbe) + offer;
}

bool parse_link_message(const uint8_t* data, size_t size, const std::string& secret, LinkMessage* message,
                        std::string* problem) {
  *message = LinkMessage{};
  if (size < kLinkPrefixBytes) {
    *problem = "a message of " + std::to_string(size) + " bytes is shorter than its prefix";
    return false;
  }
  if (!starts_with_link_secret(data, secret)) {
    *problem = "the message does not carry the pair's secret";
    return false;
  }
  const uint8_t type = data[kLinkSecretBytes];
  data += kLinkPrefixBytes;
  size -= kLinkPrefixBytes;
  switch (type) {
    case static_cast<uint8_t>(LinkMessageType::kProbe):
      message->type = LinkMessageType::kProbe;
      if (size == kArenaOfferBytes) message->arena_offer = data;
      if (size == 0 || size == kArenaOfferBytes) return true;
      *problem = "a probe carries " + std::to_string(size) + " bytes";
      return false;
    case static_cast<uint8_t>(LinkMessageType::kFrames):
      message->type = LinkMessageType::kFrames;
      message->frames = data;
      message->frames_size = size;
      return true;
    case static_cast<uint8_t>(LinkMessageType::kFramesWithBodies):
      message->type = LinkMessageType::kFramesWithBodies;
      return parse_bodies(data, size, /*in_arena=*/false, message, problem);
    case static_cast<uint8_t>(LinkMessageType::kFramesWithArenaBodies):
      message->type = LinkMessageType::kFramesWithArenaBodies;
      return parse_bodies(data, size, /*in_arena=*/true, message, problem);
    default:
      *problem = "unknown message type " + std::to_string(type);
      return false;
  }
}

bool link_body_owners(const LinkMessage& message, std::vector<LinkBodyOwner>* owners) {
  owners->assign(message.bodies.size(), LinkBodyOwner{});
  const uint8_t* head = message.frames;
  const size_t head_size = message.frames_size;
  size_t at = 0;       // in the head
  uint64_t whole = 0;  // the same place in the complete frames
  size_t next_body = 0;
  while (next_body < message.bodies.size()) {
    if (head_size - at < sizeof(uint32_t)) return false;
    const uint32_t word = read_at<uint32_t>(head + at);
    const uint32_t header_size = word & ~kFlatMessageBit;
    at += sizeof(uint32_t);
    if (header_size > kMaxFrameHeaderBytes || header_size > head_size - at) return false;
    Frame frame;
    try {
      read_frame_header(word, head + at, header_size, &frame);
    } catch (const Error&) {
      return false;
    }
    const pg::FrameHeader& header = frame.header;
    at += header_size;
    whole += sizeof(uint32_t) + header_size;
    if (message.bodies[next_body].offset < whole) return false;  // a body inside a header
    for (size_t i = 0; i < frame.tensors.size(); ++i) {
      const uint64_t nbytes = frame.tensors[i].nbytes;
      if (nbytes > 0 && next_body < message.bodies.size() && message.bodies[next_body].offset == whole) {
        if (message.bodies[next_body].size != nbytes) return false;
        (*owners)[next_body++] = LinkBodyOwner{header.kind(), header.seq(), header.step(), static_cast<int>(i)};
      } else {
        if (nbytes > head_size - at) return false;
        at += nbytes;
      }
      whole += nbytes;
    }
  }
  return true;
}

bool link_message_frames(const LinkMessage& message, const std::vector<ByteSpan>& bodies,
                         std::shared_ptr<void> keepalive, int source, std::vector<Frame>* frames,
                         std::string* problem) {
  if (bodies.size() != message.bodies.size()) {
    *problem = "the message has " + std::to_string(message.bodies.size()) + " bodies, " +
               std::to_string(bodies.size()) + " arrived";
    return false;
  }
  // The complete frames: the head's frame bytes with each body spliced in at its offset.
  std::vector<ByteSpan> pieces;
  size_t head_at = 0;
  uint64_t cut_so_far = 0;
  for (size_t i = 0; i < bodies.size(); ++i) {
    if (bodies[i].size != message.bodies[i].size) {
      *problem = "body " + std::to_string(i) + " has " + std::to_string(bodies[i].size) + " bytes, not " +
                 std::to_string(message.bodies[i].size);
      return false;
    }
    const size_t cut_at = message.bodies[i].offset - cut_so_far;  // parse_link_message checked it
    pieces.push_back(ByteSpan{message.frames + head_at, cut_at - head_at});
    pieces.push_back(bodies[i]);
    head_at = cut_at;
    cut_so_far += message.bodies[i].size;
  }
  pieces.push_back(ByteSpan{message.frames + head_at, message.frames_size - head_at});
  try {
    *frames = decode_wire_frames(pieces, std::move(keepalive), source);
  } catch (const Error& e) {
    *problem = e.message();
    return false;
  }
  if (frames->empty()) {
    *problem = "a message without frames";
    return false;
  }
  return true;
}

}  // namespace drpc
