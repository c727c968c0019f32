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
  // Random faults by message type, drawn from a generator seeded with `seed`, so a
  // failing run can be replayed:
  std::map<int32_t, double> drop_probability;              // the request never leaves
  std::map<int32_t, double> lose_reply_probability;        // it is served, the reply is lost
  std::map<int32_t, std::chrono::milliseconds> max_random_delay;  // held 0..max (reorders)
  uint64_t seed = 0;
};

// An RpcAgent that forwards to `inner` (owned) but drops or delays chosen requests, for
// testing protocols that must survive lost and late messages. A dropped request never
// leaves; its future fails at once with kTimeout, as a lost message's would later. A lost
// reply fails the future with kTimeout once the real reply has arrived (and is dropped).
std::unique_ptr<RpcAgent> create_faulty_agent(std::unique_ptr<RpcAgent> inner, Faults faults);

}  // namespace drpc
