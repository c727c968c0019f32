#pragma once

// Internal to //process_group: tagged point-to-point transfers (send, recv, recv_any):
// matches frames that arrive to the receives waiting for them by source and tag, holding
// either until the other comes.

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <vector>

#include "process_group/transport.h"
#include "process_group/work.h"

namespace drpc {

// Thread-safe. Lifecycle: construct, attach(transport), transfers, close(), fail_closed().
class P2PMatcher {
 public:
  P2PMatcher() = default;
  P2PMatcher(const P2PMatcher&) = delete;
  P2PMatcher& operator=(const P2PMatcher&) = delete;

  // Sends through `transport` (borrowed; must outlive the matcher's use). Once, before
  // the first send.
  void attach(Transport& transport);

  // ProcessGroup::send, recv and recv_any: throw kBadArgument for bad arguments; other
  // failures go to the Work.
  WorkPtr send(const std::vector<at::Tensor>& tensors, int dst_rank, int64_t tag);
  WorkPtr recv(const std::vector<at::Tensor>& tensors, int src_rank, int64_t tag);
  WorkPtr recv_any(int64_t tag);

  // A P2P frame (transport threads): completes the first matching receive, else waits
  // for one. Never throws.
  void on_frame(Frame frame);
  // `peer` is gone: receives from it fail, and receives from anyone once every peer is.
  // Once per peer (transport threads).
  void on_peer_failed(int peer, const Error& reason);

  // Stops matching: later calls fail with kShutdown. Idempotent; does not block.
  void close();
  // After close() (and the transport's shutdown): fails the receives that were waiting
  // with kShutdown.
  void fail_closed();

 private:
  struct Waiter {
    int source;  // -1: any source
    int64_t tag;
    std::function<void(Frame&)> on_frame;
    std::function<void(std::exception_ptr)> on_error;
  };

  void add_waiter(Waiter waiter);

  Transport* transport_ = nullptr;
  // Set by attach(), but the transport's callbacks can run before: atomics.
  std::atomic<int> rank_{-1};
  std::atomic<int> size_{0};

  std::mutex mu_;
  // Guarded by mu_.
  bool shut_down_ = false;
  std::map<int, Error> dead_;  // peer rank -> why it is gone
  std::list<Frame> inbox_;
  std::list<Waiter> waiters_;
  std::list<Waiter> closed_waiters_;  // taken by close(), failed by fail_closed()
};

}  // namespace drpc
