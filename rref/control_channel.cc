#include "rref/control_channel.h"

#include <glog/logging.h>

#include <algorithm>

namespace drpc {
namespace rref_internal {
namespace {

std::string describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
}

// Only a lost message is worth sending again: a gone peer will not come back, and an
// answer is an answer.
bool worth_retrying(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.kind() == ErrorKind::kTimeout;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::shared_ptr<ControlChannel> ControlChannel::create(RpcAgent& agent, Executor& executor, const RRefOptions& options,
                                                       Done done) {
  return std::shared_ptr<ControlChannel>(new ControlChannel(agent, executor, options, std::move(done)));
}

ControlChannel::ControlChannel(RpcAgent& agent, Executor& executor, const RRefOptions& options, Done done)
    : agent_(agent), executor_(executor), sends_(executor), options_(options), done_(std::move(done)) {}

void ControlChannel::send(const Control& control) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || gone_.count(control.to)) return;  // nobody there to tell
  ++in_flight_;
  schedule_locked(Attempt{control, 0}, std::chrono::milliseconds(0));
}

void ControlChannel::schedule_locked(Attempt a, std::chrono::milliseconds delay) {
  const int64_t key = ++last_key_;
  waiting_.emplace(key, a);
  std::weak_ptr<ControlChannel> weak = weak_from_this();
  auto send = [weak, key] {
    if (auto self = weak.lock()) self->send_waiting(key);
  };
  if (delay.count() == 0) {
    sends_.post(std::move(send));
  } else {
    executor_.run_after(delay, [weak, send = std::move(send)]() mutable {
      if (auto self = weak.lock()) self->sends_.post(std::move(send));
    });
  }
}

void ControlChannel::send_waiting(int64_t key) {
  Attempt a;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiting_.find(key);
    if (it == waiting_.end() || stopped_) return;  // withdrawn
    a = it->second;
    waiting_.erase(it);
  }
  rref::Control wire;
  to_proto(a.control.rref, wire.mutable_rref());
  to_proto(a.control.fork, wire.mutable_fork());
  FuturePtr reply;
  try {
    reply = agent_.send(agent_.worker(a.control.to), Message{a.control.type, wire.SerializeAsString(), {}},
                        options_.control_timeout, "RRef control message " + std::to_string(a.control.type));
  } catch (const Error&) {
    sent(a, std::current_exception());
    return;
  }
  auto self = shared_from_this();
  reply->addCallback([self, a](c10::ivalue::Future& done) {
    self->sent(a, done.hasError() ? done.exception_ptr() : nullptr);
  });
}

void ControlChannel::sent(Attempt a, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    if (error && a.attempt + 1 < options_.control_attempts && worth_retrying(error) && !gone_.count(a.control.to)) {
      ++a.attempt;
      schedule_locked(a, std::chrono::milliseconds(20) * (1 << std::min(a.attempt, 8)));
      return;
    }
    finished_locked();
  }
  if (error) {
    LOG(WARNING) << agent_.self().name << ": RRef control message " << a.control.type << " for "
                 << a.control.rref.str() << " gave up: " << describe(error);
  }
  done_(a.control, error);
}

void ControlChannel::finished_locked() {
  if (--in_flight_ == 0) idle_.notify_all();
}

void ControlChannel::peer_failed(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!gone_.insert(peer).second) return;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->second.control.to == peer) {
      it = waiting_.erase(it);
      finished_locked();
    } else {
      ++it;
    }
  }
}

bool ControlChannel::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_until(lock, deadline, [&] { return in_flight_ == 0 || stopped_; });
}

void ControlChannel::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  waiting_.clear();
  idle_.notify_all();
}

}  // namespace rref_internal
}  // namespace drpc
