#pragma once

#include <chrono>
#include <map>
#include <memory>

#include "rpc/rpc_agent.h"

namespace drpc {

// What a FaultyAgent does to the requests it sends, by message type.
struct Faults {
  std::map<int32_t, int> drop;                             // fail the next N sends (as lost)
  std::map<int32_t, std::chrono::milliseconds> delay;      // hold every send this long
};

// An RpcAgent that forwards to `inner` (owned) but drops or delays chosen requests, for
// testing protocols that must survive lost and late messages. A dropped request never
// leaves; its future fails at once with kTimeout, as a lost message's would later.
std::unique_ptr<RpcAgent> create_faulty_agent(std::unique_ptr<RpcAgent> inner, Faults faults);

}  // namespace drpc
