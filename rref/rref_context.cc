// The references' lifetimes (see context_impl.h): the ForkLedger decides, this file holds
// the objects behind its ids and sends what it says; rref_controls.cc answers the
// protocol's control messages.

#include "rref/rref_context.h"

#include <glog/logging.h>

#include "rref/context_impl.h"

namespace drpc {
namespace rref_internal {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Every RRef inside `value`, recursively.
void collect_rrefs(const c10::IValue& value, std::vector<c10::intrusive_ptr<RRefImpl>>* out) {
  if (value.isRRef()) {
    if (auto impl = intrusive_cast<RRefImpl>(value.toRRef())) out->push_back(impl);
  } else if (value.isList()) {
    for (const auto& v : value.toListRef()) collect_rrefs(v, out);
  } else if (value.isTuple()) {
    for (const auto& v : value.toTupleRef().elements()) collect_rrefs(v, out);
  } else if (value.isGenericDict()) {
    for (const auto& kv : value.toGenericDict()) {
      collect_rrefs(kv.key(), out);
      collect_rrefs(kv.value(), out);
    }
  }
}

// An answer from the peer itself, not a lost message or a gone peer.
bool definitive(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.kind() != ErrorKind::kTimeout && e.kind() != ErrorKind::kPeerUnavailable &&
           e.kind() != ErrorKind::kShutdown;
  } catch (...) {
    return false;
  }
}

}  // namespace

ContextImpl::ContextImpl(RpcAgent& agent, Executor& executor, Run run, Apply apply, const RRefOptions& options)
    : agent_(agent),
      executor_(executor),
      run_(std::move(run)),
      apply_(std::move(apply)),
      options_(options),
      ledger_(agent.self().id) {}

void ContextImpl::install() {
  auto handler = [this](auto method) {
    return [this, method](const WorkerInfo& from, Message m) { return (this->*method)(from, std::move(m)); };
  };
  // The protocol's handlers never block (user functions are handed to the pool), so
  // they run inline: the protocol keeps moving even when every handler thread is busy
  // with a function that waits on an RRef.
  agent_.register_handler(kRRefRemoteCall, handler(&ContextImpl::on_remote_call), RpcAgent::always_inline());
  agent_.register_handler(kRRefFetch, handler(&ContextImpl::on_fetch), RpcAgent::always_inline());
  agent_.register_handler(kRRefUserDelete, handler(&ContextImpl::on_user_delete), RpcAgent::always_inline());
  agent_.register_handler(kRRefForkRequest, handler(&ContextImpl::on_fork_request), RpcAgent::always_inline());
  agent_.register_handler(kRRefChildAccept, handler(&ContextImpl::on_child_accept), RpcAgent::always_inline());
  agent_.register_handler(kRRefApply, handler(&ContextImpl::on_apply), RpcAgent::always_inline());
  agent_.register_handler(kRRefControlBatch, handler(&ContextImpl::on_control_batch), RpcAgent::always_inline());
  agent_.add_peer_failure_listener([this](const WorkerInfo& peer, const Error& reason) {
    on_peer_failed(peer, reason);
  });
  std::weak_ptr<ContextImpl> weak = weak_from_this();
  controls_ = ControlChannel::create(agent_, executor_, options_, [weak](const Control& c, std::exception_ptr error) {
    if (auto self = weak.lock()) self->control_done(c, error);
  });
  // On every message, so weak: a message may still pass while the context goes.
  agent_.add_interceptor(RpcAgent::Interceptor{
      [weak](const WorkerInfo& to, Message& m) {
        if (auto self = weak.lock()) self->carry_controls(to, m);
      },
      [weak](const WorkerInfo& from, Message& m) {
        if (auto self = weak.lock()) self->apply_carried_controls(from, m);
      }});
}

// --- the ledger's effects -------------------------------------------------------------------

ContextImpl::Outcome ContextImpl::apply_locked(Effects effects) {
  Outcome outcome;
  for (const Control& c : effects.controls) {  // queued, never sent on this thread
    if (c.type == kRRefChildAccept) {
      controls_->send_carried(c, options_.accept_carry_window);
    } else {
      controls_->send(c);
    }
  }
  for (const Id& rref : effects.released_owners) {
    auto it = kept_.find(rref);
    if (it == kept_.end()) continue;
    outcome.released.push_back(std::move(it->second));
    kept_.erase(it);
  }
  for (const Id& fork : effects.released_children) {
    auto it = children_.find(fork);
    if (it == children_.end()) continue;
    outcome.released.push_back(std::move(it->second));
    children_.erase(it);
  }
  for (const Id& fork : effects.confirmed_users) {
    auto it = confirmations_.find(fork);
    if (it == confirmations_.end()) continue;
    outcome.confirmed.push_back(std::move(it->second));
    confirmations_.erase(it);
  }
  return outcome;
}

