#pragma once

// Deferred work and time for one worker's layers. The composition root creates one
// executor per worker and hands it to every layer, so timers (retries, TTLs) and work
// moved off network threads run on threads the worker knows, and a test replaces the
// whole of it, clock included, with ManualExecutor (common/manual_executor.h).

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace drpc {

class Executor {
 public:
  using Clock = std::chrono::steady_clock;
  using TimePoint = Clock::time_point;
  using Task = std::function<void()>;
  using TimerId = uint64_t;  // 0 is never a timer

  Executor() = default;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  virtual ~Executor() = default;

  // The executor's time: the steady clock, or a test's manual clock. Thread-safe.
  virtual TimePoint now() const = 0;

  // Runs `task` on an executor thread, never inside this call. Tasks may block: one that
  // blocks does not hold the others up. False (and `task` is dropped) once closed.
  // Thread-safe.
  virtual bool post(Task task) = 0;

  // Runs `task` on an executor thread once now() reaches `when`. Returns the id for
  // cancel(), or 0 once closed (`task` is dropped). Thread-safe.
  virtual TimerId run_at(TimePoint when, Task task) = 0;
  TimerId run_after(Clock::duration delay, Task task) { return run_at(now() + delay, std::move(task)); }

  // True if the timer had not started and now never will; false if it ran, is running
  // (not waited for) or never existed. Thread-safe.
  virtual bool cancel(TimerId id) = 0;

  // Drops the timers, lets tasks already started or posted finish, then joins the
  // threads. Idempotent; from an executor thread it does not wait for that thread.
  virtual void close() = 0;
};

// Tasks posted through one strand run one at a time, in the order they were posted, on
// the executor's threads: state touched only from its strand needs no lock of its own.
// The strand may be destroyed with tasks queued; they still run (the queue is shared
// with the drain task). Thread-safe.
class Strand {
 public:
  explicit Strand(Executor& executor) : executor_(executor), queue_(std::make_shared<Queue>()) {}
  Strand(const Strand&) = delete;
  Strand& operator=(const Strand&) = delete;

  // False (and `task` is dropped) once the executor is closed.
  bool post(Executor::Task task) {
    {
      std::lock_guard<std::mutex> lock(queue_->mu);
      queue_->tasks.push_back(std::move(task));
      if (queue_->draining) return true;
      queue_->draining = true;
    }
    if (executor_.post([queue = queue_] { drain(*queue); })) return true;
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->tasks.clear();
    queue_->draining = false;
    return false;
  }

 private:
  struct Queue {
    std::mutex mu;
    std::deque<Executor::Task> tasks;  // guarded by mu
    bool draining = false;             // guarded by mu: a drain task owns the queue
  };

  static void drain(Queue& queue) {
    std::unique_lock<std::mutex> lock(queue.mu);
    while (!queue.tasks.empty()) {
      Executor::Task task = std::move(queue.tasks.front());
      queue.tasks.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
    queue.draining = false;
  }

  Executor& executor_;
  const std::shared_ptr<Queue> queue_;
};

// The real one: the steady clock, a timer thread, and tasks on a CallbackPool (which grows
// when its tasks block). Its threads' log lines carry `log_tag` ("[name/rank]").
std::unique_ptr<Executor> create_thread_executor(const std::string& log_tag);

}  // namespace drpc
