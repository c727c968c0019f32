#include "rref/rref_context.h"

#include <glog/logging.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "rref/control_channel.h"
#include "rref/proto/rref.pb.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using rref_internal::Control;
using rref_internal::ControlChannel;
using rref_internal::from_proto;
using rref_internal::Id;
using rref_internal::to_proto;

FuturePtr any_future() { return c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get()); }

FuturePtr completed_message(Message m) {
  auto f = make_message_future();
  f->markCompleted(message_to_ivalue(std::move(m)));
  return f;
}

// Completes as `reply` does, or with `creation`'s error as soon as it has one.
FuturePtr unless_failed(const FuturePtr& reply, const FuturePtr& creation) {
  auto out = any_future();
  auto once = std::make_shared<std::atomic<bool>>(false);
  reply->addCallback([out, once](c10::ivalue::Future& done) {
    if (once->exchange(true)) return;
    if (done.hasError()) {
      out->setError(done.exception_ptr());
    } else {
      out->markCompleted(done.value());
    }
  });
  creation->addCallback([out, once](c10::ivalue::Future& done) {
    if (done.hasError() && !once->exchange(true)) out->setError(done.exception_ptr());
  });
  return out;
}

// Waits for `future` up to `timeout` (<= 0: forever); throws kTimeout naming `what`.
void wait_for(const FuturePtr& future, milliseconds timeout, const std::string& what) {
  if (timeout.count() <= 0) {
    future->wait();
    return;
  }
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto waiter = std::make_shared<Waiter>();
  future->addCallback([waiter](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(waiter->mu);
    waiter->done = true;
    waiter->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(waiter->mu);
  if (!waiter->cv.wait_for(lock, timeout, [&] { return waiter->done; })) {
    throw Error(ErrorKind::kTimeout, what + " timed out after " + std::to_string(timeout.count()) + " ms");
  }
}

// Every RRef inside `value`, recursively.
void collect_rrefs(const c10::IValue& value, std::vector<c10::intrusive_ptr<RRefImpl>>* out) {
  if (value.isRRef()) {
    if (auto impl = intrusive_cast<RRefImpl>(value.toRRef())) out->push_back(impl);
  } else if (value.isList()) {
    for (const auto& v : value.toListRef()) collect_rrefs(v, out);
  } else if (value.isTuple()) {
    for (const auto& v : value.toTupleRef().elements()) collect_rrefs(v, out);
  } else if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict()) collect_rrefs(e.value(), out);
  }
}

class ContextImpl;

class OwnerRRef final : public RRefImpl {
 public:
  OwnerRRef(std::shared_ptr<ContextImpl> context, Id id, WorkerInfo self);
  // Runs when the last strong reference goes while the context's weak index still
  // points here; the object itself lives on until the index lets go. Without weak
  // references c10 skips it and only destroys the object: both paths release once.
  void release_resources() override { release(); }
  ~OwnerRRef() override { release(); }
  void release();

  c10::worker_id_t owner() const override { return static_cast<c10::worker_id_t>(self_.id); }
  std::string ownerName() const override { return self_.name; }
  bool isOwner() const override { return true; }
  bool confirmedByOwner() const override { return true; }
  const c10::TypePtr type() const override { return c10::AnyType::get(); }
  std::string id_string() const override { return id_.str(); }

  c10::IValue to_here(milliseconds timeout) override {
    wait_for(value_, timeout, "to_here of RRef " + id_.str());
    return value_->value();  // rethrows a failed creation
  }
  c10::IValue local_value() override { return to_here(milliseconds(0)); }
  FuturePtr confirmation() override {
    auto f = any_future();
    f->markCompleted(c10::IValue());
    return f;
  }
  FuturePtr call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                          milliseconds timeout) override;
  RRef remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                       milliseconds timeout) override;

  const Id& id() const { return id_; }
  const FuturePtr& value_future() const { return value_; }
  // The value is given once, by make_local or by the one remote call naming this id;
  // false if it already was (a peer repeated an id: completing twice would throw).
  bool claim_value() { return !value_claimed_.exchange(true); }
  // The first of the value and the errors that race for it (the function's result, a
  // creation timeout, a gone creator, shutdown) wins; the others are dropped.
  void set_value(c10::IValue value) {
    if (!settled_.exchange(true)) value_->markCompleted(std::move(value));
  }
  void set_error(std::exception_ptr error) {
    if (!settled_.exchange(true)) value_->setError(std::move(error));
  }

 private:
  std::weak_ptr<ContextImpl> context_;
  const Id id_;
  const WorkerInfo self_;
  FuturePtr value_ = any_future();
  std::atomic<bool> released_{false};
  std::atomic<bool> value_claimed_{false};
  std::atomic<bool> settled_{false};
};

class UserRRef final : public RRefImpl {
 public:
  UserRRef(std::shared_ptr<ContextImpl> context, Id rref, Id fork, WorkerInfo owner);
  ~UserRRef() override;

  c10::worker_id_t owner() const override { return static_cast<c10::worker_id_t>(owner_.id); }
  std::string ownerName() const override { return owner_.name; }
  bool isOwner() const override { return false; }
  // A failed or timed-out creation completes the confirmation with its error.
  bool confirmedByOwner() const override { return confirmed_->completed() && !confirmed_->hasError(); }
  const c10::TypePtr type() const override { return c10::AnyType::get(); }
  std::string id_string() const override { return rref_.str(); }

