#pragma once

// One worker's RRefContext, internal to rref/. Its jobs live in three files:
//   rref_context.cc   the references' lifetimes: the fork / confirm / delete protocol run
//                     through the ForkLedger, forks and arrivals of RRefs inside values,
//                     owner records, peer failure, leave and shutdown;
//   rref_controls.cc  the protocol's control messages received (alone, batched, or riding
//                     on other messages) and the child accepts put on outgoing messages;
//   rref_calls.cc     the calls on RRefs: remote(), to_here(), rpc on an RRef's value,
//                     as the caller and as the owner that serves them.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "common/executor.h"
#include "rpc/rpc_agent.h"
#include "rref/control_channel.h"
#include "rref/fork_ledger.h"
#include "rref/proto/rref.pb.h"
#include "rref/rref_context.h"
#include "rref/rref_handles.h"

namespace drpc {
namespace rref_internal {

class ContextImpl final : public RRefContext, public HandleHost, public std::enable_shared_from_this<ContextImpl> {
 public:
  ContextImpl(RpcAgent& agent, Executor& executor, Run run, Apply apply, const RRefOptions& options);
  ~ContextImpl() override { shutdown(); }
  // Registers the protocol's handlers on the agent and opens the control channel.
  void install();

  // --- RRefContext ------------------------------------------------------------------------
  RRef remote(const WorkerInfo& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
              std::chrono::milliseconds timeout) override {
    return remote_impl(to, fn, std::move(args), std::move(kwargs), timeout, nullptr);
  }
  RRef make_local(c10::IValue value) override;
  ValueHooks hooks(int peer) override;
  FuturePtr confirmations(const std::vector<c10::IValue>& values) override;
  RRefCounts counts() override;
  void release_all(std::chrono::milliseconds timeout) override;
  std::vector<std::string> leaks() override;
  void shutdown() override;

  // --- HandleHost -------------------------------------------------------------------------
  const WorkerInfo& self() const override { return agent_.self(); }
  void owner_created() override;
  void owner_destroyed(const Id& id) override;
  void user_created(const Id& rref, const Id& fork, int owner, FuturePtr confirmation) override;
  void user_destroyed(const Id& fork) override;
  c10::IValue fetch(const UserRRef& user, std::chrono::milliseconds timeout) override;
  FuturePtr apply_remote(const WorkerInfo& owner, const Id& rref, const std::string& fn, std::vector<c10::IValue> args,
                         Kwargs kwargs, std::chrono::milliseconds timeout) override;
  FuturePtr apply_local(const FuturePtr& value, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                        Extensions caller) override;
  RRef remote_impl(const WorkerInfo& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                   std::chrono::milliseconds timeout, const Id* apply_to) override;

 private:
  // The objects released or completed by one ledger event, dealt with outside the lock.
  struct Outcome {
    std::vector<c10::intrusive_ptr<c10::intrusive_ptr_target>> released;
    std::vector<FuturePtr> confirmed;
  };

  // --- rref_context.cc: lifetimes -----------------------------------------------------------
  rref::ForkData fork(const c10::intrusive_ptr<RRefImpl>& impl, int peer);
  c10::IValue accept(const rref::ForkData& data, int peer);
  // The owner knows of `fork` now (or its creation failed, `error`: then the owner may or
  // may not know, and a later delete is harmless either way).
  void confirmed(const Id& fork, std::exception_ptr error = nullptr);
  void on_peer_failed(const WorkerInfo& peer, const Error& reason);
  // Throws kPeerUnavailable naming the owner when it is gone.
  void check_owner_alive(const WorkerInfo& owner, const Id& rref);
  Id next_id() { return Id{self().id, next_local_.fetch_add(1)}; }
  c10::intrusive_ptr<OwnerRRef> new_owner(const Id& id);
  c10::intrusive_ptr<OwnerRRef> find_owner(const Id& id);
  c10::intrusive_ptr<OwnerRRef> get_or_create_owner(const Id& id, const WorkerInfo& from);
  c10::intrusive_ptr<OwnerRRef> owner_for_remote_call(const Id& id, const WorkerInfo& from);
  // `holder` has fork `fork` of `owner`, a value owned here: the ledger records it and the
  // value is kept alive until every fork is deleted.
  void add_fork_locked(const c10::intrusive_ptr<OwnerRRef>& owner, const Id& fork, int holder);
  // Carries out a ledger event's effects: sends its controls now, collects what to
  // release and complete once the lock is gone.
  Outcome apply_locked(Effects effects);
  void finish(Outcome outcome, std::exception_ptr error = nullptr);
  void control_done(const Control& c, std::exception_ptr error);

  // --- rref_controls.cc: control messages --------------------------------------------------
  FuturePtr on_user_delete(const WorkerInfo& from, Message m);
  FuturePtr on_fork_request(const WorkerInfo& from, Message m);
  FuturePtr on_child_accept(const WorkerInfo& from, Message m);
  FuturePtr on_control_batch(const WorkerInfo& from, Message m);
  // Applies one control from `from`; throws what the single message's handler would.
  void apply_control(const WorkerInfo& from, int32_t type, const rref::Control& control);
  // The interceptor's halves: controls waiting to ride to `to` go on `m`; those riding on
  // a message from `from` are applied (before its handler or its caller's future).
  void carry_controls(const WorkerInfo& to, Message& m);
  void apply_carried_controls(const WorkerInfo& from, Message& m);

  // --- rref_calls.cc: calls on RRefs ----------------------------------------------------------
  FuturePtr on_remote_call(const WorkerInfo& from, Message m);
  FuturePtr on_fetch(const WorkerInfo& from, Message m);
  FuturePtr on_apply(const WorkerInfo& from, Message m);
  FuturePtr reply_with_value(const FuturePtr& value, int32_t type, int peer);

  RpcAgent& agent_;
  Executor& executor_;
  const Run run_;
  const Apply apply_;
  const RRefOptions options_;
  std::atomic<int64_t> next_local_{0};
  std::shared_ptr<ControlChannel> controls_;  // set by install()
  std::mutex remote_mu_;                      // orders remote calls' ids with their sending

  std::mutex mu_;
  std::condition_variable changed_;
  // Guarded by mu_.
  ForkLedger ledger_;
  std::map<Id, c10::intrusive_ptr<OwnerRRef>> kept_;            // the values the ledger keeps
  std::map<Id, c10::intrusive_ptr<RRefImpl>> children_;         // references kept for pending children
  std::map<Id, FuturePtr> confirmations_;                       // user fork -> its confirmation, until done
  std::map<Id, c10::weak_intrusive_ptr<OwnerRRef>> all_owners_;  // every live owner record
  int64_t live_owner_values_ = 0;
};

}  // namespace rref_internal
}  // namespace drpc
