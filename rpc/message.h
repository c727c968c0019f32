#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace drpc {

// Message types the RPC layer knows; upper layers register handlers for their own types
// (RRef control messages from 100, autograd from 200).
enum MessageType : int32_t {
  kCallRequest = 1,  // payload: rpc::Call; reply payload: a Value
  // The agent's own, never passed to handlers.
  kJoinReport = 2,   // payload: rpc::JoinReport, to the join's leader
  kJoinVerdict = 3,  // payload: rpc::JoinVerdict, from the join's leader
};

// One request or reply between agents: opaque header bytes for its type plus tensors.
struct Message {
  int32_t type = 0;
  std::string payload;
  std::vector<at::Tensor> tensors;
  // Distributed autograd's record of this message (set by its interceptor): the context
  // it belongs to (-1: none), the send function's id, and which tensors require grad.
  int64_t autograd_context = -1;
  int64_t autograd_message = -1;
  std::vector<bool> requires_grad;
};

}  // namespace drpc