  c10::IValue to_here(milliseconds timeout) override;
  c10::IValue local_value() override {
    throw Error(ErrorKind::kBadArgument, "local_value() of RRef " + rref_.str() + " on " + self_name_ +
                                             ", which is not its owner (" + owner_.name + " is)");
  }
  FuturePtr confirmation() override { return confirmed_; }
  FuturePtr call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                          milliseconds timeout) override;
  RRef remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                       milliseconds timeout) override;

  const Id& rref() const { return rref_; }
  const Id& fork() const { return fork_; }
  const WorkerInfo& owner_info() const { return owner_; }
  // Why this reference can never be used (its creation failed or timed out, the owner
  // refused the fork), or null.
  std::exception_ptr unusable() const {
    return confirmed_->completed() && confirmed_->hasError() ? confirmed_->exception_ptr() : nullptr;
  }
  void check_usable() const {
    if (auto error = unusable()) std::rethrow_exception(error);
  }
  const FuturePtr& confirmation_future() const { return confirmed_; }

 private:
  std::weak_ptr<ContextImpl> context_;
  const Id rref_;
  const Id fork_;
  const WorkerInfo owner_;
  const std::string self_name_;
  FuturePtr confirmed_ = any_future();
};

class ContextImpl final : public RRefContext, public std::enable_shared_from_this<ContextImpl> {
 public:
  ContextImpl(RpcAgent& agent, Executor& executor, Run run, Apply apply, const RRefOptions& options)
      : agent_(agent),
        executor_(executor),
        run_(std::move(run)),
        apply_(std::move(apply)),
        options_(options) {}

  ~ContextImpl() override { shutdown(); }

  void install() {
    auto handler = [this](auto method) {
      return [this, method](const WorkerInfo& from, Message m) { return (this->*method)(from, std::move(m)); };
    };
    // The protocol's handlers never block (user functions are handed to the pool), so
    // they run inline: the protocol keeps moving even when every handler thread is busy
    // with a function that waits on an RRef.
    agent_.register_handler(kRRefRemoteCall, handler(&ContextImpl::on_remote_call), true);
    agent_.register_handler(kRRefFetch, handler(&ContextImpl::on_fetch), true);
    agent_.register_handler(kRRefUserDelete, handler(&ContextImpl::on_user_delete), true);
    agent_.register_handler(kRRefForkRequest, handler(&ContextImpl::on_fork_request), true);
    agent_.register_handler(kRRefChildAccept, handler(&ContextImpl::on_child_accept), true);
    agent_.register_handler(kRRefApply, handler(&ContextImpl::on_apply), true);
    agent_.add_peer_failure_listener([this](const WorkerInfo& peer, const Error& reason) {
      on_peer_failed(peer, reason);
    });
    std::weak_ptr<ContextImpl> weak = weak_from_this();
    controls_ = ControlChannel::create(agent_, executor_, options_, [weak](const Control& c, std::exception_ptr error) {
      if (auto self = weak.lock()) self->control_done(c, error);
    });
  }

  // --- RRefContext ----------------------------------------------------------------------
  RRef remote(const WorkerInfo& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
              milliseconds timeout) override {
    return remote_impl(to, fn, std::move(args), std::move(kwargs), timeout, nullptr);
  }

  RRef make_local(c10::IValue value) override {
    auto owner = new_owner(next_id());
    owner->claim_value();
    owner->set_value(std::move(value));
    return RRef(owner);
  }

  ValueHooks hooks(int peer) override {
    ValueHooks hooks;
    auto self = shared_from_this();
    hooks.encode_custom = [self, peer](const c10::IValue& value, std::string* bytes) {
      if (!value.isRRef()) return false;
      auto impl = intrusive_cast<RRefImpl>(value.toRRef());
      if (!impl) throw Error(ErrorKind::kBadArgument, "an RRef of another RPC framework cannot be sent");
      *bytes = self->fork(impl, peer).SerializeAsString();
      return true;
    };
    hooks.decode_custom = [self, peer](const std::string& bytes) {
      rref::ForkData data;
      if (!data.ParseFromString(bytes)) throw Error(ErrorKind::kProtocol, "malformed RRef");
      return self->accept(data, peer);
    };
    return hooks;
  }

  FuturePtr confirmations(const std::vector<c10::IValue>& values) override {
    std::vector<c10::intrusive_ptr<RRefImpl>> rrefs;
    for (const auto& v : values) collect_rrefs(v, &rrefs);
    auto all = any_future();
    auto left = std::make_shared<std::atomic<int>>(static_cast<int>(rrefs.size()) + 1);
    auto one_done = [all, left](c10::ivalue::Future&) {
      if (left->fetch_sub(1) == 1) all->markCompleted(c10::IValue());
    };
    for (auto& r : rrefs) r->confirmation()->addCallback(one_done);
    one_done(*all);  // the +1
    return all;
  }

  RRefCounts counts() override {
    std::lock_guard<std::mutex> lock(mu_);
    RRefCounts c;
    c.owners = static_cast<int64_t>(owners_.size());
    c.owner_values = live_owner_values_;
    c.pending_children = static_cast<int64_t>(pending_children_.size());
    for (const auto& [fork, user] : users_) {
      if (user.alive && !user.released) ++c.users;
      if (!user.confirmed) ++c.pending_users;
    }
    return c;
  }

