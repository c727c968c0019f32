#pragma once

// The job the RRef and autograd fuzzers attack: three workers in this process over the
// in-memory process group, each a real ProcessGroupAgent with a real RRef context and
// autograd container, wired as //:drpc wires them. Rank 0 is the worker under attack; the
// fuzzer's messages reach it from rank 1, through rank 1's process group, as a hostile
// peer's would. Not thread-safe: one caller drives a World.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "process_group/group_endpoints.h"
#include "rpc/proto/rpc.pb.h"
#include "rpc/rpc_agent.h"
#include "rref/rref_context.h"
#include "rref/rref.h"

namespace drpc {
namespace fuzz {

class World {
 public:
  // Sees every message as it arrives at rank 0, before any other interceptor (the seed
  // generator records them).
  using Recorder = std::function<void(const WorkerInfo& from, const Message& message)>;

  explicit World(Recorder recorder = nullptr);
  ~World();  // ungraceful: whatever is pending fails with kShutdown
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  RpcAgent& agent(int rank) { return *workers_[rank].agent; }
  RRefContext& rref(int rank) { return *workers_[rank].rref; }
  AutogradContainer& autograd(int rank) { return *workers_[rank].autograd; }

  // Builds the state that recorded messages refer to: rank 1 holds a user RRef of a
  // parameter owned by rank 0, and an autograd context in which that parameter met one of
  // rank 1's tensors on rank 0. Ids are counters, so every World gets the same ones.
  void build_state();

  // Traffic to rank 0 over that state, for the seed generator to record: fork requests,
  // child accepts, fetches, calls on the RRef with nested values, the distributed
  // backward, the context's release, the user's delete. Throws if a step fails.
  void exercise();

  // Delivers `message` to rank 0 as rank 1's process group sends it, then waits until
  // rank 0 has served it and whatever it queued on its handler pool. Aborts (a hang)
  // if rank 0 does not get there within the agents' timeout.
  void inject(const PgMessage& message);

 private:
  struct Worker {
    std::unique_ptr<Executor> executor;  // outlives the layers below, which use it
    std::unique_ptr<RpcAgent> agent;
    std::shared_ptr<RRefContext> rref;
    std::shared_ptr<AutogradContainer> autograd;
  };

  struct Arrivals;
  void wait_for_recorded(int32_t type);

  std::shared_ptr<Arrivals> arrivals_;  // shared with rank 0's interceptor
  std::vector<GroupEndpoints> groups_;  // each rank's group and the port its agent uses
  std::vector<Worker> workers_;
  // The state build_state() leaves for exercise().
  RRef param_;        // rank 1's user reference to rank 0's parameter
  int64_t context_ = -1;  // rank 1's autograd context
  at::Tensor loss_;   // on rank 1, computed through rank 0
};

// The id injected requests carry: far above any id rank 1's agent gives its own requests,
// so rank 0's replies to them are dropped as unknown there.
constexpr int64_t kInjectedRequestId = int64_t{1} << 40;

// Runs one fuzz input, a network message of wire frames (as process_group/frame.cc's
// decode_wire_frames reads them), through a fresh World: every
// MESSAGE frame whose envelope `wanted` accepts is injected at rank 0 after
// build_state(). Inputs the frame decoder rejects (with kProtocol) end there.
void run_message_input(const uint8_t* data, size_t size, const std::function<bool(const rpc::Envelope&)>& wanted);

// Quiets glog and protobuf's logging: a fuzzer's inputs are malformed by design.
void quiet_logs();

}  // namespace fuzz
}  // namespace drpc
