#pragma once

// Threads for user callbacks (future completions, `then` continuations): a task never runs
// on the thread that submits it, and a task that blocks (an RPC inside a callback, a wait
// on another future) does not starve the others: when tasks wait while no thread has
// started one for `stall`, every thread is taken to be blocked and the pool adds one, up to
// `max_threads` (beyond that tasks queue: only that many callbacks blocked at once can hold
// the rest up). A busy but moving pool stays small, so a burst of completions is not
// spread over many threads on a machine with few cores. Network threads hand work here
// and return at once.

#include <condition_variable>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/wake_batch.h"

namespace drpc {

class CallbackPool {
 public:
  // Each new thread runs `thread_main(serve)`, which must call serve() (it returns when
  // the pool closes): for log tags and thread names that last the thread's life.
  using ThreadMain = std::function<void(const std::function<void()>& serve)>;
  explicit CallbackPool(ThreadMain thread_main = nullptr, size_t max_threads = 64,
                        std::chrono::milliseconds stall = std::chrono::milliseconds(5))
      : thread_main_(std::move(thread_main)), max_threads_(max_threads), stall_(stall) {}
  CallbackPool(const CallbackPool&) = delete;
  CallbackPool& operator=(const CallbackPool&) = delete;
  ~CallbackPool() { close(); }

  // Runs `task` on a pool thread. After close() it runs at once on the calling thread, so
  // completions that come late (shutdown failing pending calls) are never lost.
  // Thread-safe.
  void run(std::function<void()> task) {
    bool wake_idle_thread = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (closed_) {
        lock.unlock();
        task();
        return;
      }
      queue_.push_back(std::move(task));
      if (threads_.empty()) {
        last_start_ = Clock::now();
        threads_.emplace_back([this] { loop(); });
        monitor_ = std::thread([this] { watch(); });
      }
      if (idle_ > 0) {
        wake_idle_thread = true;
      } else {
        wake_monitor_locked();  // every thread is busy: the monitor watches for a stall
      }
    }
    // Woken after the lock is released (woken under it, the thread would wake only to
    // block on mu_ again), and once per burst when the caller delivers one (WakeBatch).
    if (wake_idle_thread) WakeBatch::notify_one(work_cv_);
  }

  // Runs what is queued, then stops and joins every thread (a pool thread that calls it
  // is left to finish by itself). Idempotent.
  void close() {
    std::vector<std::thread> threads;
    std::thread monitor;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      threads.swap(threads_);
      monitor.swap(monitor_);
    }
    work_cv_->notify_all();
    monitor_cv_.notify_all();
    if (monitor.joinable()) monitor.join();
    for (auto& t : threads) {
      if (t.get_id() == std::this_thread::get_id()) {
        t.detach();
      } else {
        t.join();
      }
    }
  }

  size_t threads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_.size();
  }

 private:
  void loop() {
    if (thread_main_) {
      thread_main_([this] { serve(); });
    } else {
      serve();
    }
  }

  void serve() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      work_cv_->wait(lock, [&] { return closed_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // closed and drained
      auto task = std::move(queue_.front());
      queue_.pop_front();
      last_start_ = Clock::now();
      if (!queue_.empty() && idle_ == 0) wake_monitor_locked();  // a backlog begins here too
      // One wake-up may stand for a burst of tasks: what this thread leaves queued goes to
      // the next idle thread, so a task that blocks holds up none of them.
      const bool wake_next = !queue_.empty() && idle_ > 0;
      lock.unlock();
      if (wake_next) work_cv_->notify_one();
      task();
      lock.lock();
    }
  }

  // Adds a thread when tasks wait and no thread has started one for `stall_`.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!closed_) {
      auto backlog = [&] { return !queue_.empty() && idle_ == 0; };
      if (!backlog()) {
        monitor_waiting_ = true;
        monitor_cv_.wait(lock, [&] { return closed_ || backlog(); });
        monitor_waiting_ = false;
        continue;
      }
      const auto due = last_start_ + stall_;
      if (Clock::now() < due) {
        monitor_cv_.wait_until(lock, due);
        continue;
      }
      if (threads_.size() < max_threads_) {
        last_start_ = Clock::now();  // the new thread gets its own `stall_` to start
        threads_.emplace_back([this] { loop(); });
      } else {
        monitor_cv_.wait(lock, [&] { return closed_ || !backlog(); });
      }
    }
  }

  // Only a monitor waiting for a backlog needs waking: one already watching a backlog
  // wakes by itself at its deadline, so a burst of tasks costs it nothing.
  void wake_monitor_locked() {
    if (monitor_waiting_) monitor_cv_.notify_one();
  }

  using Clock = std::chrono::steady_clock;
  const ThreadMain thread_main_;
  const size_t max_threads_;
  const std::chrono::milliseconds stall_;
  mutable std::mutex mu_;
  const std::shared_ptr<std::condition_variable> work_cv_ = std::make_shared<std::condition_variable>();
  std::condition_variable monitor_cv_;
  std::thread monitor_;
  // Guarded by mu_.
  bool closed_ = false;
  size_t idle_ = 0;  // threads waiting for a task
  bool monitor_waiting_ = false;  // the monitor waits for a backlog to begin
  std::deque<std::function<void()>> queue_;
  Clock::time_point last_start_;  // when a thread last started a task (or was added)
  std::vector<std::thread> threads_;
};

}  // namespace drpc
