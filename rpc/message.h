#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace drpc {

// Message types the RPC layer knows; upper layers register handlers for their own types
// (RRef control messages from 100, autograd from 200).
enum MessageType : int32_t {
  kCallRequest = 1,  // payload: a call (rpc/call_codec.h); reply payload: a value
  // The agent's own, never passed to handlers.
  kJoinReport = 2,   // payload: rpc::JoinReport, to the join's leader
  kJoinVerdict = 3,  // payload: rpc::JoinVerdict, from the join's leader
};

// Headers an upper layer attaches to messages (through an interceptor), keyed by an id
// from that layer's own range, as its message types are (distributed autograd: 200-299).
// The agent carries them and never reads them. A reply starts with its request's
// extensions (an interceptor's on_send may replace or drop them), so what a layer put on
// a request, such as the caller's autograd context, reaches the reply.
using Extensions = std::map<int32_t, std::string>;

// One request or reply between agents: opaque header bytes for its type plus tensors.
struct Message {
  int32_t type = 0;
  std::string payload;
  std::vector<at::Tensor> tensors;
  Extensions extensions;
};

}  // namespace drpc
