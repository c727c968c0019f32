#pragma once

// The fork / confirm / delete protocol's bookkeeping for one worker, as a pure state
// machine: which forks of the values it owns exist and where, which references it holds
// and whether their owners know them, which forks it handed on and waits to see
// confirmed. No I/O, no lock, no clock, no tensors: each event returns the Effects the
// caller must carry out (control messages to send, keep-alive references to drop,
// confirmations to complete). rref_context.cc holds the objects behind the ids and runs
// the ledger under its lock; fork_ledger_test.cc drives it through the protocol's orders.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rref/message_types.h"
#include "rref/rref_id.h"

namespace drpc {
namespace rref_internal {

// What an event asks of the caller, in this order: send `controls`; complete the
// confirmations of `confirmed_users` (with the event's error, if it had one) and fail
// those of `lost_users` (their owner is gone); release the values in `released_owners`
// (no fork refers to them any more) and the references in `released_children` (the
// owner confirmed the child they were kept for).
struct Effects {
  std::vector<Control> controls;
  std::vector<Id> confirmed_users;
  std::vector<Id> lost_users;
  std::vector<Id> released_owners;
  std::vector<Id> released_children;
  int forks_dropped = 0;  // by peer_failed: forks the gone worker held here

  void append(Effects other);
};

// Why a request names an RRef this worker has no record of.
enum class Unknown {
  kMayStillCome,  // its remote call may still arrive (the request overtook it): wait
  kCreatorGone,   // its creator is gone: it can never arrive
  kGone,          // freed already, or never created here
};

class ForkLedger {
 public:
  explicit ForkLedger(int self) : self_(self) {}
  ForkLedger(const ForkLedger&) = delete;
  ForkLedger& operator=(const ForkLedger&) = delete;

  // --- the owner's side -------------------------------------------------------------
  // `holder` has (or is about to receive) fork `fork` of `rref`, owned here: the value is
  // kept until every fork is deleted. Idempotent.
  void add_fork(const Id& rref, const Id& fork, int holder);
  // The value of `rref` is kept (a request made a record for it) until its forks go.
  void keep(const Id& rref) { kept_.insert(rref); }
  // A user deleted `fork`. A repeated delete changes nothing.
  Effects user_deleted(const Id& rref, const Id& fork);
  // A user shared `rref` back with its owner (this worker): `parent` may drop its
  // reference at once. Nothing when the owner shared with itself.
  Effects returned_to_owner(const Id& rref, const Id& fork, int parent);

  // --- records that overtook their remote call ----------------------------------------
  // A request from `from` names `rref`, of which this worker has no record.
  Unknown classify_unknown(const Id& rref, int from) const;
  // A record made for such a request; kept until its remote call fills it or fails.
  void add_placeholder(const Id& rref);
  // The remote call creating `rref` arrived: the placeholders its creator made below it
  // can never be filled; they are returned (and forgotten with their forks).
  std::vector<Id> remote_call_arrived(const Id& rref);

  // --- the user's side ----------------------------------------------------------------
  // A reference to `rref` owned by `owner`, as fork `fork`, exists on this worker.
  void user_created(const Id& rref, const Id& fork, int owner);
  // Its last handle here is gone: the owner is told once it knows the fork (deleting an
  // unconfirmed fork could free the value too early).
  Effects user_destroyed(const Id& fork);
  // This worker received fork `fork` of `rref` from `parent`: the owner is asked to record
  // it, unless the owner itself sent it (then it is confirmed at once).
  Effects user_received(const Id& rref, const Id& fork, int owner, int parent);
  // This worker handed its reference on to `child` as `fork`; it keeps its own until the
  // owner confirms the child (child_accepted).
  void child_pending(const Id& fork, int child, int owner);
  Effects child_accepted(const Id& fork);
  // The owner knows `fork` now (or its creation failed: a later delete is harmless).
  Effects confirmed(const Id& fork);

  // --- the job ------------------------------------------------------------------------
  // `peer` is gone for `reason`: its forks of values owned here are dropped, references
  // to values it owns fail, nothing waits for it, and records of RRefs it was creating
  // here whose value is not `filled` are released (returned in `released_owners` too,
  // and listed in `unfilled`). Once per peer; later controls to it are never sent.
  Effects peer_failed(int peer, const std::string& reason, const std::function<bool(const Id&)>& filled,
                      std::vector<Id>* unfilled);
  // Why `worker` is gone, if it is.
  std::optional<std::string> failure_of(int worker) const;
  // Every fork this worker made or received is confirmed.
  bool settled() const;
  // Graceful leave: deletes every confirmed user reference this worker still holds.
  Effects release_all();
  // Stop: nothing is sent any more; every kept value is released.
  Effects stop();
  bool stopped() const { return stopped_; }

  // For counts() and leaks().
  int64_t kept_values() const { return static_cast<int64_t>(kept_.size()); }
  int64_t pending_children() const { return static_cast<int64_t>(pending_children_.size()); }
  int64_t live_users() const;
  int64_t unconfirmed_users() const;
  // "RRef a:b still referenced by forks c:d, ..." for each value kept here.
  std::vector<std::string> leaks() const;

 private:
  struct User {
    Id rref;
    int owner = -1;
    bool confirmed = false;  // the owner knows the fork
    bool alive = true;       // some handle on this worker still refers to it
    bool released = false;   // its delete was sent (release_all) or can never be (owner gone)
  };
  struct Child {
    int child = -1;
    int owner = -1;
  };

  void send(Effects* effects, int to, int32_t type, const Id& rref, const Id& fork) const;
  void drop_kept(Effects* effects, const Id& rref);

  const int self_;
  bool stopped_ = false;
  std::set<Id> kept_;                           // owned values kept for forks or requests
  std::map<Id, std::map<Id, int>> forks_;       // owned rref -> fork -> holder
  std::set<Id> placeholders_;                   // records made by requests that overtook their remote call
  std::map<int, int64_t> latest_remote_call_;   // creator -> highest id of its remote calls here
  std::map<Id, User> users_;                    // fork -> reference held here
  std::map<Id, Child> pending_children_;        // fork handed on -> awaiting the owner
  std::map<Id, int> fork_parents_;              // fork received -> who shared it
  std::map<int, std::string> failed_;           // worker -> why it is gone
};

}  // namespace rref_internal
}  // namespace drpc
