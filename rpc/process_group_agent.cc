#include "rpc/process_group_agent.h"

#include <ATen/ops/tensor.h>
#include <glog/logging.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "rpc/proto/rpc.pb.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void put_autograd(const Message& m, rpc::Envelope* e) {
  if (m.autograd_context < 0) return;
  e->set_autograd_context(m.autograd_context + 1);
  e->set_autograd_message(m.autograd_message);
  for (bool r : m.requires_grad) e->add_requires_grad(r);
}

void take_autograd(const rpc::Envelope& e, Message* m) {
  if (e.autograd_context() == 0) return;
  m->autograd_context = e.autograd_context() - 1;
  m->autograd_message = e.autograd_message();
  m->requires_grad.assign(e.requires_grad().begin(), e.requires_grad().end());
}

class ProcessGroupAgent final : public RpcAgent {
 public:
  ProcessGroupAgent(ProcessGroup& group, std::vector<WorkerInfo> workers, const AgentOptions& options)
      : group_(group), workers_(std::move(workers)), options_(options) {
    if (static_cast<int>(workers_.size()) != group_.size()) {
      throw Error(ErrorKind::kBadArgument, "the agent needs one worker per rank");
    }
    self_ = workers_.at(group_.rank());
    group_.set_message_listener(MessageListener{
        [this](int source, PgMessage message) { on_message(source, std::move(message)); },
        [this](int rank, const Error& reason) { on_peer_failed(rank, reason); }});
    timer_ = std::thread([this] { timer_loop(); });
  }

  ~ProcessGroupAgent() override {
    shutdown(false);
    group_.set_message_listener(MessageListener{});
  }

  const WorkerInfo& self() const override { return self_; }

  WorkerInfo worker(const std::string& name) const override {
    for (const auto& w : workers_) {
      if (w.name == name) return w;
    }
    throw Error(ErrorKind::kBadArgument, "unknown worker '" + name + "'");
  }

  WorkerInfo worker(int id) const override {
    if (id < 0 || id >= static_cast<int>(workers_.size())) {
      throw Error(ErrorKind::kBadArgument, "unknown worker id " + std::to_string(id));
    }
    return workers_[id];
  }

  std::vector<WorkerInfo> workers() const override { return workers_; }
  milliseconds default_timeout() const override { return options_.default_timeout; }

  void register_handler(int32_t type, Handler handler, bool run_inline) override {
    handlers_[type] = std::move(handler);
    if (run_inline) inline_types_.insert(type);
  }
  void add_interceptor(Interceptor interceptor) override { interceptors_.push_back(std::move(interceptor)); }

