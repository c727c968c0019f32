#pragma once

// The RRef protocol's message types on the agent.

#include <cstdint>

namespace drpc {

// Message types of the RRef protocol.
enum RRefMessageType : int32_t {
  kRRefRemoteCall = 100,
  kRRefFetch = 101,
  kRRefUserDelete = 102,
  kRRefForkRequest = 103,
  kRRefChildAccept = 104,
  kRRefApply = 105,
  kRRefControlBatch = 106,  // several of the above's controls to one peer (rref::ControlBatch)
};

// The id of the RRef layer's header on other messages (rpc/message.h's Extensions): child
// accepts riding to their peer on whatever message goes there next (an rref::ControlBatch).
constexpr int32_t kRRefCarriedControls = 100;

// The most controls one kRRefControlBatch carries; an owner refuses a larger batch unread, so
// a peer cannot make it apply (and answer) millions of items on its network thread.
constexpr int kMaxControlBatch = 512;

}  // namespace drpc