void ContextImpl::finish(Outcome outcome, std::exception_ptr error) {
  changed_.notify_all();
  for (auto& confirmation : outcome.confirmed) {
    if (error) {
      confirmation->setErrorIfNeeded(error);
    } else if (!confirmation->completed()) {
      confirmation->markCompleted(c10::IValue());
    }
  }
  outcome.released.clear();  // values and references freed here, outside the lock
}

void ContextImpl::add_fork_locked(const c10::intrusive_ptr<OwnerRRef>& owner, const Id& fork, int holder) {
  kept_[owner->id()] = owner;
  ledger_.add_fork(owner->id(), fork, holder);
}

void ContextImpl::confirmed(const Id& fork, std::exception_ptr error) {
  Outcome outcome;
  {
    std::lock_guard<std::mutex> lock(mu_);
    outcome = apply_locked(ledger_.confirmed(fork));
  }
  finish(std::move(outcome), error);
}

// Control messages' outcomes, from the channel.
void ContextImpl::control_done(const Control& c, std::exception_ptr error) {
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

// --- RRefContext ----------------------------------------------------------------------------

RRef ContextImpl::make_local(c10::IValue value) {
  auto owner = new_owner(next_id());
  owner->claim_value();
  owner->set_value(std::move(value));
  return RRef(owner);
}

ValueHooks ContextImpl::hooks(int peer) {
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

FuturePtr ContextImpl::confirmations(const std::vector<c10::IValue>& values) {
  std::vector<c10::intrusive_ptr<RRefImpl>> rrefs;
  for (const auto& v : values) collect_rrefs(v, &rrefs);
  auto all = any_future();
  if (rrefs.empty()) {  // most calls: nothing to wait for, and no counter to share
    all->markCompleted(c10::IValue());
    return all;
  }
  auto left = std::make_shared<std::atomic<int>>(static_cast<int>(rrefs.size()) + 1);
  auto one_done = [all, left](c10::ivalue::Future&) {
    if (left->fetch_sub(1) == 1) all->markCompleted(c10::IValue());
  };
  for (auto& r : rrefs) r->confirmation()->addCallback(one_done);
  one_done(*all);  // the +1
  return all;
}

RRefCounts ContextImpl::counts() {
  std::lock_guard<std::mutex> lock(mu_);
  RRefCounts c;
  c.owners = ledger_.kept_values();
  c.owner_values = live_owner_values_;
  c.pending_children = ledger_.pending_children();
  c.users = ledger_.live_users();
  c.pending_users = ledger_.unconfirmed_users();
  return c;
}

void ContextImpl::release_all(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Outcome outcome;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_until(lock, deadline, [&] { return ledger_.settled(); })) {
      LOG(WARNING) << agent_.self().name << ": leaving with " << ledger_.pending_children()
                   << " RRef forks the owners never confirmed";
    }
    // Delete every remaining user reference now; their handles become inert.
    outcome = apply_locked(ledger_.release_all());
  }
  finish(std::move(outcome));
  controls_->wait_idle(deadline);
}

std::vector<std::string> ContextImpl::leaks() {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.leaks();
}

void ContextImpl::shutdown() {
  Outcome outcome;
  std::vector<c10::intrusive_ptr<OwnerRRef>> unresolved;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ledger_.stopped()) return;
    controls_->stop();
    // Owner records and the replies waiting on their values refer back to this
    // context: break those cycles, or the context and every value it owns would
    // outlive the runtime.
    outcome = apply_locked(ledger_.stop());
    for (auto& [id, weak] : all_owners_) {
      if (auto owner = weak.lock()) unresolved.push_back(std::move(owner));
    }
  }
  finish(std::move(outcome));
  const auto stopped = std::make_exception_ptr(Error(ErrorKind::kShutdown, self().name + " has shut down"));
  for (auto& owner : unresolved) owner->set_error(stopped);
}

// --- the handles' births and deaths ------------------------------------------------------------

void ContextImpl::owner_created() {
  std::lock_guard<std::mutex> lock(mu_);
  ++live_owner_values_;
}

void ContextImpl::owner_destroyed(const Id& id) {
  std::lock_guard<std::mutex> lock(mu_);
  --live_owner_values_;
  auto it = all_owners_.find(id);
  if (it != all_owners_.end() && it->second.expired()) all_owners_.erase(it);
}

