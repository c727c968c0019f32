// Calls on RRefs (see context_impl.h): remote() and its creation, to_here(),
// and calls on an RRef's value (rpc_sync/rpc_async/remote through an RRef), as
// the caller that sends them and as the owner that serves them.

#include "rref/context_impl.h"

namespace drpc {
namespace rref_internal {
namespace {

using std::chrono::milliseconds;

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

// Every later use of an RRef whose creation failed raises this: the same kind,
// saying so.
std::exception_ptr creation_failure(const std::string& what, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    const char* how = e.kind() == ErrorKind::kTimeout ? " timed out: " : " failed: ";
    return std::make_exception_ptr(Error(e.kind(), "the creation of " + what + how + e.message()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(Error(ErrorKind::kInternal, "the creation of " + what + " failed: " + e.what()));
  }
}

}  // namespace

c10::IValue ContextImpl::fetch(const UserRRef& user, milliseconds timeout) {
  check_owner_alive(user.owner_info(), user.rref());
  if (timeout.count() < 0) timeout = agent_.default_timeout();
  rref::Control control;
  to_proto(user.rref(), control.mutable_rref());
  user.check_usable();
  FuturePtr reply = agent_.send(user.owner_info(), Message{kRRefFetch, control.SerializeAsString(), {}}, timeout,
                                CallName{"to_here of RRef", user.rref().str()});
  // A fetch waiting on a creation that then times out fails with it, not at its
  // own (maybe much later) deadline.
  reply = unless_failed(reply, user.confirmation_future());
  reply->wait();
  return decode_result(message_from_ivalue(reply->value()), hooks(user.owner_info().id), "to_here reply");
}

FuturePtr ContextImpl::apply_remote(const WorkerInfo& owner, const Id& rref, const std::string& fn,
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

FuturePtr ContextImpl::apply_local(const FuturePtr& value, const std::string& fn, std::vector<c10::IValue> args,
                                   Kwargs kwargs, Extensions caller) {
  auto self = shared_from_this();
  auto result = any_future();
  after_on_pool(
      agent_, value,
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

RRef ContextImpl::remote_impl(const WorkerInfo& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
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
    // Ids go out in the order they were taken, so an owner that saw this
    // worker's remote call k knows no call below k is still coming
    // (get_or_create_owner).
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
    // Replied to once the function has finished on the owner: the deadline
    // covers it.
    ack = agent_.send(to, std::move(m), timeout, "remote " + fn);
  }
  auto self = shared_from_this();
  const Id fork = user ? user->fork() : Id{};
  const bool is_user = user.defined();
  const std::string what = "RRef " + rref.str() + " (remote " + fn + " on " + to.name + ")";
  ack->addCallback([self, is_user, fork, own, what](c10::ivalue::Future& done) {
    std::exception_ptr failure = done.hasError() ? creation_failure(what, done.exception_ptr()) : nullptr;
    if (is_user) {
      self->confirmed(fork, failure);  // on failure too: the owner may hold the
                                       // fork, so it is deleted
    } else if (failure) {
      if (auto owner = own.lock()) owner->set_error(failure);
    }
  });
  return RRef(handle);
}

// --- the owner's side
// ---------------------------------------------------------------------

FuturePtr ContextImpl::on_remote_call(const WorkerInfo& from, Message m) {
  rref::RemoteCall call;
  if (!call.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed remote call");
  const Id rref = from_proto(call.rref());
  auto owner = owner_for_remote_call(rref, from);
  if (!owner->claim_value()) {
    throw Error(ErrorKind::kProtocol, "remote call for RRef " + rref.str() + ", which already has a value");
  }
  if (call.has_fork()) {
    std::lock_guard<std::mutex> lock(mu_);
    add_fork_locked(owner, from_proto(call.fork()), from.id);
  }
  std::vector<c10::IValue> args;
  Kwargs kwargs;
  std::string fn;
  decode_call(call.call(), m.tensors, hooks(from.id), &fn, &args, &kwargs);
  // Run once every RRef among the arguments is confirmed. The reply goes out
  // when the value exists (or failed): the caller's deadline covers the
  // creation, and its RRef is confirmed only by a creation that succeeded.
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
      owner->set_error(
          std::make_exception_ptr(Error(ErrorKind::kBadArgument, "RRef " + from_proto(call.apply_to()).str() +
                                                                     " is not owned by " + self->self().name)));
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

FuturePtr ContextImpl::on_fetch(const WorkerInfo& from, Message m) {
  rref::Control control;
  if (!control.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed fetch");
  auto owner = get_or_create_owner(from_proto(control.rref()), from);
  return reply_with_value(owner->value_future(), kRRefFetch, from.id);
}

FuturePtr ContextImpl::on_apply(const WorkerInfo& from, Message m) {
  rref::RemoteCall call;
  if (!call.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed RRef call");
  auto owner = get_or_create_owner(from_proto(call.rref()), from);
  std::vector<c10::IValue> args;
  Kwargs kwargs;
  std::string fn;
  decode_call(call.call(), m.tensors, hooks(from.id), &fn, &args, &kwargs);
  FuturePtr result = apply_local(owner->value_future(), fn, std::move(args), std::move(kwargs), m.extensions);
  return reply_with_value(result, kRRefApply, from.id);
}

FuturePtr ContextImpl::reply_with_value(const FuturePtr& value, int32_t type, int peer) {
  auto self = shared_from_this();
  return value->then(
      [self, type, peer](c10::ivalue::Future& done) {
        return message_to_ivalue(encode_result(type, done.value(), "RRef value", self->hooks(peer)));
      },
      c10::AnyType::get());
}
}  // namespace rref_internal
}  // namespace drpc
