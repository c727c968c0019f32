#pragma once

// An Executor for unit tests: time moves only when the test advances it, and tasks run
// only inside run_pending() and advance(), on the test's thread, so a layer's timers
// (retries, TTLs) are tested deterministically and without sleeping.

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "common/executor.h"

namespace drpc {

class ManualExecutor final : public Executor {
 public:
  ManualExecutor() = default;
  ~ManualExecutor() override { close(); }

  TimePoint now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }

  bool post(Task task) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    ready_.push_back(std::move(task));
    cv_.notify_all();
    return true;
  }

  TimerId run_at(TimePoint when, Task task) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return 0;
    const TimerId id = ++last_id_;
    timers_.emplace(std::make_pair(when, id), std::move(task));
    due_.emplace(id, when);
    cv_.notify_all();
    return id;
  }

  bool cancel(TimerId id) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = due_.find(id);
    if (it == due_.end()) return false;
    timers_.erase(std::make_pair(it->second, id));
    due_.erase(it);
    return true;
  }

  void close() override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    timers_.clear();
    due_.clear();
    ready_.clear();
  }

  // Runs posted tasks (and those they post) until none is left; returns how many ran.
  int run_pending() {
    int ran = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (!ready_.empty()) {
      Task task = std::move(ready_.front());
      ready_.pop_front();
      lock.unlock();
      task();
      ++ran;
      lock.lock();
    }
    return ran;
  }

  // Moves the clock forward by `delay`, running each timer at its due time (in due
  // order, then in the order they were set) and the tasks it posts; returns how many
  // timers ran.
  int advance(Clock::duration delay) {
    int ran = 0;
    std::unique_lock<std::mutex> lock(mu_);
    const TimePoint target = now_ + delay;
    while (true) {
      lock.unlock();
      run_pending();
      lock.lock();
      if (timers_.empty() || timers_.begin()->first.first > target) break;
      auto next = timers_.begin();
      now_ = std::max(now_, next->first.first);
      Task task = std::move(next->second);
      due_.erase(next->first.second);
      timers_.erase(next);
      lock.unlock();
      task();
      ++ran;
      lock.lock();
    }
    now_ = target;
    return ran;
  }

  // Blocks until a task is posted or a timer set that is not run yet (for work that
  // other threads, e.g. a reply's, hand to the executor).
  void wait_for_work() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || !ready_.empty() || !timers_.empty(); });
  }

  size_t timers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return timers_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  TimePoint now_{};
  bool closed_ = false;
  TimerId last_id_ = 0;
  std::deque<Task> ready_;
  std::map<std::pair<TimePoint, TimerId>, Task> timers_;
  std::map<TimerId, TimePoint> due_;
};

}  // namespace drpc
