#pragma once

// The RRef protocol's control messages (fork requests, child accepts, user deletes) and
// their delivery: each is idempotent, so it is sent with a deadline and, when it times
// out, sent again with exponential backoff on the executor's clock, until the peer
// answers, the peer is gone, or the attempts run out. First attempts leave in the order
// they were made (one strand), as the protocol sends them.
//
// One message is in flight per peer: what is queued for a peer meanwhile leaves as one
// batch (kRRefControlBatch, in order, one outcome per control) when it is answered. A
// program that lets go of many RRefs at once costs a few round trips, not one each.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "common/executor.h"
#include "rpc/rpc_agent.h"
#include "rref/rref_context.h"
#include "rref/rref_id.h"

namespace drpc {
namespace rref_internal {

class ControlChannel : public std::enable_shared_from_this<ControlChannel> {
 public:
  // A control's outcome: nullptr once its peer answered, else the error it gave up on
  // (not called for controls withdrawn by peer_failed() or stop()). Called once per
  // control, without the channel's lock, on whichever thread learnt it.
  using Done = std::function<void(const Control& control, std::exception_ptr error)>;

  // `agent` and `executor` are borrowed and must outlive the channel or its stop().
  static std::shared_ptr<ControlChannel> create(RpcAgent& agent, Executor& executor, const RRefOptions& options,
                                                Done done);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Queues `control`; never sends on this thread, so it may be called under the caller's
  // lock. Dropped after stop() or when its peer is known gone. Thread-safe.
  void send(const Control& control);
  // As send(), but `control` first waits up to `window` to ride on the next message to its
  // peer (take_carried()), and leaves alone only if none goes. For controls whose delay
  // harms nothing: a child accept only lets the parent drop a reference it kept.
  void send_carried(const Control& control, std::chrono::milliseconds window);
  // Takes the controls waiting to ride to `peer` (at most kMaxControlBatch, in order): the
  // caller puts them on a message to it that its agent cannot refuse, and they count as
  // delivered. Thread-safe.
  std::vector<Control> take_carried(int peer);
  // Whether any control waits to ride, to any peer. Without the lock: a hint, checked on
  // every message before anything costlier.
  bool has_carried() const { return carried_.load(std::memory_order_relaxed) > 0; }
  // `peer` is gone: its waiting controls are withdrawn, later ones dropped. Thread-safe.
  void peer_failed(int peer);
  // Waits until no control is queued, waiting for a retry or awaiting its answer; false
  // if `deadline` came first. Thread-safe.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  // Stops sending and retrying. Idempotent.
  void stop();

 private:
  struct Attempt {
    Control control;
    int attempt = 0;
    bool due = false;       // a retry is not until its backoff has passed
    bool carried = false;   // waiting to ride on another message (send_carried)
  };
  ControlChannel(RpcAgent& agent, Executor& executor, const RRefOptions& options, Done done);
  // send() (no window) and send_carried().
  void queue(const Control& control, std::optional<std::chrono::milliseconds> carry_window);
  void schedule_locked(Attempt a, std::chrono::milliseconds delay);
  std::map<int64_t, Attempt>::iterator erase_waiting_locked(std::map<int64_t, Attempt>::iterator it);
  void make_due(int64_t key);
  void send_waiting(int64_t key);
  // Sets errors[i] for each control of `batch` the owner's answer (`reply_value`) says failed.
  // Throws if the answer is not a Message.
  void read_outcomes(int peer, const std::vector<Attempt>& batch, const c10::IValue& reply_value,
                     std::vector<std::exception_ptr>& errors);
  void send_batch(int peer, std::vector<Attempt> batch);
  void batch_answered(int peer);
  void sent(Attempt a, std::exception_ptr error);
  void finished_locked();

  RpcAgent& agent_;
  Executor& executor_;
  Strand sends_;
  const RRefOptions options_;
  const Done done_;
  std::mutex mu_;
  std::condition_variable idle_;
  // Guarded by mu_.
  std::map<int64_t, Attempt> waiting_;  // by key: attempts waiting to be sent
  int64_t last_key_ = 0;
  int64_t in_flight_ = 0;  // controls neither answered nor given up nor withdrawn
  std::set<int> gone_;
  std::set<int> busy_;  // peers with a message in flight
  bool stopped_ = false;
  std::atomic<int64_t> carried_{0};  // attempts in waiting_ with `carried` set (written under mu_)
};

}  // namespace rref_internal
}  // namespace drpc