  void release_all(milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mu_);
    auto settled = [&] {
      if (!pending_children_.empty()) return false;
      for (const auto& [fork, user] : users_) {
        if (!user.confirmed) return false;
      }
      return true;
    };
    if (!changed_.wait_until(lock, deadline, settled)) {
      LOG(WARNING) << agent_.self().name << ": leaving with " << pending_children_.size()
                   << " RRef forks the owners never confirmed";
    }
    // Delete every remaining user reference now; their handles become inert.
    for (auto it = users_.begin(); it != users_.end();) {
      UserState& user = it->second;
      if (!user.released && user.confirmed) {
        user.released = true;
        send_control_locked(user.owner, kRRefUserDelete, user.rref, it->first);
      }
      it = user.alive ? std::next(it) : users_.erase(it);
    }
    lock.unlock();
    controls_->wait_idle(deadline);
  }

  std::vector<std::string> leaks() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [id, owner] : owners_) {
      std::string forks;
      for (const auto& [f, holder] : forks_[id]) forks += (forks.empty() ? "" : ", ") + f.str();
      out.push_back("RRef " + id.str() + " still referenced by forks " + forks);
    }
    return out;
  }

  void shutdown() override {
    std::map<Id, c10::intrusive_ptr<OwnerRRef>> owners;  // released outside the lock
    std::vector<c10::intrusive_ptr<OwnerRRef>> unresolved;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      controls_->stop();
      // Owner records and the replies waiting on their values refer back to this
      // context: break those cycles, or the context and every value it owns would
      // outlive the runtime.
      owners.swap(owners_);
      forks_.clear();
      for (auto& [id, weak] : all_owners_) {
        if (auto owner = weak.lock()) unresolved.push_back(std::move(owner));
      }
    }
    changed_.notify_all();
    const auto stopped = std::make_exception_ptr(Error(ErrorKind::kShutdown, self().name + " has shut down"));
    for (auto& owner : unresolved) owner->set_error(stopped);
  }

  // --- used by the RRef objects ---------------------------------------------------------
  const WorkerInfo& self() const { return agent_.self(); }

  void owner_created() {
    std::lock_guard<std::mutex> lock(mu_);
    ++live_owner_values_;
  }
  void owner_destroyed(const Id& id) {
    std::lock_guard<std::mutex> lock(mu_);
    --live_owner_values_;
    auto it = all_owners_.find(id);
    if (it != all_owners_.end() && it->second.expired()) all_owners_.erase(it);
  }

  void user_created(const Id& rref, const Id& fork, int owner, FuturePtr confirmation) {
    std::lock_guard<std::mutex> lock(mu_);
    users_[fork] = UserState{rref, owner, std::move(confirmation)};
  }

  // The last handle of a user reference on this worker is gone: tell the owner, once it
  // knows of the fork (deleting an unconfirmed fork could free the value too early).
  void user_destroyed(const Id& fork) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = users_.find(fork);
    if (it == users_.end()) return;
    UserState& user = it->second;
    user.alive = false;
    if (user.released) {
      users_.erase(it);  // release_all already deleted it
    } else if (user.confirmed) {
      send_control_locked(user.owner, kRRefUserDelete, user.rref, fork);
      users_.erase(it);
    }  // else: deleted when the owner confirms it
    changed_.notify_all();
  }

  c10::IValue fetch(const UserRRef& user, milliseconds timeout) {
    check_owner_alive(user.owner_info(), user.rref());
    if (timeout.count() < 0) timeout = agent_.default_timeout();
    rref::Control control;
    to_proto(user.rref(), control.mutable_rref());
    user.check_usable();
    FuturePtr reply = agent_.send(user.owner_info(), Message{kRRefFetch, control.SerializeAsString(), {}}, timeout,
                                  CallName{"to_here of RRef", user.rref().str()});
    // A fetch waiting on a creation that then times out fails with it, not at its own
    // (maybe much later) deadline.
    reply = unless_failed(reply, user.confirmation_future());
    reply->wait();
    return decode_result(message_from_ivalue(reply->value()), hooks(user.owner_info().id), "to_here reply");
  }

  FuturePtr apply_remote(const WorkerInfo& owner, const Id& rref, const std::string& fn,
                         std::vector<c10::IValue> args, Kwargs kwargs, milliseconds timeout) {
    check_owner_alive(owner, rref);
    if (timeout.count() < 0) timeout = agent_.default_timeout();
    rref::RemoteCall call;
    to_proto(rref, call.mutable_rref());
    Message m{kRRefApply, "", {}};
    encode_call(fn, args, kwargs, hooks(owner.id), call.mutable_call(), &m.tensors);
    m.payload = call.SerializeAsString();
    FuturePtr reply = agent_.send(owner, std::move(m), timeout, CallName{fn + " on RRef", rref.str()});
    auto self = shared_from_this();
    const int peer = owner.id;
    // Handed to the user (RRef::rpc_async): completed off the network thread.
    return complete_on_callback_thread(agent_, reply, [self, peer](const c10::IValue& done) {
      return decode_result(message_from_ivalue(done), self->hooks(peer));
    });
  }

  FuturePtr apply_local(const FuturePtr& value, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                        Extensions caller) {
    auto self = shared_from_this();
    auto result = any_future();
    after_on_pool(agent_, value,
                  [self, value, result, fn, args = std::move(args), kwargs = std::move(kwargs), caller = std::move(caller)]() {
      if (value->hasError()) {
        result->setError(value->exception_ptr());
        return;
      }
      FuturePtr out = self->apply_(value->value(), fn, args, kwargs, caller);
      forward_future(out, result);
    });
    return result;
  }

  RRef remote_impl(const WorkerInfo& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                   milliseconds timeout, const Id* apply_to) {
    if (timeout.count() < 0) timeout = agent_.default_timeout();
    rref::RemoteCall call;
    if (apply_to) to_proto(*apply_to, call.mutable_apply_to());
    Message m{kRRefRemoteCall, "", {}};
    encode_call(fn, args, kwargs, hooks(to.id), call.mutable_call(), &m.tensors);
    c10::intrusive_ptr<RRefImpl> handle;
    c10::intrusive_ptr<UserRRef> user;
    c10::weak_intrusive_ptr<OwnerRRef> own(c10::intrusive_ptr<OwnerRRef>{});
    Id rref;
    FuturePtr ack;
    {
      // Ids go out in the order they were taken, so an owner that saw this worker's
      // remote call k knows no call below k is still coming (get_or_create_owner).
      std::lock_guard<std::mutex> lock(remote_mu_);
      rref = next_id();
      to_proto(rref, call.mutable_rref());
      if (to.id == self().id) {
        auto owner = new_owner(rref);  // remote to oneself: this worker owns the result
        own = c10::weak_intrusive_ptr<OwnerRRef>(owner);
        handle = owner;
      } else {
        const Id fork = next_id();
        to_proto(fork, call.mutable_fork());
        user = c10::make_intrusive<UserRRef>(shared_from_this(), rref, fork, to);
        handle = user;
      }
      m.payload = call.SerializeAsString();
      // Replied to once the function has finished on the owner: the deadline covers it.
      ack = agent_.send(to, std::move(m), timeout, "remote " + fn);
    }
    auto self = shared_from_this();
    const Id fork = user ? user->fork() : Id{};
    const bool is_user = user.defined();
    const std::string what = "RRef " + rref.str() + " (remote " + fn + " on " + to.name + ")";
    ack->addCallback([self, is_user, fork, own, what](c10::ivalue::Future& done) {
      std::exception_ptr failure = done.hasError() ? creation_failure(what, done.exception_ptr()) : nullptr;
      if (is_user) {
        self->confirmed(fork, failure);  // on failure too: the owner may hold the fork, so it is deleted
      } else if (failure) {
        if (auto owner = own.lock()) owner->set_error(failure);
      }
    });
    return RRef(handle);
  }

  // Every later use of an RRef whose creation failed raises this: the same kind, saying so.
  static std::exception_ptr creation_failure(const std::string& what, std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      const char* how = e.kind() == ErrorKind::kTimeout ? " timed out: " : " failed: ";
      return std::make_exception_ptr(Error(e.kind(), "the creation of " + what + how + e.message()));
    } catch (const std::exception& e) {
      return std::make_exception_ptr(Error(ErrorKind::kInternal, "the creation of " + what + " failed: " + e.what()));
    }
  }

 private:
  // --- forks ----------------------------------------------------------------------------
  // Describes `impl` for `peer` and records what the protocol needs until it arrives.
  rref::ForkData fork(const c10::intrusive_ptr<RRefImpl>& impl, int peer) {
    rref::ForkData data;
    data.set_parent(self().id);
    if (auto owner = intrusive_cast<OwnerRRef>(impl)) {
      to_proto(owner->id(), data.mutable_rref());
      data.set_owner(self().id);
      if (peer != self().id) {
        const Id fork = next_id();
        to_proto(fork, data.mutable_fork());
        std::lock_guard<std::mutex> lock(mu_);
        owners_[owner->id()] = owner;  // the owner shares: the fork is known at once
        forks_[owner->id()].emplace(fork, peer);
      }
      return data;
    }
    auto user = intrusive_cast<UserRRef>(impl);
    user->check_usable();
    to_proto(user->rref(), data.mutable_rref());
    data.set_owner(user->owner_info().id);
    const Id fork = next_id();
    to_proto(fork, data.mutable_fork());
    std::lock_guard<std::mutex> lock(mu_);
    // Keep this reference alive until the owner has confirmed the child.
    pending_children_[fork] = PendingChild{impl, peer};
    return data;
  }

  // An RRef arrived from `peer`.
  c10::IValue accept(const rref::ForkData& data, int peer) {
    const Id rref = from_proto(data.rref());
    const Id fork = from_proto(data.fork());
    if (data.owner() == self().id) {
      auto owner = find_owner(rref);
      if (!owner) throw Error(ErrorKind::kProtocol, "RRef " + rref.str() + " is not owned here");
      // A user shared it back with its owner: the sender may let go of its reference.
      if (data.parent() != self().id && data.has_fork()) {
        std::lock_guard<std::mutex> lock(mu_);
        send_control_locked(data.parent(), kRRefChildAccept, rref, fork);
      }
      return c10::IValue(c10::intrusive_ptr<c10::RRefInterface>(owner));
    }
    const WorkerInfo owner = agent_.worker(data.owner());
    auto user = c10::make_intrusive<UserRRef>(shared_from_this(), rref, fork, owner);
    if (data.parent() == data.owner()) {
      confirmed(fork);  // the owner recorded the fork before sending it
    } else {
      // Ask the owner to record it; the parent learns once the owner has.
      std::lock_guard<std::mutex> lock(mu_);
      fork_parents_[fork] = data.parent();
      send_control_locked(owner.id, kRRefForkRequest, rref, fork);
    }
    (void)peer;
    return c10::IValue(c10::intrusive_ptr<c10::RRefInterface>(user));
  }

  // The owner knows of `fork` now (or its creation failed, `error`: then the owner may or
  // may not know, and a later delete is harmless either way).
  void confirmed(const Id& fork, std::exception_ptr error = nullptr) {
    FuturePtr confirmation;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto parent = fork_parents_.find(fork);
      if (parent != fork_parents_.end()) {
        send_control_locked(parent->second, kRRefChildAccept, Id{}, fork);
        fork_parents_.erase(parent);
      }
      auto it = users_.find(fork);
      if (it != users_.end()) {
        confirmation = it->second.confirmation;
        // Decided under the lock: user_destroyed() reads it to choose who sends the delete.
        it->second.confirmed = true;
        if (!it->second.alive) {
          if (!it->second.released) send_control_locked(it->second.owner, kRRefUserDelete, it->second.rref, fork);
          users_.erase(it);
        }
      }
    }
    if (confirmation && error) {
      confirmation->setErrorIfNeeded(error);
    } else if (confirmation && !confirmation->completed()) {
      confirmation->markCompleted(c10::IValue());
    }
    changed_.notify_all();
  }

  // --- owner side handlers --------------------------------------------------------------
  FuturePtr on_remote_call(const WorkerInfo& from, Message m) {
    rref::RemoteCall call;
    if (!call.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed remote call");
    const Id rref = from_proto(call.rref());
    auto owner = owner_for_remote_call(rref, from);
    if (!owner->claim_value()) {
      throw Error(ErrorKind::kProtocol, "remote call for RRef " + rref.str() + ", which already has a value");
    }
    if (call.has_fork()) {
      std::lock_guard<std::mutex> lock(mu_);
      owners_[rref] = owner;
      forks_[rref].emplace(from_proto(call.fork()), from.id);
    }
    std::vector<c10::IValue> args;
    Kwargs kwargs;
    decode_call(call.call(), m.tensors, hooks(from.id), &args, &kwargs);
    const std::string fn = call.call().function();
    // Run once every RRef among the arguments is confirmed. The reply goes out when the
    // value exists (or failed): the caller's deadline covers the creation, and its RRef
    // is confirmed only by a creation that succeeded.
    auto self = shared_from_this();
    Extensions caller = m.extensions;
    auto created = owner->value_future()->then(
        [](c10::ivalue::Future& done) {
          done.value();  // rethrows the creation's error
          return message_to_ivalue(Message{kRRefRemoteCall, "", {}});
        },
        c10::AnyType::get());
    FuturePtr source;
    if (call.has_apply_to()) {
      auto target = find_owner(from_proto(call.apply_to()));
      if (!target) {
        owner->set_error(std::make_exception_ptr(
            Error(ErrorKind::kBadArgument, "RRef " + from_proto(call.apply_to()).str() + " is not owned by " + self->self().name)));
        return created;
      }
      source = target->value_future();
    }
    after_on_pool(agent_, confirmations(args), [self, owner, fn, args, kwargs, source, caller]() mutable {
      FuturePtr result = source ? self->apply_local(source, fn, std::move(args), std::move(kwargs), caller)
                                : self->run_(fn, std::move(args), std::move(kwargs), caller);
      result->addCallback([owner](c10::ivalue::Future& r) {
        if (r.hasError()) {
          owner->set_error(r.exception_ptr());
        } else {
          owner->set_value(r.value());
        }
      });
    });
    return created;
  }

  FuturePtr on_fetch(const WorkerInfo& from, Message m) {
    rref::Control control;
    if (!control.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed fetch");
    auto owner = get_or_create_owner(from_proto(control.rref()), from);
    return reply_with_value(owner->value_future(), kRRefFetch, from.id);
  }

  FuturePtr on_apply(const WorkerInfo& from, Message m) {
    rref::RemoteCall call;
    if (!call.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed RRef call");
    auto owner = get_or_create_owner(from_proto(call.rref()), from);
    std::vector<c10::IValue> args;
    Kwargs kwargs;
    decode_call(call.call(), m.tensors, hooks(from.id), &args, &kwargs);
    FuturePtr result = apply_local(owner->value_future(), call.call().function(), std::move(args), std::move(kwargs),
                                   m.extensions);
    return reply_with_value(result, kRRefApply, from.id);
  }

  FuturePtr reply_with_value(const FuturePtr& value, int32_t type, int peer) {
    auto self = shared_from_this();
    return value->then(
        [self, type, peer](c10::ivalue::Future& done) {
          return message_to_ivalue(encode_result(type, done.value(), "RRef value", self->hooks(peer)));
        },
        c10::AnyType::get());
  }

  FuturePtr on_user_delete(const WorkerInfo&, Message m) {
    rref::Control control;
    if (!control.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed delete");
    const Id rref = from_proto(control.rref());
    c10::intrusive_ptr<OwnerRRef> dropped;  // released outside the lock
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto forks = forks_.find(rref);
      if (forks != forks_.end()) {
        forks->second.erase(from_proto(control.fork()));  // a repeated delete changes nothing
        if (forks->second.empty()) {
          forks_.erase(forks);
          auto owner = owners_.find(rref);
          if (owner != owners_.end()) {
            dropped = std::move(owner->second);
            owners_.erase(owner);
          }
        }
      }
    }
    return completed_message(Message{kRRefUserDelete, "", {}});
  }

  FuturePtr on_fork_request(const WorkerInfo& from, Message m) {
    rref::Control control;
    if (!control.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed fork request");
    const Id rref = from_proto(control.rref());
    auto owner = get_or_create_owner(rref, from);
    std::lock_guard<std::mutex> lock(mu_);
    owners_[rref] = owner;
    forks_[rref].emplace(from_proto(control.fork()), from.id);  // idempotent
    return completed_message(Message{kRRefForkRequest, "", {}});
  }

  FuturePtr on_child_accept(const WorkerInfo&, Message m) {
    rref::Control control;
    if (!control.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed child accept");
    c10::intrusive_ptr<RRefImpl> child;  // released outside the lock
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_children_.find(from_proto(control.fork()));
      if (it != pending_children_.end()) {
        child = std::move(it->second.rref);
        pending_children_.erase(it);
      }
    }
    changed_.notify_all();
    return completed_message(Message{kRRefChildAccept, "", {}});
  }

  // --- a worker is gone ------------------------------------------------------------------
  // Its references to values owned here are dropped (it can never delete them), values
  // it owns become unusable here with an error naming it, and nothing waits for it.
  void on_peer_failed(const WorkerInfo& peer, const Error& reason) {
    std::vector<c10::intrusive_ptr<OwnerRRef>> dropped;        // released outside the lock
    std::vector<c10::intrusive_ptr<RRefImpl>> children;        // likewise
    std::vector<FuturePtr> unconfirmed;
    std::vector<c10::intrusive_ptr<OwnerRRef>> unfilled;
    int forks_dropped = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_ || failed_workers_.count(peer.id)) return;
      failed_workers_[peer.id] = reason.message();
      for (auto rref = forks_.begin(); rref != forks_.end();) {
        for (auto fork = rref->second.begin(); fork != rref->second.end();) {
          if (fork->second == peer.id) {
            fork = rref->second.erase(fork);
            ++forks_dropped;
          } else {
            ++fork;
          }
        }
        if (!rref->second.empty()) {
          ++rref;
          continue;
        }
        auto owner = owners_.find(rref->first);
        if (owner != owners_.end()) {
          dropped.push_back(std::move(owner->second));
          owners_.erase(owner);
        }
        rref = forks_.erase(rref);
      }
      // Records made for RRefs the gone worker was creating here, whose remote call can
      // no longer arrive (a fetch or fork request overtook it): nothing will fill them.
      for (auto it = owners_.begin(); it != owners_.end();) {
        if (it->first.worker == peer.id && !it->second->value_future()->completed()) {
          unfilled.push_back(std::move(it->second));
          forks_.erase(it->first);
          placeholders_.erase(it->first);
          it = owners_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = users_.begin(); it != users_.end();) {
        UserState& user = it->second;
        if (user.owner != peer.id) {
          ++it;
          continue;
        }
        if (!user.confirmed) unconfirmed.push_back(user.confirmation);
        user.confirmed = true;
        user.released = true;  // no delete can reach a gone owner
        it = user.alive ? std::next(it) : users_.erase(it);
      }
      for (auto it = pending_children_.begin(); it != pending_children_.end();) {
        auto user = intrusive_cast<UserRRef>(it->second.rref);
        if (it->second.child == peer.id || (user && user->owner_info().id == peer.id)) {
          children.push_back(std::move(it->second.rref));
          it = pending_children_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = fork_parents_.begin(); it != fork_parents_.end();) {
        it = it->second == peer.id ? fork_parents_.erase(it) : std::next(it);
      }
      controls_->peer_failed(peer.id);
    }
    changed_.notify_all();
    const auto lost = std::make_exception_ptr(Error(
        ErrorKind::kPeerUnavailable, "the owner of this RRef, " + peer.name + ", is gone (" + reason.message() + ")"));
    for (auto& f : unconfirmed) f->setErrorIfNeeded(lost);
    for (auto& owner : unfilled) {
      owner->set_error(std::make_exception_ptr(Error(
          ErrorKind::kPeerUnavailable, peer.name + ", which was creating this RRef, is gone (" + reason.message() + ")")));
    }
    if (forks_dropped || !dropped.empty()) {
      LOG(WARNING) << self().name << ": " << peer.name << " is gone: dropped its " << forks_dropped
                   << " references to RRefs owned here (" << dropped.size() << " values freed)";
    }
  }

  // Throws kPeerUnavailable naming the owner when it is gone.
  void check_owner_alive(const WorkerInfo& owner, const Id& rref) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = failed_workers_.find(owner.id);
    if (it != failed_workers_.end()) {
      throw Error(ErrorKind::kPeerUnavailable,
                  "RRef " + rref.str() + " is lost: its owner " + owner.name + " is gone (" + it->second + ")");
    }
  }

  // --- helpers ----------------------------------------------------------------------------
  Id next_id() { return Id{self().id, next_local_.fetch_add(1)}; }

  c10::intrusive_ptr<OwnerRRef> new_owner(const Id& id) {
    auto owner = c10::make_intrusive<OwnerRRef>(shared_from_this(), id, self());
    std::lock_guard<std::mutex> lock(mu_);
    all_owners_.insert_or_assign(id, c10::weak_intrusive_ptr<OwnerRRef>(owner));
    return owner;
  }

  c10::intrusive_ptr<OwnerRRef> find_owner(const Id& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = all_owners_.find(id);
    if (it == all_owners_.end()) return {};
    return it->second.lock();
  }

  // A fetch, fork request or call from `from` may arrive before the remote call that
  // creates the value (it came from a third worker, which got a fork from the creator):
  // a placeholder record is made then, and the value fills it later. A record that can
  // no longer come is an error at once, not a wait until the deadline: this worker's own
  // ids, the creator's own requests (its remote call went first on the same stream), and
  // ids at or below the creator's latest remote call here (they come in order), which
  // are gone: freed, or never created here.
  c10::intrusive_ptr<OwnerRRef> get_or_create_owner(const Id& id, const WorkerInfo& from) {
    if (auto owner = find_owner(id)) return owner;
    // Built outside the lock: an unused candidate is destroyed after the lock is released
    // (its destructor takes the lock).
    auto candidate = c10::make_intrusive<OwnerRRef>(shared_from_this(), id, self());
    c10::intrusive_ptr<OwnerRRef> result;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = all_owners_.find(id);
      if (it != all_owners_.end()) result = it->second.lock();
      if (!result) {
        if (auto gone = failed_workers_.find(id.worker); gone != failed_workers_.end()) {
          throw Error(ErrorKind::kPeerUnavailable, "RRef " + id.str() + " was never created on " + self().name +
                                                       ": its creator is gone (" + gone->second + ")");
        }
        auto latest = latest_remote_call_.find(id.worker);
        if (id.worker == self().id || id.worker == from.id ||
            (latest != latest_remote_call_.end() && id.local <= latest->second)) {
          throw Error(ErrorKind::kBadArgument, "RRef " + id.str() + " does not exist on its owner " + self().name +
                                                   " (asked by " + from.name +
                                                   "): it was already deleted, or never created there");
        }
        all_owners_.insert_or_assign(id, c10::weak_intrusive_ptr<OwnerRRef>(candidate));
        owners_[id] = candidate;  // held until its forks are deleted
        placeholders_.insert(id);
        result = candidate;
      }
    }
    return result;
  }

  // The record the remote call for `id` fills. Placeholders below `id` from the same
  // creator will never be filled now: they fail (their waiters with them).
  c10::intrusive_ptr<OwnerRRef> owner_for_remote_call(const Id& id, const WorkerInfo& from) {
    if (id.worker != from.id) {
      throw Error(ErrorKind::kProtocol, "remote call from " + from.name + " for RRef " + id.str() + ", which " +
                                            from.name + " did not create");
    }
    if (id.worker == self().id) {
      // Created with its handle by remote_impl; if the handle is already gone the function
      // still runs, into a record nobody can reach.
      if (auto owner = find_owner(id)) return owner;
      return c10::make_intrusive<OwnerRRef>(shared_from_this(), id, self());
    }
    auto candidate = c10::make_intrusive<OwnerRRef>(shared_from_this(), id, self());
    c10::intrusive_ptr<OwnerRRef> result;
    std::vector<c10::intrusive_ptr<OwnerRRef>> dead;  // failed and released outside the lock
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = all_owners_.find(id);
      if (it != all_owners_.end()) result = it->second.lock();
      if (!result) {
        all_owners_.insert_or_assign(id, c10::weak_intrusive_ptr<OwnerRRef>(candidate));
        result = candidate;
      }
      placeholders_.erase(id);
      int64_t& latest = latest_remote_call_.emplace(id.worker, -1).first->second;
      latest = std::max(latest, id.local);
      for (auto p = placeholders_.lower_bound(Id{id.worker, -1}); p != placeholders_.end() && p->worker == id.worker &&
                                                                  p->local < id.local;) {
        auto owner = owners_.find(*p);
        if (owner != owners_.end()) {
          dead.push_back(std::move(owner->second));
          owners_.erase(owner);
        }
        forks_.erase(*p);
        p = placeholders_.erase(p);
      }
    }
    for (auto& owner : dead) {
      owner->set_error(std::make_exception_ptr(
          Error(ErrorKind::kBadArgument, "RRef " + owner->id().str() + " does not exist on its owner " + self().name +
                                             ": " + from.name + " never created it there")));
    }
    return result;
  }

  // Control messages go through the channel, which retries them; the outcome of each
  // comes back to control_done.
  void send_control_locked(int to, int32_t type, const Id& rref, const Id& fork) {
    if (failed_workers_.count(to) || stopped_) return;  // nobody there to tell
    controls_->send(Control{to, type, rref, fork});
  }

  void control_done(const Control& c, std::exception_ptr error) {
    changed_.notify_all();
    if (c.type != kRRefForkRequest) return;
    if (!error) {
      confirmed(c.fork);
    } else if (definitive(error)) {
      // The owner will never know the fork (the RRef is gone there): its uses fail with
      // the owner's answer, and nothing waits for a confirmation.
      confirmed(c.fork, error);
    }
  }

  // An answer from the peer itself, not a lost message or a gone peer.
  static bool definitive(std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      return e.kind() != ErrorKind::kTimeout && e.kind() != ErrorKind::kPeerUnavailable &&
             e.kind() != ErrorKind::kShutdown;
    } catch (...) {
      return false;
    }
  }



  RpcAgent& agent_;
  Executor& executor_;
  const Run run_;
  const Apply apply_;
  const RRefOptions options_;
  std::atomic<int64_t> next_local_{0};
  std::shared_ptr<ControlChannel> controls_;  // set by install()
  std::mutex remote_mu_;  // orders remote calls' ids with their sending

  std::mutex mu_;
  std::condition_variable changed_;
  // Guarded by mu_.
  std::map<Id, c10::intrusive_ptr<OwnerRRef>> owners_;            // owned, referenced by forks
  std::map<Id, std::map<Id, int>> forks_;                           // owned rref -> user fork -> holder
  std::map<Id, c10::weak_intrusive_ptr<OwnerRRef>> all_owners_;    // every live owner record
  struct UserState {
    Id rref;
    int owner = -1;
    FuturePtr confirmation;  // the UserRRef's own; completed once the owner knows the fork
    bool confirmed = false;  // the owner knows the fork (its future completes just after)
    bool alive = true;       // some handle on this worker still refers to it
    bool released = false;   // release_all sent its delete
  };
  std::map<Id, UserState> users_;                                   // fork -> user reference
  struct PendingChild {
    c10::intrusive_ptr<RRefImpl> rref;  // kept alive until the child is confirmed
    int child = -1;
  };
  std::map<Id, PendingChild> pending_children_;                     // forks awaiting the owner
  std::map<int, std::string> failed_workers_;                       // id -> why it is gone
  std::map<Id, int> fork_parents_;                                  // received fork -> who shared it
  std::set<Id> placeholders_;            // records made by requests that overtook their remote call
  std::map<int, int64_t> latest_remote_call_;  // creator -> highest id of its remote calls here
  int64_t live_owner_values_ = 0;
  bool stopped_ = false;
};

