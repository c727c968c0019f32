#pragma once

// The interceptors an agent runs on every request and reply, in the order they were added.
// Part of the agent's implementation (rpc/process_group_agent.cc).

#include <vector>

#include "rpc/rpc_agent.h"

namespace drpc {

class InterceptorChain {
 public:
  // Before the agent starts; not thread-safe.
  void add(RpcAgent::Interceptor interceptor) { chain_.push_back(std::move(interceptor)); }

  // Runs every on_send (a message about to leave for `to`) or on_receive (one that arrived
  // from `from`). An interceptor's exception propagates. Thread-safe once the agent runs.
  void on_send(const WorkerInfo& to, Message& message) const {
    for (const auto& i : chain_) {
      if (i.on_send) i.on_send(to, message);
    }
  }
  void on_receive(const WorkerInfo& from, Message& message) const {
    for (const auto& i : chain_) {
      if (i.on_receive) i.on_receive(from, message);
    }
  }

 private:
  std::vector<RpcAgent::Interceptor> chain_;
};

}  // namespace drpc
