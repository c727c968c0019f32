#include "rref/control_channel.h"

#include <glog/logging.h>

#include <algorithm>
#include <string>

#include "common/error_wire.h"
#include "rref/message_types.h"
#include "rref/proto/rref.pb.h"

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

void ControlChannel::send(const Control& control) { queue(control, std::nullopt); }

void ControlChannel::send_carried(const Control& control, std::chrono::milliseconds window) {
  queue(control, window);
}

void ControlChannel::queue(const Control& control, std::optional<std::chrono::milliseconds> carry_window) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || gone_.count(control.to)) return;  // nobody there to tell
  ++in_flight_;
  Attempt a{control, 0};
  a.carried = carry_window.has_value();
  if (a.carried) ++carried_;
  // A carried control leaves alone once due, if nothing carried it before.
  schedule_locked(a, carry_window.value_or(std::chrono::milliseconds(0)));
}

std::vector<Control> ControlChannel::take_carried(int peer) {
  std::vector<Control> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return taken;
    for (auto it = waiting_.begin(); it != waiting_.end() && taken.size() < static_cast<size_t>(kMaxControlBatch);) {
      if (it->second.carried && it->second.control.to == peer) {
        taken.push_back(it->second.control);
        it = erase_waiting_locked(it);
        finished_locked();
      } else {
        ++it;
      }
    }
  }
  for (const Control& c : taken) done_(c, nullptr);
  return taken;
}

std::map<int64_t, ControlChannel::Attempt>::iterator ControlChannel::erase_waiting_locked(
    std::map<int64_t, Attempt>::iterator it) {
  if (it->second.carried) --carried_;
  return waiting_.erase(it);
}

void ControlChannel::schedule_locked(Attempt a, std::chrono::milliseconds delay) {
  const int64_t key = ++last_key_;
  a.due = delay.count() == 0;
  waiting_.emplace(key, a);
  std::weak_ptr<ControlChannel> weak = weak_from_this();
  if (a.due) {
    sends_.post([weak, key] {
      if (auto self = weak.lock()) self->send_waiting(key);
    });
  } else {
    executor_.run_after(delay, [weak, key] {
      if (auto self = weak.lock()) self->make_due(key);
    });
  }
}

void ControlChannel::make_due(int64_t key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiting_.find(key);
    if (it == waiting_.end() || stopped_) return;  // withdrawn
    it->second.due = true;
  }
  std::weak_ptr<ControlChannel> weak = weak_from_this();
  sends_.post([weak, key] {
    if (auto self = weak.lock()) self->send_waiting(key);
  });
}

void ControlChannel::send_waiting(int64_t key) {
  std::vector<Attempt> batch;
  int peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = waiting_.find(key);
    if (it == waiting_.end() || stopped_) return;  // withdrawn, or left in an earlier batch
    peer = it->second.control.to;
    if (busy_.count(peer)) return;  // leaves with the next batch, once the peer answers
    // Everything due for this peer, in the order it was made.
    for (it = waiting_.begin(); it != waiting_.end() && batch.size() < static_cast<size_t>(kMaxControlBatch);) {
      if (it->second.control.to == peer && it->second.due) {
        batch.push_back(it->second);
        batch.back().carried = false;  // a retry of it leaves alone
        it = erase_waiting_locked(it);
      } else {
        ++it;
      }
    }
    busy_.insert(peer);
  }
  send_batch(peer, std::move(batch));
}

void ControlChannel::send_batch(int peer, std::vector<Attempt> batch) {
  Message request;
  CallName what;
  if (batch.size() == 1) {
    rref::Control wire;
    to_proto(batch[0].control.rref, wire.mutable_rref());
    to_proto(batch[0].control.fork, wire.mutable_fork());
    request = Message{batch[0].control.type, wire.SerializeAsString(), {}};
    what = CallName("RRef control message", std::to_string(batch[0].control.type));
  } else {
    rref::ControlBatch wire;
    for (const Attempt& a : batch) add_to_batch(a.control, &wire);
    request = Message{kRRefControlBatch, wire.SerializeAsString(), {}};
    what = CallName("RRef control batch", "of " + std::to_string(batch.size()));
  }
  auto answer = [self = shared_from_this(), peer, batch](c10::ivalue::Future& done) {
    // The peer is free for the next batch first: whatever the outcomes' callbacks do (or
    // throw), controls queued for it meanwhile must not wait forever.
    self->batch_answered(peer);
    std::vector<std::exception_ptr> errors(batch.size(), done.hasError() ? done.exception_ptr() : nullptr);
    if (!done.hasError() && batch.size() > 1) {
      try {
        self->read_outcomes(peer, batch, done.constValue(), errors);
      } catch (const std::exception&) {  // the agent's reply was not a Message: each control failed with that
        std::fill(errors.begin(), errors.end(), std::current_exception());
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) self->sent(batch[i], errors[i]);
  };
  FuturePtr reply;
  try {
    reply = agent_.send(agent_.worker(peer), std::move(request), options_.control_timeout, std::move(what));
  } catch (const Error&) {
    auto failed = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    failed->setError(std::current_exception());
    answer(*failed);
    return;
  }
  reply->addCallback(std::move(answer));
}

void ControlChannel::read_outcomes(int peer, const std::vector<Attempt>& batch, const c10::IValue& reply_value,
                                   std::vector<std::exception_ptr>& errors) {
  rref::ControlOutcomes outcomes;
  const Message& reply = message_from_ivalue(reply_value);
  if (!outcomes.ParseFromString(reply.payload) || outcomes.outcomes_size() != static_cast<int>(batch.size())) {
    const auto malformed = std::make_exception_ptr(Error(
        ErrorKind::kProtocol, "malformed answer to a batch of " + std::to_string(batch.size()) + " RRef controls"));
    std::fill(errors.begin(), errors.end(), malformed);
  } else {
    const std::string owner = agent_.worker(peer).name;
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& outcome = outcomes.outcomes(static_cast<int>(i));
      if (outcome.error_kind() != wire::ERROR_KIND_NONE) {
        // Worded as a control sent alone fails (the agent's "rpc <what> on <peer> failed").
        errors[i] = std::make_exception_ptr(
            Error(from_wire(outcome.error_kind()), "rpc RRef control message " +
                                                       std::to_string(batch[i].control.type) + " on " + owner +
                                                       " failed: " + outcome.error()));
      }
    }
  }
}

void ControlChannel::batch_answered(int peer) {
  int64_t next = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_.erase(peer);
    if (stopped_) return;
    for (const auto& [key, a] : waiting_) {
      if (a.control.to == peer && a.due) {
        next = key;
        break;
      }
    }
  }
  if (next == 0) return;
  std::weak_ptr<ControlChannel> weak = weak_from_this();
  sends_.post([weak, next] {
    if (auto self = weak.lock()) self->send_waiting(next);
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
      it = erase_waiting_locked(it);
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
  carried_ = 0;
  idle_.notify_all();
}

}  // namespace rref_internal
}  // namespace drpc
