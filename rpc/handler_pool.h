#pragma once

// The agent's handler threads: a fixed number of threads that run queued tasks (requests
// to serve, RpcAgent::run_on_pool work) in the order they were queued. Part of the
// agent's implementation (rpc/process_group_agent.cc), which decides what runs here.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace drpc {

class HandlerPool {
 public:
  using Task = std::function<void()>;
  // Runs a thread's whole loop, `serve`, inside whatever the thread needs around it (its
  // log tag, its name); `index` numbers the threads from 0.
  using AroundThread = std::function<void(int index, const Task& serve)>;

  explicit HandlerPool(AroundThread around) : around_(std::move(around)) {}
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;
  // stop() and join().
  ~HandlerPool() {
    stop();
    join();
  }

  // Starts `num_threads` threads, which run what was queued before and after. Call once,
  // before stop(); not thread-safe against itself.
  void start(int num_threads);

  // Queues `task`; false (and `task` is dropped) once stopped. Thread-safe.
  bool post(Task task);

  // Tasks queued and not started. Thread-safe.
  size_t queued() const;

  // Drops the queued tasks and refuses later ones; the running ones finish (join() waits
  // for them). Does not block. Idempotent. Thread-safe.
  void stop();

  // After stop(): waits for the threads (not the calling one, if it is a pool thread).
  // Idempotent. Thread-safe.
  void join();

 private:
  void loop();

  const AroundThread around_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  bool stopped_ = false;
  std::deque<Task> queue_;
  std::vector<std::thread> threads_;
};

}  // namespace drpc