  FuturePtr send(const WorkerInfo& to, Message request, milliseconds timeout, const std::string& what) override {
    const WorkerInfo dst = worker(to.id);
    for (auto& i : interceptors_) {
      if (i.on_send) i.on_send(dst, request);
    }
    auto future = make_message_future();
    const int64_t id = next_id_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) throw Error(ErrorKind::kShutdown, "the RPC agent of " + self_.name + " is shut down");
      Pending pending{future, dst.id, what, timeout, Clock::time_point::max()};
      if (timeout.count() > 0) {
        pending.deadline = Clock::now() + timeout;
        deadlines_.emplace(pending.deadline, id);
        if (deadlines_.begin()->second == id) timer_cv_.notify_all();
      }
      pending_.emplace(id, std::move(pending));
      if (dst.id != self_.id) ++requests_sent_;
    }
    if (dst.id == self_.id) {
      // A call to oneself skips the network but not the handler pool.
      schedule_request(self_.id, id, std::move(request));
      return future;
    }
    rpc::Envelope envelope;
    envelope.set_type(request.type);
    envelope.set_id(id);
    put_autograd(request, &envelope);
    envelope.set_payload(std::move(request.payload));
    try {
      WorkPtr work = group_.send_message(dst.id, PgMessage{envelope.SerializeAsString(), std::move(request.tensors)});
      work->on_completion([this, id](Work& w) {
        if (auto error = w.exception()) fail_pending(id, error);
      });
    } catch (const Error& e) {
      fail_pending(id, std::current_exception());
    }
    return future;
  }

  void run_on_pool(std::function<void()> task) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      queue_.push_back(std::move(task));
    }
    pool_cv_.notify_one();
  }

  void start() override {
    std::deque<std::pair<int, PgMessage>> held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_) return;
      started_ = true;
      held.swap(held_);
    }
    for (int i = 0; i < options_.num_threads; ++i) pool_.emplace_back([this] { pool_loop(); });
    for (auto& [source, message] : held) on_message(source, std::move(message));
  }

  void join() override {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        idle_cv_.wait(lock, [&] { return stopped_ || (pending_.empty() && processing_ == 0); });
        if (stopped_) return;
      }
      // Every request sent anywhere has been answered once the job-wide totals agree and
      // every worker was idle when it counted.
      at::Tensor counts;
      {
        std::lock_guard<std::mutex> lock(mu_);
        counts = at::tensor({requests_sent_, requests_answered_}, at::kLong);
      }
      group_.allreduce(counts, ReduceOp::kSum)->wait();
      if (counts[0].item<int64_t>() == counts[1].item<int64_t>()) return;
    }
  }

  void shutdown(bool graceful) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) return;
      shutting_down_ = true;
    }
    if (graceful) {
      try {
        join();
        group_.barrier()->wait(options_.default_timeout);
      } catch (const Error& e) {
        LOG(WARNING) << self_.name << ": graceful shutdown could not wait for the job: " << e.what();
      }
    }
    std::map<int64_t, Pending> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      pending.swap(pending_);
      deadlines_.clear();
    }
    pool_cv_.notify_all();
    timer_cv_.notify_all();
    idle_cv_.notify_all();
    auto error = std::make_exception_ptr(
        Error(ErrorKind::kShutdown, "the RPC agent of " + self_.name + " shut down before a reply came"));
    for (auto& [id, p] : pending) p.future->setErrorIfNeeded(error);
    for (auto& t : pool_) {
      if (t.joinable()) t.join();
    }
    if (timer_.joinable()) timer_.join();
  }

 private:
  struct Pending {
    FuturePtr future;
    int dst;
    std::string what;
    milliseconds timeout;
    Clock::time_point deadline;
  };

  // --- network threads -----------------------------------------------------------------
  void on_message(int source, PgMessage raw) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      if (!started_) {
        held_.emplace_back(source, std::move(raw));
        return;
      }
    }
    rpc::Envelope envelope;
    if (!envelope.ParseFromString(raw.header)) {
      LOG(ERROR) << self_.name << ": dropping a malformed message from " << workers_[source].name;
      return;
    }
    Message message{envelope.type(), std::move(*envelope.mutable_payload()), std::move(raw.tensors)};
    take_autograd(envelope, &message);
    for (auto& i : interceptors_) {
      if (i.on_receive) i.on_receive(workers_[source], message);
    }
    if (!envelope.is_response()) {
      schedule_request(source, envelope.id(), std::move(message));
      return;
    }
    Pending pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(envelope.id());
      if (it == pending_.end()) return;  // timed out already: the late reply is dropped
      pending = std::move(it->second);
      pending_.erase(it);
      if (pending.deadline != Clock::time_point::max()) erase_deadline(pending.deadline, envelope.id());
    }
    idle_cv_.notify_all();
    if (envelope.error_kind() != 0) {
      const auto kind = static_cast<ErrorKind>(
          std::min<int>(envelope.error_kind() - 1, static_cast<int>(ErrorKind::kInternal)));
      pending.future->setErrorIfNeeded(std::make_exception_ptr(
          Error(kind, "rpc " + pending.what + " on " + workers_[source].name + " failed: " + envelope.error())));
    } else {
      pending.future->markCompleted(message_to_ivalue(std::move(message)));
    }
  }

  void on_peer_failed(int rank, const Error& reason) {
    std::vector<Pending> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.dst == rank) {
          if (it->second.deadline != Clock::time_point::max()) erase_deadline(it->second.deadline, it->first);
          failed.push_back(std::move(it->second));
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    idle_cv_.notify_all();
    for (auto& p : failed) {
      p.future->setErrorIfNeeded(std::make_exception_ptr(
          Error(ErrorKind::kPeerUnavailable, "rpc " + p.what + " to " + workers_[rank].name + " failed: " +
                                                 workers_[rank].name + " is unavailable (" + reason.message() + ")")));
    }
  }

  // --- handler threads -----------------------------------------------------------------
  void schedule_request(int source, int64_t id, Message request) {
    const bool run_inline = inline_types_.count(request.type) > 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      ++processing_;
      if (run_inline) {
        // falls through to serve() below, outside the lock
      } else {
      queue_.push_back([this, source, id, request = std::move(request)]() mutable {
        serve(source, id, std::move(request));
      });
      }
    }
    if (run_inline) {
      serve(source, id, std::move(request));
      return;
    }
    pool_cv_.notify_one();
  }

  void serve(int source, int64_t id, Message request) {
    const int64_t autograd_context = request.autograd_context;
    FuturePtr reply;
    auto handler = handlers_.find(request.type);
    if (handler == handlers_.end()) {
      reply = make_message_future();
      reply->setError(std::make_exception_ptr(
          Error(ErrorKind::kBadArgument, self_.name + " has no handler for message type " + std::to_string(request.type))));
    } else {
      try {
        reply = handler->second(workers_[source], std::move(request));
      } catch (...) {
        reply = make_message_future();
        reply->setError(std::current_exception());
      }
    }
    // The reply goes out when the future completes, whichever thread completes it.
    reply->addCallback([this, source, id, autograd_context](c10::ivalue::Future& done) {
      answer(source, id, done, autograd_context);
    });
  }

  // The reply belongs to the request's autograd context, whichever thread sends it.
  void answer(int source, int64_t id, c10::ivalue::Future& done, int64_t autograd_context) {
    rpc::Envelope envelope;
    envelope.set_id(id);
    envelope.set_is_response(true);
    Message reply;
    if (done.hasError()) {
      try {
        std::rethrow_exception(done.exception_ptr());
      } catch (const Error& e) {
        envelope.set_error_kind(1 + static_cast<int>(e.kind()));
        envelope.set_error(e.message());
      } catch (const std::exception& e) {
        envelope.set_error_kind(1 + static_cast<int>(ErrorKind::kRemote));
        envelope.set_error(e.what());
      }
    } else {
      reply = message_from_ivalue(done.value());
      envelope.set_type(reply.type);
      if (reply.autograd_context < 0) reply.autograd_context = autograd_context;
    }
    if (source == self_.id) {
      deliver_local_reply(id, envelope, std::move(reply));
    } else {
      for (auto& i : interceptors_) {
        if (i.on_send) i.on_send(workers_[source], reply);
      }
      put_autograd(reply, &envelope);
      envelope.set_payload(std::move(reply.payload));
      try {
        group_.send_message(source, PgMessage{envelope.SerializeAsString(), std::move(reply.tensors)});
      } catch (const Error& e) {
        LOG(WARNING) << self_.name << ": cannot answer " << workers_[source].name << ": " << e.what();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --processing_;
      if (source != self_.id) ++requests_answered_;
    }
    idle_cv_.notify_all();
  }

  void deliver_local_reply(int64_t id, const rpc::Envelope& envelope, Message reply) {
    Pending pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      pending = std::move(it->second);
      pending_.erase(it);
      if (pending.deadline != Clock::time_point::max()) erase_deadline(pending.deadline, id);
    }
    if (envelope.error_kind() != 0) {
      const auto kind = static_cast<ErrorKind>(envelope.error_kind() - 1);
      pending.future->setErrorIfNeeded(std::make_exception_ptr(
          Error(kind, "rpc " + pending.what + " on " + self_.name + " failed: " + envelope.error())));
    } else {
      pending.future->markCompleted(message_to_ivalue(std::move(reply)));
    }
  }

  void pool_loop() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        pool_cv_.wait(lock, [&] { return stopped_ || !queue_.empty(); });
        if (stopped_) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  // --- deadlines -------------------------------------------------------------------------
  void erase_deadline(Clock::time_point deadline, int64_t id) {
    auto range = deadlines_.equal_range(deadline);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == id) {
        deadlines_.erase(it);
        return;
      }
    }
  }

  void timer_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      if (deadlines_.empty()) {
        timer_cv_.wait(lock);
        continue;
      }
      const auto next = deadlines_.begin()->first;
      if (Clock::now() < next) {
        timer_cv_.wait_until(lock, next);
        continue;
      }
      const int64_t id = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      auto it = pending_.find(id);
      if (it == pending_.end()) continue;
      Pending p = std::move(it->second);
      pending_.erase(it);
      lock.unlock();
      idle_cv_.notify_all();
      p.future->setErrorIfNeeded(std::make_exception_ptr(
          Error(ErrorKind::kTimeout, "rpc " + p.what + " to " + workers_[p.dst].name + " timed out after " +
                                         std::to_string(p.timeout.count()) + " ms")));
      lock.lock();
    }
  }

  void fail_pending(int64_t id, std::exception_ptr error) {
    Pending p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      p = std::move(it->second);
      pending_.erase(it);
      if (p.deadline != Clock::time_point::max()) erase_deadline(p.deadline, id);
    }
    idle_cv_.notify_all();
    std::string why;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      why = e.what();
    }
    p.future->setErrorIfNeeded(std::make_exception_ptr(
        Error(ErrorKind::kPeerUnavailable, "rpc " + p.what + " to " + workers_[p.dst].name + " could not be sent: " + why)));
  }

  ProcessGroup& group_;
  const std::vector<WorkerInfo> workers_;
  const AgentOptions options_;
  WorkerInfo self_;
  std::map<int32_t, Handler> handlers_;       // set before start()
  std::set<int32_t> inline_types_;            // set before start()
  std::vector<Interceptor> interceptors_;     // set before start()
  std::atomic<int64_t> next_id_{1};
  std::thread timer_;
  std::vector<std::thread> pool_;

  std::mutex mu_;
  std::condition_variable pool_cv_;
  std::condition_variable timer_cv_;
  std::condition_variable idle_cv_;
  // Guarded by mu_.
  bool started_ = false;
  bool shutting_down_ = false;
  bool stopped_ = false;
  std::map<int64_t, Pending> pending_;
  std::multimap<Clock::time_point, int64_t> deadlines_;
  std::deque<std::function<void()>> queue_;
  std::deque<std::pair<int, PgMessage>> held_;
  int64_t processing_ = 0;
  int64_t requests_sent_ = 0;
  int64_t requests_answered_ = 0;
};

}  // namespace

std::unique_ptr<RpcAgent> create_process_group_agent(ProcessGroup& group, std::vector<WorkerInfo> workers,
                                                     const AgentOptions& options) {
  return std::make_unique<ProcessGroupAgent>(group, std::move(workers), options);
}

}  // namespace drpc