void ContextImpl::user_created(const Id& rref, const Id& fork, int owner, FuturePtr confirmation) {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.user_created(rref, fork, owner);
  confirmations_[fork] = std::move(confirmation);
}

void ContextImpl::user_destroyed(const Id& fork) {
  Outcome outcome;
  {
    std::lock_guard<std::mutex> lock(mu_);
    outcome = apply_locked(ledger_.user_destroyed(fork));
  }
  finish(std::move(outcome));
}

// --- forks: RRefs inside values that cross the wire ------------------------------------------

// Describes `impl` for `peer` and records what the protocol needs until it arrives.
rref::ForkData ContextImpl::fork(const c10::intrusive_ptr<RRefImpl>& impl, int peer) {
  rref::ForkData data;
  data.set_parent(self().id);
  if (auto owner = intrusive_cast<OwnerRRef>(impl)) {
    to_proto(owner->id(), data.mutable_rref());
    data.set_owner(self().id);
    if (peer != self().id) {
      const Id fork = next_id();
      to_proto(fork, data.mutable_fork());
      std::lock_guard<std::mutex> lock(mu_);
      add_fork_locked(owner, fork, peer);  // the owner shares: the fork is known at once
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
  children_[fork] = impl;
  ledger_.child_pending(fork, peer, user->owner_info().id);
  return data;
}

// An RRef arrived from `peer`.
c10::IValue ContextImpl::accept(const rref::ForkData& data, int peer) {
  const Id rref = from_proto(data.rref());
  const Id fork = from_proto(data.fork());
  if (data.owner() == self().id) {
    auto owner = find_owner(rref);
    if (!owner) throw Error(ErrorKind::kProtocol, "RRef " + rref.str() + " is not owned here");
    // A user shared it back with its owner: the sender may let go of its reference.
    if (data.has_fork()) {
      std::lock_guard<std::mutex> lock(mu_);
      apply_locked(ledger_.returned_to_owner(rref, fork, data.parent()));
    }
    return c10::IValue(c10::intrusive_ptr<c10::RRefInterface>(owner));
  }
  const WorkerInfo owner = agent_.worker(data.owner());
  auto user = c10::make_intrusive<UserRRef>(shared_from_this(), rref, fork, owner);
  Outcome outcome;
  {
    std::lock_guard<std::mutex> lock(mu_);
    outcome = apply_locked(ledger_.user_received(rref, fork, owner.id, data.parent()));
  }
  finish(std::move(outcome));
  (void)peer;
  return c10::IValue(c10::intrusive_ptr<c10::RRefInterface>(user));
}

// --- a worker is gone ------------------------------------------------------------------------
// Its references to values owned here are dropped (it can never delete them), values it
// owns become unusable here with an error naming it, and nothing waits for it.
void ContextImpl::on_peer_failed(const WorkerInfo& peer, const Error& reason) {
  Outcome outcome;
  std::vector<FuturePtr> lost;
  std::vector<c10::intrusive_ptr<OwnerRRef>> unfilled;
  int forks_dropped = 0;
  size_t values_freed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Id> unfilled_ids;
    auto filled = [this](const Id& id) {
      auto it = kept_.find(id);
      return it == kept_.end() || it->second->value_future()->completed();
    };
    Effects effects = ledger_.peer_failed(peer.id, reason.message(), filled, &unfilled_ids);
    forks_dropped = effects.forks_dropped;
    for (const Id& id : unfilled_ids) unfilled.push_back(kept_.at(id));
    for (const Id& fork : effects.lost_users) {
      auto it = confirmations_.find(fork);
      if (it == confirmations_.end()) continue;
      lost.push_back(std::move(it->second));
      confirmations_.erase(it);
    }
    values_freed = effects.released_owners.size() - unfilled_ids.size();
    outcome = apply_locked(std::move(effects));
    controls_->peer_failed(peer.id);
  }
  const auto gone = std::make_exception_ptr(Error(
      ErrorKind::kPeerUnavailable, "the owner of this RRef, " + peer.name + ", is gone (" + reason.message() + ")"));
  for (auto& f : lost) f->setErrorIfNeeded(gone);
  for (auto& owner : unfilled) {
    owner->set_error(std::make_exception_ptr(Error(
        ErrorKind::kPeerUnavailable, peer.name + ", which was creating this RRef, is gone (" + reason.message() + ")")));
  }
  unfilled.clear();
  finish(std::move(outcome));
  if (forks_dropped || values_freed) {
    LOG(WARNING) << self().name << ": " << peer.name << " is gone: dropped its " << forks_dropped
                 << " references to RRefs owned here (" << values_freed << " values freed)";
  }
}

void ContextImpl::check_owner_alive(const WorkerInfo& owner, const Id& rref) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto reason = ledger_.failure_of(owner.id)) {
    throw Error(ErrorKind::kPeerUnavailable,
                "RRef " + rref.str() + " is lost: its owner " + owner.name + " is gone (" + *reason + ")");
  }
}