// --- OwnerRRef / UserRRef out of line (they need ContextImpl) ---------------------------

OwnerRRef::OwnerRRef(std::shared_ptr<ContextImpl> context, Id id, WorkerInfo self)
    : context_(context), id_(id), self_(std::move(self)) {
  context->owner_created();
}

void OwnerRRef::release() {
  if (released_.exchange(true)) return;
  value_.reset();  // frees the value now
  if (auto context = context_.lock()) context->owner_destroyed(id_);
}

FuturePtr OwnerRRef::call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                   milliseconds) {
  auto context = context_.lock();
  if (!context) throw Error(ErrorKind::kShutdown, "the RRef's worker has shut down");
  return context->apply_local(value_, fn, std::move(args), std::move(kwargs), /*caller=*/{});
}

RRef OwnerRRef::remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                milliseconds timeout) {
  auto context = context_.lock();
  if (!context) throw Error(ErrorKind::kShutdown, "the RRef's worker has shut down");
  return context->remote_impl(self_, fn, std::move(args), std::move(kwargs), timeout, &id_);
}

UserRRef::UserRRef(std::shared_ptr<ContextImpl> context, Id rref, Id fork, WorkerInfo owner)
    : context_(context), rref_(rref), fork_(fork), owner_(std::move(owner)), self_name_(context->self().name) {
  context->user_created(rref_, fork_, owner_.id, confirmed_);
}

