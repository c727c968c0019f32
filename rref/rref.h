#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/rref_interface.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "rpc/call_codec.h"
#include "rpc/rpc_agent.h"

namespace drpc {

// A checked downcast that, unlike c10::dynamic_intrusive_pointer_cast, does not leak a
// reference when the cast fails.
template <class To, class From>
c10::intrusive_ptr<To> intrusive_cast(const c10::intrusive_ptr<From>& from) {
  To* to = dynamic_cast<To*>(from.get());
  return to ? c10::intrusive_ptr<To>::reclaim_copy(to) : c10::intrusive_ptr<To>();
}

class RRef;

// What an RRef handle points at: the owner's record of the value, or a user's fork of it.
// Implemented by the RRef context; users hold RRef handles.
class RRefImpl : public c10::RRefInterface {
 public:
  // The value, fetched from the owner (waits for it to exist). Throws the error the
  // remote creation raised, kTimeout, kPeerUnavailable.
  virtual c10::IValue to_here(std::chrono::milliseconds timeout) = 0;
  // The value itself, on the owner only (kBadArgument elsewhere). Waits for it.
  virtual c10::IValue local_value() = 0;
  // Completes once the owner knows of this reference (at once on the owner).
  virtual FuturePtr confirmation() = 0;
  // Runs `fn` on the owner with the value: a TorchScript object's method `fn`, or the
  // registered function `fn` with the value as its first argument.
  virtual FuturePtr call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                  std::chrono::milliseconds timeout) = 0;
  virtual RRef remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                               std::chrono::milliseconds timeout) = 0;
  // "creator:counter" of the RRef, for messages and leak reports.
  virtual std::string id_string() const = 0;
};

// A reference to a value that lives on one worker (its owner). Copyable and cheap; an
// ordinary value that can be an argument, a result, or nested in lists, tuples and
// dicts. The value lives as long as some worker holds a reference. Thread-safe.
class RRef {
 public:
  RRef() = default;
  explicit RRef(c10::intrusive_ptr<RRefImpl> impl) : impl_(std::move(impl)) {}
  // Throws kBadArgument if `value` is not an RRef.
  static RRef from_ivalue(const c10::IValue& value);
  // An RRef owned by the calling worker (defined by //:drpc, which knows the worker).
  static RRef make_local(c10::IValue value);

  c10::IValue to_ivalue() const { return c10::IValue(c10::intrusive_ptr<c10::RRefInterface>(impl_)); }
  bool defined() const { return impl_.defined(); }

  int owner() const { return impl().owner(); }
  std::string owner_name() const { return impl().ownerName(); }
  bool is_owner() const { return impl().isOwner(); }
  bool confirmed_by_owner() const { return impl().confirmedByOwner(); }
  c10::IValue to_here(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) const {
    return impl().to_here(timeout);
  }
  c10::IValue local_value() const { return impl().local_value(); }

  FuturePtr rpc_async(const std::string& fn, std::vector<c10::IValue> args = {}, Kwargs kwargs = {},
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) const {
    return impl().call_on_owner(fn, std::move(args), std::move(kwargs), timeout);
  }
  c10::IValue rpc_sync(const std::string& fn, std::vector<c10::IValue> args = {}, Kwargs kwargs = {},
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) const {
    auto future = rpc_async(fn, std::move(args), std::move(kwargs), timeout);
    future->wait();
    return future->value();
  }
  RRef remote(const std::string& fn, std::vector<c10::IValue> args = {}, Kwargs kwargs = {},
              std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) const;

  RRefImpl& impl() const {
    if (!impl_) throw std::logic_error("use of an empty RRef");
    return *impl_;
  }

 private:
  c10::intrusive_ptr<RRefImpl> impl_;
};

inline RRef RRef::remote(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                         std::chrono::milliseconds timeout) const {
  return impl().remote_on_owner(fn, std::move(args), std::move(kwargs), timeout);
}

inline RRef RRef::from_ivalue(const c10::IValue& value) {
  if (!value.isRRef()) throw Error(ErrorKind::kBadArgument, "expected an RRef, got " + value.tagKind());
  auto impl = intrusive_cast<RRefImpl>(value.toRRef());
  if (!impl) throw Error(ErrorKind::kBadArgument, "an RRef from another RPC framework");
  return RRef(impl);
}

// Counts a context exposes, for tests and metrics.
struct RRefCounts {
  int64_t owners = 0;          // RRefs this worker owns that some worker still references
  int64_t owner_values = 0;    // values held alive on this worker (owners plus local handles)
  int64_t users = 0;           // live user references on this worker
  int64_t pending_children = 0;  // forks this worker shared that the owner has not confirmed
  int64_t pending_users = 0;   // user references the owner has not confirmed yet
};

}  // namespace drpc
