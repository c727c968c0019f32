#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/executor.h"
#include "rpc/rpc_agent.h"
#include "rpc/value_codec.h"
#include "rref/message_types.h"
#include "rref/rref.h"

namespace drpc {

// One worker's RRefs: the values it owns and the references it holds to others', kept
// consistent across workers with PyTorch's fork / confirm / delete protocol. Thread-safe.
class RRefContext {
 public:
  // Runs function `fn` on this worker (the composition root wires its registry) as an RPC
  // would run it, for a caller whose request carried `caller` (rpc/message.h's Extensions,
  // opaque here; empty for a call made on this worker): the composition root restores
  // what upper layers put there, such as the caller's distributed autograd context, so
  // the calls `fn` makes belong to it.
  using Run = std::function<FuturePtr(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                      const Extensions& caller)>;
  // Runs `fn` on a value this worker owns: a TorchScript object's method, or a
  // registered function with the value first. For `caller`, as Run.
  using Apply = std::function<FuturePtr(const c10::IValue& value, const std::string& fn,
                                        std::vector<c10::IValue> args, Kwargs kwargs, const Extensions& caller)>;

  RRefContext() = default;
  RRefContext(const RRefContext&) = delete;
  RRefContext& operator=(const RRefContext&) = delete;
  virtual ~RRefContext() = default;

  // Runs `fn` on `to` and returns at once an RRef to its result there.
  virtual RRef remote(const WorkerInfo& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                      std::chrono::milliseconds timeout) = 0;
  virtual RRef make_local(c10::IValue value) = 0;

  // How RRefs inside values cross the wire to / from `peer`.
  virtual ValueHooks hooks(int peer) = 0;
  // Completes once every RRef inside `values` is confirmed by its owner.
  virtual FuturePtr confirmations(const std::vector<c10::IValue>& values) = 0;

  virtual RRefCounts counts() = 0;

  // Graceful leave, before the agent's join: waits (up to `timeout`) until the owners
  // confirmed every fork this worker made or received, then deletes every user reference
  // this worker holds and waits for those deletions to be acknowledged.
  virtual void release_all(std::chrono::milliseconds timeout) = 0;
  // After every worker released: the ids of RRefs this worker still owns for others.
  virtual std::vector<std::string> leaks() = 0;
  // Stops retrying control messages. Idempotent.
  virtual void shutdown() = 0;
};

struct RRefOptions {
  std::chrono::milliseconds control_timeout{2000};  // per attempt of a control message
  int control_attempts = 10;                        // with exponential backoff from 20 ms
  // How long a child accept waits to ride on the next message to its peer (the reply to
  // the call that carried the RRef back to its owner, usually) before it leaves alone. It
  // only delays when the parent drops the reference it kept for the call.
  std::chrono::milliseconds accept_carry_window{100};
};

// `agent` is borrowed and must outlive the context; the context registers its handlers
// on it (before agent.start()). Control messages are sent, and retried on its clock, from
// `executor` (borrowed; must outlive the context or at least its shutdown()). Shared: RRef
// handles keep a weak reference to it.
std::shared_ptr<RRefContext> create_rref_context(RpcAgent& agent, Executor& executor, RRefContext::Run run,
                                                 RRefContext::Apply apply, const RRefOptions& options = {});

}  // namespace drpc