// --- owner records ---------------------------------------------------------------------------

c10::intrusive_ptr<OwnerRRef> ContextImpl::new_owner(const Id& id) {
  auto owner = c10::make_intrusive<OwnerRRef>(shared_from_this(), id);
  std::lock_guard<std::mutex> lock(mu_);
  all_owners_.insert_or_assign(id, c10::weak_intrusive_ptr<OwnerRRef>(owner));
  return owner;
}

c10::intrusive_ptr<OwnerRRef> ContextImpl::find_owner(const Id& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = all_owners_.find(id);
  if (it == all_owners_.end()) return {};
  return it->second.lock();
}

// A fetch, fork request or call from `from` may arrive before the remote call that
// creates the value (it came from a third worker, which got a fork from the creator): a
// placeholder record is made then, and the value fills it later. A record that can no
// longer come is an error at once (ForkLedger::classify_unknown), not a wait until the
// deadline.
c10::intrusive_ptr<OwnerRRef> ContextImpl::get_or_create_owner(const Id& id, const WorkerInfo& from) {
  if (auto owner = find_owner(id)) return owner;
  // Built outside the lock: an unused candidate is destroyed after the lock is released
  // (its destructor takes the lock).
  auto candidate = c10::make_intrusive<OwnerRRef>(shared_from_this(), id);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = all_owners_.find(id);
  if (it != all_owners_.end()) {
    if (auto owner = it->second.lock()) return owner;
  }
  switch (ledger_.classify_unknown(id, from.id)) {
    case Unknown::kCreatorGone:
      throw Error(ErrorKind::kPeerUnavailable, "RRef " + id.str() + " was never created on " + self().name +
                                                   ": its creator is gone (" + *ledger_.failure_of(id.worker) + ")");
    case Unknown::kGone:
      throw Error(ErrorKind::kBadArgument, "RRef " + id.str() + " does not exist on its owner " + self().name +
                                               " (asked by " + from.name +
                                               "): it was already deleted, or never created there");
    case Unknown::kMayStillCome:
      break;
  }
  all_owners_.insert_or_assign(id, c10::weak_intrusive_ptr<OwnerRRef>(candidate));
  kept_[id] = candidate;  // held until its forks are deleted
  ledger_.add_placeholder(id);
  return candidate;
}

// The record the remote call for `id` fills. Placeholders below `id` from the same
// creator will never be filled now: they fail (their waiters with them).
c10::intrusive_ptr<OwnerRRef> ContextImpl::owner_for_remote_call(const Id& id, const WorkerInfo& from) {
  if (id.worker != from.id) {
    throw Error(ErrorKind::kProtocol,
                "remote call from " + from.name + " for RRef " + id.str() + ", which " + from.name + " did not create");
  }
  if (id.worker == self().id) {
    // Created with its handle by remote_impl; if the handle is already gone the function
    // still runs, into a record nobody can reach.
    if (auto owner = find_owner(id)) return owner;
    return c10::make_intrusive<OwnerRRef>(shared_from_this(), id);
  }
  auto candidate = c10::make_intrusive<OwnerRRef>(shared_from_this(), id);
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
    for (const Id& placeholder : ledger_.remote_call_arrived(id)) {
      auto owner = kept_.find(placeholder);
      if (owner == kept_.end()) continue;
      dead.push_back(std::move(owner->second));
      kept_.erase(owner);
    }
  }
  for (auto& owner : dead) {
    owner->set_error(std::make_exception_ptr(
        Error(ErrorKind::kBadArgument, "RRef " + owner->id().str() + " does not exist on its owner " + self().name +
                                           ": " + from.name + " never created it there")));
  }
  return result;
}

}  // namespace rref_internal

std::shared_ptr<RRefContext> create_rref_context(RpcAgent& agent, Executor& executor, RRefContext::Run run,
                                                 RRefContext::Apply apply, const RRefOptions& options) {
  auto context =
      std::make_shared<rref_internal::ContextImpl>(agent, executor, std::move(run), std::move(apply), options);
  context->install();
  return context;
}

}  // namespace drpc
