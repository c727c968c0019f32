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

}  // namespace drpc
