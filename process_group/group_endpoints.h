#pragma once

// What a process group factory hands out for one rank: the group (collectives,
// point-to-point) and the message port over the same transport.

#include <memory>

#include "process_group/message_port.h"
#include "process_group/process_group.h"

namespace drpc {

// Both share the rank's transport, which either keeps alive: they may be destroyed in any
// order. The transport closes when `group` shuts down or is destroyed; from then on the
// port delivers nothing and its sends throw kShutdown. Whoever borrows `messages` (the RPC
// agent) must not outlive it.
struct GroupEndpoints {
  std::unique_ptr<ProcessGroup> group;
  std::unique_ptr<MessagePort> messages;
};

}  // namespace drpc
