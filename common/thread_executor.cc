// The executor workers run on: a timer thread that hands due timers to a CallbackPool,
// where posted tasks run too.

#include <condition_variable>
#include <map>
#include <thread>
#include <utility>

#include "common/callback_pool.h"
#include "common/executor.h"
#include "common/logging.h"

namespace drpc {
namespace {

class ThreadExecutor final : public Executor {
 public:
  explicit ThreadExecutor(std::string log_tag)
      : log_tag_(std::move(log_tag)), pool_([this](const std::function<void()>& serve) {
          ScopedLogTag tag(&log_tag_);
          serve();
        }) {}
  ~ThreadExecutor() override { close(); }

  TimePoint now() const override { return Clock::now(); }

  bool post(Task task) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
    }
    // A close() racing with this lets the pool run the task on this thread: acceptable,
    // since close() drains what was posted anyway.
    pool_.run(std::move(task));
    return true;
  }

  TimerId run_at(TimePoint when, Task task) override {
    bool earliest;
    TimerId id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return 0;
      id = ++last_id_;
      earliest = timers_.empty() || when < timers_.begin()->first.first;
      timers_.emplace(std::make_pair(when, id), std::move(task));
      due_.emplace(id, when);
      if (!timer_thread_.joinable()) timer_thread_ = std::thread([this] { run_timers(); });
    }
    // The timer thread sleeps until the earliest timer: only an earlier one must wake it.
    if (earliest) cv_.notify_one();
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
    std::thread timer_thread;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      timers_.clear();
      due_.clear();
      timer_thread.swap(timer_thread_);
    }
    cv_.notify_all();
    if (timer_thread.joinable()) {
      if (timer_thread.get_id() == std::this_thread::get_id()) {
        timer_thread.detach();
      } else {
        timer_thread.join();
      }
    }
    pool_.close();
  }

 private:
  void run_timers() {
    ScopedLogTag tag(&log_tag_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!closed_) {
      if (timers_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto next = timers_.begin();
      // A copy: wait_until reads its deadline again after waking, when close() or
      // cancel() may have freed the timer's node meanwhile.
      const TimePoint due = next->first.first;
      if (Clock::now() < due) {
        cv_.wait_until(lock, due);
        continue;
      }
      Task task = std::move(next->second);
      due_.erase(next->first.second);
      timers_.erase(next);
      lock.unlock();
      pool_.run(std::move(task));
      lock.lock();
    }
  }

  const std::string log_tag_;
  CallbackPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  bool closed_ = false;
  TimerId last_id_ = 0;
  std::map<std::pair<TimePoint, TimerId>, Task> timers_;  // by due time, then by creation
  std::map<TimerId, TimePoint> due_;
  std::thread timer_thread_;
};

}  // namespace

std::unique_ptr<Executor> create_thread_executor(const std::string& log_tag) {
  return std::make_unique<ThreadExecutor>(log_tag);
}

}  // namespace drpc
