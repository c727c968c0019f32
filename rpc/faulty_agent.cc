#include "rpc/faulty_agent.h"

#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;

class FaultyAgent final : public RpcAgent {
 public:
  FaultyAgent(std::unique_ptr<RpcAgent> inner, Faults faults)
      : inner_(std::move(inner)), faults_(std::move(faults)), random_(faults_.seed) {
    delayer_ = std::thread([this] { delay_loop(); });
  }
  ~FaultyAgent() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    delayer_.join();
  }

  const WorkerInfo& self() const override { return inner_->self(); }
  WorkerInfo worker(const std::string& name) const override { return inner_->worker(name); }
  WorkerInfo worker(int id) const override { return inner_->worker(id); }
  std::vector<WorkerInfo> workers() const override { return inner_->workers(); }
  std::chrono::milliseconds default_timeout() const override { return inner_->default_timeout(); }
  void register_handler(int32_t type, Handler handler, InlinePolicy run_inline) override {
    inner_->register_handler(type, std::move(handler), run_inline);
  }
  void add_interceptor(Interceptor interceptor) override { inner_->add_interceptor(std::move(interceptor)); }
  void add_peer_failure_listener(PeerFailureListener listener) override {
    inner_->add_peer_failure_listener(std::move(listener));
  }
  void set_instruments(Metrics* metrics, Tracer* tracer) override { inner_->set_instruments(metrics, tracer); }
  void start() override { inner_->start(); }
  void run_on_pool(std::function<void()> task) override { inner_->run_on_pool(std::move(task)); }
  using RpcAgent::join;
  void run_callback(std::function<void()> task) override { inner_->run_callback(std::move(task)); }
  void set_default_timeout(std::chrono::milliseconds timeout) override { inner_->set_default_timeout(timeout); }
  void join(std::chrono::milliseconds timeout) override {
    // Delayed sends count as outstanding: wait for them to leave first.
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return delayed_.empty() || stopped_; });
    lock.unlock();
    inner_->join(timeout);
  }
  void shutdown(bool graceful) override {
    // One join, as every other agent's graceful shutdown makes (joins are job-wide).
    if (graceful) join();
    inner_->shutdown(false);
  }

  FuturePtr send(const WorkerInfo& to, Message request, std::chrono::milliseconds timeout,
                 CallName name) override {
    const std::string what = name.text();
    std::unique_lock<std::mutex> lock(mu_);
    auto drop = faults_.drop.find(request.type);
    if (drop != faults_.drop.end() && drop->second > 0) {
      --drop->second;
      ++dropped_;
      lock.unlock();
      auto future = make_message_future();
      future->setError(std::make_exception_ptr(Error(ErrorKind::kTimeout, what + " was dropped by the faulty agent")));
      return future;
    }
    if (chance(faults_.drop_probability, request.type)) {
      ++dropped_;
      lock.unlock();
      auto future = make_message_future();
      future->setError(std::make_exception_ptr(Error(ErrorKind::kTimeout, what + " was dropped by the faulty agent")));
      return future;
    }
    const bool lose_reply = chance(faults_.lose_reply_probability, request.type);
    std::chrono::milliseconds hold{0};
    auto delay = faults_.delay.find(request.type);
    if (delay != faults_.delay.end()) hold = delay->second;
    auto random_delay = faults_.max_random_delay.find(request.type);
    if (random_delay != faults_.max_random_delay.end()) {
      hold += std::chrono::milliseconds(
          std::uniform_int_distribution<int64_t>(0, random_delay->second.count())(random_));
    }
    FuturePtr future;
    if (hold.count() == 0) {
      lock.unlock();
      future = inner_->send(to, std::move(request), timeout, name);
    } else {
      future = make_message_future();
      delayed_.emplace(Clock::now() + hold, Delayed{to, std::move(request), timeout, name, future});
      cv_.notify_all();
      lock.unlock();
    }
    if (!lose_reply) return future;
    auto lost = make_message_future();
    future->addCallback([lost, what](c10::ivalue::Future&) {
      lost->setError(std::make_exception_ptr(Error(ErrorKind::kTimeout, "the reply to " + what + " was lost by the faulty agent")));
    });
    return lost;
  }

 private:
  struct Delayed {
    WorkerInfo to;
    Message request;
    std::chrono::milliseconds timeout;
    CallName what;
    FuturePtr future;
  };

  void delay_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      if (delayed_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto next = delayed_.begin();
      const auto due = next->first;  // a copy: the node may be gone when the wait returns
      if (Clock::now() < due) {
        cv_.wait_until(lock, due);
        continue;
      }
      Delayed d = std::move(next->second);
      delayed_.erase(next);
      lock.unlock();
      try {
        FuturePtr real = inner_->send(d.to, std::move(d.request), d.timeout, d.what);
        forward_future(real, d.future);
      } catch (...) {
        d.future->setError(std::current_exception());
      }
      lock.lock();
      cv_.notify_all();
    }
  }

  // Draws whether a fault of probability table[type] happens. Called under mu_.
  bool chance(const std::map<int32_t, double>& table, int32_t type) {
    auto it = table.find(type);
    return it != table.end() && std::uniform_real_distribution<double>(0, 1)(random_) < it->second;
  }

  std::unique_ptr<RpcAgent> inner_;
  std::thread delayer_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  Faults faults_;
  std::mt19937_64 random_;
  std::multimap<Clock::time_point, Delayed> delayed_;
  int dropped_ = 0;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<RpcAgent> create_faulty_agent(std::unique_ptr<RpcAgent> inner, Faults faults) {
  return std::make_unique<FaultyAgent>(std::move(inner), std::move(faults));
}

}  // namespace drpc
