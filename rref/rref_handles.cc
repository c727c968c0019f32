#include "rref/rref_handles.h"

#include <condition_variable>
#include <mutex>

namespace drpc {
namespace rref_internal {

using std::chrono::milliseconds;

FuturePtr any_future() { return c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get()); }

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

namespace {

std::shared_ptr<HandleHost> lock_host(const std::weak_ptr<HandleHost>& host) {
  auto locked = host.lock();
  if (!locked) throw Error(ErrorKind::kShutdown, "the RRef's worker has shut down");
  return locked;
}

}  // namespace

// --- OwnerRRef ----------------------------------------------------------------------------

OwnerRRef::OwnerRRef(const std::shared_ptr<HandleHost>& host, Id id) : host_(host), id_(id), self_(host->self()) {
  host->owner_created();
}

std::shared_ptr<HandleHost> OwnerRRef::host() const { return lock_host(host_); }

void OwnerRRef::release() {
  if (released_.exchange(true)) return;
  value_.reset();  // frees the value now
  if (auto host = host_.lock()) host->owner_destroyed(id_);
}

c10::IValue OwnerRRef::to_here(milliseconds timeout) {
  wait_for(value_, timeout, "to_here of RRef " + id_.str());
  return value_->value();  // rethrows a failed creation
}

FuturePtr OwnerRRef::confirmation() {
  auto f = any_future();
  f->markCompleted(c10::IValue());
  return f;
}

FuturePtr OwnerRRef::call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                   milliseconds) {
  return host()->apply_local(value_, fn, std::move(args), std::move(kwargs), /*caller=*/{});
}

RRef OwnerRRef::remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                milliseconds timeout) {
  return host()->remote_impl(self_, fn, std::move(args), std::move(kwargs), timeout, &id_);
}

// --- UserRRef -----------------------------------------------------------------------------

UserRRef::UserRRef(const std::shared_ptr<HandleHost>& host, Id rref, Id fork, WorkerInfo owner)
    : host_(host), rref_(rref), fork_(fork), owner_(std::move(owner)), self_name_(host->self().name) {
  host->user_created(rref_, fork_, owner_.id, confirmed_);
}

UserRRef::~UserRRef() {
  if (auto host = host_.lock()) host->user_destroyed(fork_);
}

std::shared_ptr<HandleHost> UserRRef::host() const { return lock_host(host_); }

c10::IValue UserRRef::to_here(milliseconds timeout) { return host()->fetch(*this, timeout); }

c10::IValue UserRRef::local_value() {
  throw Error(ErrorKind::kBadArgument, "local_value() of RRef " + rref_.str() + " on " + self_name_ +
                                           ", which is not its owner (" + owner_.name + " is)");
}

FuturePtr UserRRef::call_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                                  milliseconds timeout) {
  auto host = this->host();
  check_usable();
  return host->apply_remote(owner_, rref_, fn, std::move(args), std::move(kwargs), timeout);
}

RRef UserRRef::remote_on_owner(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                               milliseconds timeout) {
  auto host = this->host();
  check_usable();
  return host->remote_impl(owner_, fn, std::move(args), std::move(kwargs), timeout, &rref_);
}

}  // namespace rref_internal
}  // namespace drpc
