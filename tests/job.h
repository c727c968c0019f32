#pragma once

// A job of N workers as threads of one test process, each a full drpc::Runtime with its
// own real gRPC process group on loopback (or, with Network::kInMemory, the in-memory
// process group, composed by the same Runtime code), rendezvousing through an in-memory
// store.

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "drpc.h"
#include "process_group/in_memory_process_group.h"
#include "process_group/in_memory_store.h"

namespace drpc {
namespace testing {

enum class Network { kGrpc, kInMemory };

inline std::string network_name(Network network) { return network == Network::kGrpc ? "Grpc" : "InMemory"; }

class Job {
 public:
  explicit Job(int n, Options options = {}, Network network = Network::kGrpc) : store_(create_in_memory_store()) {
    options.store = store_.get();
    options.init_timeout = std::chrono::milliseconds(30000);
    if (network == Network::kInMemory) {
      auto groups = std::make_shared<std::vector<GroupEndpoints>>(create_in_memory_process_groups(n));
      options.process_group = [groups](Store&, int rank, int, const Options&) { return std::move(groups->at(rank)); };
    }
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

// A suite's fixture whose cases share one job of `N` workers per network: every case
// runs over real gRPC and over the in-memory process group (which must then behave as
// gRPC does for everything above it). Instantiate with DRPC_ON_EVERY_NETWORK(Suite).
template <int N>
class JobOnEveryNetwork : public ::testing::TestWithParam<Network> {
 protected:
  void SetUp() override {
    auto& job = jobs()[GetParam()];
    if (!job) job = std::make_unique<Job>(N, Options{}, GetParam());
    job_ = job.get();
  }
  static void TearDownTestSuite() { jobs().clear(); }
  Job* job_ = nullptr;

 private:
  static std::map<Network, std::unique_ptr<Job>>& jobs() {
    static std::map<Network, std::unique_ptr<Job>> jobs;
    return jobs;
  }
};

#define DRPC_ON_EVERY_NETWORK(suite)                                                                           \
  INSTANTIATE_TEST_SUITE_P(Networks, suite,                                                                    \
                           ::testing::Values(::drpc::testing::Network::kGrpc,                                  \
                                             ::drpc::testing::Network::kInMemory),                             \
                           [](const ::testing::TestParamInfo<::drpc::testing::Network>& info) {                \
                             return ::drpc::testing::network_name(info.param);                                 \
                           })

// Waits (bounded) until `condition` holds, for state that changes on other workers with no
// local event to wait on (deletions and releases travel asynchronously).
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

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
