// The pending-call table: calls by id with their deadline timers on the executor (see
// rpc/pending_calls.h).

#include "rpc/pending_calls.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace drpc {

struct PendingCalls::State {
  explicit State(OnExpired on_expired) : on_expired(std::move(on_expired)) {}

  struct Entry {
    PendingCall call;
    Executor::TimerId timer = 0;  // 0: no deadline
  };

  const OnExpired on_expired;
  mutable std::mutex mu;
  std::condition_variable expired_cv;  // an expiry callback finished
  // Guarded by mu.
  bool closed = false;
  std::map<int64_t, Entry> calls;           // ids grow: oldest first
  std::vector<std::thread::id> expiring;    // threads running on_expired now
};

PendingCalls::PendingCalls(Executor& executor, OnExpired on_expired)
    : executor_(executor), state_(std::make_shared<State>(std::move(on_expired))) {}

PendingCalls::~PendingCalls() { close(); }

PendingCalls::AddResult PendingCalls::add(int64_t id, PendingCall call) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->closed) return AddResult::kClosed;
  Executor::TimerId timer = 0;
  if (call.timeout.count() > 0) {
    // Set under the lock, so the deadline cannot fire before the call is in the table.
    // The executor's lock is a leaf: run_at() never calls back.
    timer = executor_.run_at(executor_.now() + call.timeout,
                             [state = std::weak_ptr<State>(state_), id] { expire(state, id); });
    if (timer == 0) return AddResult::kNoTimer;
  }
  state_->calls.emplace(id, State::Entry{std::move(call), timer});
  return AddResult::kAdded;
}

std::optional<PendingCall> PendingCalls::take(int64_t id) {
  State::Entry entry;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->calls.find(id);
    if (it == state_->calls.end()) return std::nullopt;
    entry = std::move(it->second);
    state_->calls.erase(it);
  }
  // A deadline already running finds the call gone and does nothing.
  if (entry.timer != 0) executor_.cancel(entry.timer);
  return std::move(entry.call);
}

std::vector<PendingCall> PendingCalls::take_peer(int dst) {
  std::vector<PendingCall> taken;
  std::vector<Executor::TimerId> timers;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto it = state_->calls.begin(); it != state_->calls.end();) {
      if (it->second.call.dst != dst) {
        ++it;
        continue;
      }
      if (it->second.timer != 0) timers.push_back(it->second.timer);
      taken.push_back(std::move(it->second.call));
      it = state_->calls.erase(it);
    }
  }
  for (Executor::TimerId timer : timers) executor_.cancel(timer);
  return taken;
}

std::vector<PendingCall> PendingCalls::close() {
  std::map<int64_t, State::Entry> calls;
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->closed = true;
    calls.swap(state_->calls);
    // Deadline callbacks that took their call before the close may still use what the
    // owner gave on_expired: wait for them (but not for this thread's own).
    const auto self = std::this_thread::get_id();
    state_->expired_cv.wait(lock, [&] {
      return std::all_of(state_->expiring.begin(), state_->expiring.end(),
                         [&](const std::thread::id& t) { return t == self; });
    });
  }
  std::vector<PendingCall> taken;
  taken.reserve(calls.size());
  for (auto& [id, entry] : calls) {
    if (entry.timer != 0) executor_.cancel(entry.timer);
    taken.push_back(std::move(entry.call));
  }
  return taken;
}

size_t PendingCalls::size() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->calls.size();
}

void PendingCalls::visit_oldest(size_t max, const std::function<void(const PendingCall&)>& visit) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  size_t n = 0;
  for (const auto& [id, entry] : state_->calls) {
    if (n++ >= max) break;
    visit(entry.call);
  }
}

void PendingCalls::expire(const std::weak_ptr<State>& weak, int64_t id) {
  const std::shared_ptr<State> state = weak.lock();
  if (!state) return;  // the table is gone
  PendingCall call;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->closed) return;
    auto it = state->calls.find(id);
    if (it == state->calls.end()) return;  // answered (or failed) meanwhile
    call = std::move(it->second.call);
    state->calls.erase(it);
    state->expiring.push_back(std::this_thread::get_id());
  }
  // Marks this callback finished even if on_expired throws, so close() never waits forever.
  struct Finished {
    State& state;
    ~Finished() {
      {
        std::lock_guard<std::mutex> lock(state.mu);
        auto it = std::find(state.expiring.begin(), state.expiring.end(), std::this_thread::get_id());
        if (it != state.expiring.end()) state.expiring.erase(it);
      }
      state.expired_cv.notify_all();
    }
  } finished{*state};
  state->on_expired(id, std::move(call));
}

}  // namespace drpc
