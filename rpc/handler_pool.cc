// The agent's fixed pool of handler threads (see rpc/handler_pool.h).

#include "rpc/handler_pool.h"

#include <utility>

namespace drpc {

void HandlerPool::start(int num_threads) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this, i] { around_(i, [this] { loop(); }); });
  }
}

bool HandlerPool::post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

size_t HandlerPool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

void HandlerPool::stop() {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  dropped.clear();  // outside the lock: a task's captures may do anything when destroyed
}

void HandlerPool::join() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else {
      t.join();
    }
  }
}

void HandlerPool::loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
      if (stopped_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace drpc
