#pragma once

// The calls a worker is waiting on: matches a reply to its call, keeps each call's
// deadline on the worker's executor timers, and hands back the calls of a peer that died
// or, at shutdown, all of them. Each call leaves the table exactly once (reply, deadline,
// send failure, peer failure or close). Part of the agent's implementation
// (rpc/process_group_agent.cc), which builds the error texts and completes the futures.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/executor.h"
#include "rpc/metrics.h"
#include "rpc/rpc_agent.h"

namespace drpc {

struct CallTrace;  // rpc/call_tracing.h

// One call awaiting its reply.
struct PendingCall {
  FuturePtr future;
  int dst = -1;
  CallName what;  // its text only on error
  std::chrono::milliseconds timeout{0};  // 0: no deadline
  Metrics::Function* fn = nullptr;
  int64_t start_ns = 0;
  std::shared_ptr<CallTrace> trace;  // profiled calls only
};

class PendingCalls {
 public:
  // Gets a call whose deadline passed, already out of the table, on an executor thread
  // and outside every lock of this class. It may run until close() returns, never after.
  using OnExpired = std::function<void(int64_t id, PendingCall call)>;

  // `executor` keeps the deadlines and must outlive this table.
  PendingCalls(Executor& executor, OnExpired on_expired);
  PendingCalls(const PendingCalls&) = delete;
  PendingCalls& operator=(const PendingCalls&) = delete;
  // close(), dropping what it returns.
  ~PendingCalls();

  enum class AddResult { kAdded, kClosed, kNoTimer };
  // Registers call `id` (unique) and, if its timeout is positive, its deadline (now() +
  // timeout on the executor's clock). kClosed after close(); kNoTimer when it needs a
  // deadline and the executor is closed. Either way `call` is dropped. Thread-safe.
  AddResult add(int64_t id, PendingCall call);

  // Takes call `id` out and cancels its deadline (a reply came, or it could not be sent);
  // nothing if it already left (timed out, failed, closed). Thread-safe.
  std::optional<PendingCall> take(int64_t id);

  // Takes out every call to `dst` (the peer died), in call order. Thread-safe.
  std::vector<PendingCall> take_peer(int dst);

  // Takes out every call and cancels the deadlines; later add()s are refused. Waits for
  // deadline callbacks in progress (not when called from one). Idempotent: a second close
  // returns nothing. Thread-safe.
  std::vector<PendingCall> close();

  // Calls waiting. Thread-safe.
  size_t size() const;
  bool empty() const { return size() == 0; }

  // Runs `visit` on up to `max` calls, oldest first, under this table's lock: it must
  // not call back into the table. Thread-safe.
  void visit_oldest(size_t max, const std::function<void(const PendingCall&)>& visit) const;

 private:
  struct State;
  static void expire(const std::weak_ptr<State>& state, int64_t id);

  Executor& executor_;
  // Shared with the deadline callbacks, which hold it weakly: one that runs after close()
  // finds the table closed and does nothing.
  const std::shared_ptr<State> state_;
};

}  // namespace drpc
