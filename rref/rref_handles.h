#pragma once

// The RRef handles users hold: OwnerRRef (the value lives here) and UserRRef (a fork of a
// value another worker owns). A handle only reports its birth and death to its context
// and forwards its calls there, through HandleHost; it never outlives the context's
// usefulness (it holds it weakly) and never keeps protocol state of its own beyond its
// value or its confirmation. Internal to rref/.

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "rpc/rpc_agent.h"
#include "rref/rref.h"
#include "rref/rref_id.h"

namespace drpc {
namespace rref_internal {

class UserRRef;

FuturePtr any_future();

// Waits for `future` up to `timeout` (<= 0: forever); throws kTimeout naming `what`.
void wait_for(const FuturePtr& future, std::chrono::milliseconds timeout, const std::string& what);

// What the handles need of their context. Thread-safe.
class HandleHost {
 public:
  HandleHost() = default;
  HandleHost(const HandleHost&) = delete;
  HandleHost& operator=(const HandleHost&) = delete;
  virtual ~HandleHost() = default;

  virtual const WorkerInfo& self() const = 0;
  virtual void owner_created() = 0;
  virtual void owner_destroyed(const Id& rref) = 0;
  // `confirmation` completes once the owner knows the fork (with an error if it never will).
  virtual void user_created(const Id& rref, const Id& fork, int owner, FuturePtr confirmation) = 0;
  virtual void user_destroyed(const Id& fork) = 0;
  virtual c10::IValue fetch(const UserRRef& user, std::chrono::milliseconds timeout) = 0;
  virtual FuturePtr apply_remote(const WorkerInfo& owner, const Id& rref, const std::string& fn,
                                 std::vector<c10::IValue> args, Kwargs kwargs, std::chrono::milliseconds timeout) = 0;
  virtual FuturePtr apply_local(const FuturePtr& value, const std::string& fn, std::vector<c10::IValue> args,
                                Kwargs kwargs, Extensions caller) = 0;
  // remote() of `fn` on `to`, applied to `apply_to` (owned by `to`) when not null.
  virtual RRef remote_impl(const WorkerInfo& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                           std::chrono::milliseconds timeout, const Id* apply_to) = 0;
};

class OwnerRRef final : public RRefImpl {
 public:
  OwnerRRef(const std::shared_ptr<HandleHost>& host, Id id);
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

  c10::IValue to_here(std::chrono::milliseconds timeout) override;
  c10::IValue local_value() override { return to_here(std::chrono::milliseconds(0)); }
  FuturePtr confirmation() override;
  FuturePtr call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                          std::chrono::milliseconds timeout) override;
  RRef remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                       std::chrono::milliseconds timeout) override;

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
  std::shared_ptr<HandleHost> host() const;

  std::weak_ptr<HandleHost> host_;
  const Id id_;
  const WorkerInfo self_;
  FuturePtr value_ = any_future();
  std::atomic<bool> released_{false};
  std::atomic<bool> value_claimed_{false};
  std::atomic<bool> settled_{false};
};

class UserRRef final : public RRefImpl {
 public:
  UserRRef(const std::shared_ptr<HandleHost>& host, Id rref, Id fork, WorkerInfo owner);
  ~UserRRef() override;

  c10::worker_id_t owner() const override { return static_cast<c10::worker_id_t>(owner_.id); }
  std::string ownerName() const override { return owner_.name; }
  bool isOwner() const override { return false; }
  // A failed or timed-out creation completes the confirmation with its error.
  bool confirmedByOwner() const override { return confirmed_->completed() && !confirmed_->hasError(); }
  const c10::TypePtr type() const override { return c10::AnyType::get(); }
  std::string id_string() const override { return rref_.str(); }

  c10::IValue to_here(std::chrono::milliseconds timeout) override;
  c10::IValue local_value() override;
  FuturePtr confirmation() override { return confirmed_; }
  FuturePtr call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                          std::chrono::milliseconds timeout) override;
  RRef remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                       std::chrono::milliseconds timeout) override;

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
  std::shared_ptr<HandleHost> host() const;

  std::weak_ptr<HandleHost> host_;
  const Id rref_;
  const Id fork_;
  const WorkerInfo owner_;
  const std::string self_name_;
  FuturePtr confirmed_ = any_future();
};

}  // namespace rref_internal
}  // namespace drpc