UserRRef::~UserRRef() {
  if (auto context = context_.lock()) context->user_destroyed(fork_);
}

c10::IValue UserRRef::to_here(milliseconds timeout) {
  auto context = context_.lock();
  if (!context) throw Error(ErrorKind::kShutdown, "the RRef's worker has shut down");
  return context->fetch(*this, timeout);
}

FuturePtr UserRRef::call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                  milliseconds timeout) {
  auto context = context_.lock();
  if (!context) throw Error(ErrorKind::kShutdown, "the RRef's worker has shut down");
  check_usable();
  return context->apply_remote(owner_, rref_, fn, std::move(args), std::move(kwargs), timeout);
}

RRef UserRRef::remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                               milliseconds timeout) {
  auto context = context_.lock();
  if (!context) throw Error(ErrorKind::kShutdown, "the RRef's worker has shut down");
  check_usable();
  return context->remote_impl(owner_, fn, std::move(args), std::move(kwargs), timeout, &rref_);
}

}  // namespace

std::shared_ptr<RRefContext> create_rref_context(RpcAgent& agent, Executor& executor, RRefContext::Run run,
                                                 RRefContext::Apply apply, const RRefOptions& options) {
  auto context = std::make_shared<ContextImpl>(agent, executor, std::move(run), std::move(apply), options);
  context->install();
  return context;
}

}  // namespace drpc
