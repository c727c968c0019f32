#pragma once

// Threads for user callbacks (future completions, `then` continuations): a task never runs
// on the thread that submits it, and a task that blocks (an RPC inside a callback, a wait
// on another future) does not starve the others, because the pool adds a thread whenever
// every thread it has is busy, up to `max_threads` (beyond that tasks queue: only that
// many callbacks blocked at once can hold the rest up). Network threads hand work here
// and return at once.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace drpc {

class CallbackPool {
 public:
  // Each new thread runs `thread_main(serve)`, which must call serve() (it returns when
  // the pool closes): for log tags and thread names that last the thread's life.
  using ThreadMain = std::function<void(const std::function<void()>& serve)>;
  explicit CallbackPool(ThreadMain thread_main = nullptr, size_t max_threads = 64)
      : thread_main_(std::move(thread_main)), max_threads_(max_threads) {}
  CallbackPool(const CallbackPool&) = delete;
  CallbackPool& operator=(const CallbackPool&) = delete;
  ~CallbackPool() { close(); }

  // Runs `task` on a pool thread. After close() it runs at once on the calling thread, so
  // completions that come late (shutdown failing pending calls) are never lost.
  // Thread-safe.
  void run(std::function<void()> task) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!closed_) {
        queue_.push_back(std::move(task));
        if (idle_ < queue_.size() && threads_.size() < max_threads_) threads_.emplace_back([this] { loop(); });
        cv_.notify_one();
        return;
      }
    }
    task();
  }

  // Runs what is queued, then stops and joins every thread (a pool thread that calls it
  // is left to finish by itself). Idempotent.
  void close() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
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
      cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // closed and drained
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  const ThreadMain thread_main_;
  const size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  bool closed_ = false;
  size_t idle_ = 0;  // threads waiting for a task
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
};

}  // namespace drpc
