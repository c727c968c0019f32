#pragma once

// A job of N workers as threads of one test process, each a full drpc::Runtime with its
// own real gRPC process group on loopback, rendezvousing through an in-memory store.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "drpc.h"
#include "process_group/in_memory_store.h"

namespace drpc {
namespace testing {

class Job {
 public:
  explicit Job(int n, Options options = {}) : store_(create_in_memory_store()) {
    options.store = store_.get();
    options.init_timeout = std::chrono::milliseconds(30000);
    runtimes_.resize(n);
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        try {
          runtimes_[r] = Runtime::create("worker" + std::to_string(r), r, n, options);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
      if (!e.empty()) throw std::runtime_error(e);
    }
  }
  ~Job() { shutdown(false); }

  Runtime& operator[](int r) { return *runtimes_[r]; }
  int size() const { return static_cast<int>(runtimes_.size()); }

  // Shuts every worker down at once (graceful shutdown is a collective).
  void shutdown(bool graceful) {
    std::vector<std::thread> threads;
    for (auto& r : runtimes_) {
      if (r) threads.emplace_back([&r, graceful] { r->shutdown(graceful); });
    }
    for (auto& t : threads) t.join();
  }

 private:
  std::unique_ptr<InMemoryStore> store_;
  std::vector<std::unique_ptr<Runtime>> runtimes_;
};

// A latch the test opens: functions under test block on it instead of sleeping.
class Gate {
 public:
  // Opens, then waits for every waiter to be out of wait(): a handler woken by release()
  // (one whose call already timed out, say) may still be on its way out when the test ends.
  ~Gate() {
    std::unique_lock<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return inside_ == 0; });
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    ++inside_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    --inside_;
    cv_.notify_all();
  }
  void wait_for_waiters(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return waiting_ >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int waiting_ = 0;
  int inside_ = 0;  // threads in wait()
};

}  // namespace testing
}  // namespace drpc
