// The fork / confirm / delete state machine on its own: each event's effects, and a model
// of three workers whose control messages and replies are delivered in every order a
// seeded shuffle finds, checking PyTorch's guarantee: the owner keeps the value exactly as
// long as some worker holds a reference, and frees it once none does.

#include "rref/fork_ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>

namespace drpc {
namespace rref_internal {
namespace {

const Id kValue{0, 0};

bool has_control(const Effects& e, int to, int32_t type, const Id& fork) {
  return std::any_of(e.controls.begin(), e.controls.end(),
                     [&](const Control& c) { return c.to == to && c.type == type && c.fork == fork; });
}

std::vector<Id> just(int worker, int64_t local) { return {Id{worker, local}}; }

auto always_filled = [](const Id&) { return true; };

TEST(ForkLedger, TheOwnerKeepsAValueUntilItsLastForkIsDeleted) {
  ForkLedger owner(0);
  owner.add_fork(kValue, Id{0, 1}, 1);
  owner.add_fork(kValue, Id{0, 2}, 2);
  owner.add_fork(kValue, Id{0, 2}, 2);  // idempotent
  EXPECT_EQ(owner.kept_values(), 1);
  EXPECT_TRUE(owner.user_deleted(kValue, Id{0, 1}).released_owners.empty());
  EXPECT_TRUE(owner.user_deleted(kValue, Id{0, 1}).released_owners.empty());  // repeated: nothing
  EXPECT_EQ(owner.user_deleted(kValue, Id{0, 2}).released_owners, std::vector<Id>{kValue});
  EXPECT_EQ(owner.kept_values(), 0);
  EXPECT_TRUE(owner.user_deleted(kValue, Id{0, 2}).released_owners.empty());
}

TEST(ForkLedger, AnUnconfirmedUserIsDeletedOnlyOnceItsOwnerKnowsIt) {
  ForkLedger user(1);
  const Id fork{2, 7};
  user.user_created(kValue, fork, 0);
  Effects received = user.user_received(kValue, fork, /*owner=*/0, /*parent=*/2);
  EXPECT_TRUE(has_control(received, 0, kRRefForkRequest, fork));
  EXPECT_TRUE(user.user_destroyed(fork).controls.empty());  // the owner may not know it yet
  EXPECT_FALSE(user.settled());
  Effects confirmed = user.confirmed(fork);
  EXPECT_EQ(confirmed.confirmed_users, std::vector<Id>{fork});
  EXPECT_TRUE(has_control(confirmed, 2, kRRefChildAccept, fork));  // the parent may let go
  EXPECT_TRUE(has_control(confirmed, 0, kRRefUserDelete, fork));   // and the delete follows
  EXPECT_TRUE(user.settled());
  EXPECT_EQ(user.live_users(), 0);
  EXPECT_TRUE(user.confirmed(fork).controls.empty());  // a late repeat changes nothing
}

TEST(ForkLedger, AForkFromTheOwnerIsConfirmedAtOnce) {
  ForkLedger user(1);
  user.user_created(kValue, Id{0, 3}, 0);
  Effects received = user.user_received(kValue, Id{0, 3}, 0, 0);
  EXPECT_TRUE(received.controls.empty());
  EXPECT_EQ(received.confirmed_users, just(0, 3));
  EXPECT_TRUE(has_control(user.user_destroyed(Id{0, 3}), 0, kRRefUserDelete, Id{0, 3}));
}

TEST(ForkLedger, AParentKeepsItsReferenceUntilTheChildIsAccepted) {
  ForkLedger parent(1);
  parent.child_pending(Id{1, 5}, /*child=*/2, /*owner=*/0);
  EXPECT_FALSE(parent.settled());
  EXPECT_EQ(parent.child_accepted(Id{1, 5}).released_children, just(1, 5));
  EXPECT_TRUE(parent.child_accepted(Id{1, 5}).released_children.empty());
  EXPECT_TRUE(parent.settled());
}

TEST(ForkLedger, AUserSharingBackWithTheOwnerIsReleasedAtOnce) {
  ForkLedger owner(0);
  EXPECT_TRUE(has_control(owner.returned_to_owner(kValue, Id{1, 4}, 1), 1, kRRefChildAccept, Id{1, 4}));
  EXPECT_TRUE(owner.returned_to_owner(kValue, Id{0, 4}, 0).controls.empty());
}

TEST(ForkLedger, RequestsThatOvertookTheirRemoteCallWaitOnlyWhileItCanStillCome) {
  ForkLedger owner(0);
  EXPECT_EQ(owner.classify_unknown(Id{0, 9}, 1), Unknown::kGone);        // its own ids
  EXPECT_EQ(owner.classify_unknown(Id{1, 9}, 1), Unknown::kGone);        // the creator asks
  EXPECT_EQ(owner.classify_unknown(Id{1, 9}, 2), Unknown::kMayStillCome);
  owner.add_placeholder(Id{1, 3});
  owner.add_placeholder(Id{1, 9});
  owner.add_placeholder(Id{2, 1});
  EXPECT_EQ(owner.kept_values(), 3);
  // Worker 1's remote call 5 arrives: its call 3 never will.
  EXPECT_EQ(owner.remote_call_arrived(Id{1, 5}), just(1, 3));
  EXPECT_EQ(owner.classify_unknown(Id{1, 4}, 2), Unknown::kGone);
  EXPECT_EQ(owner.classify_unknown(Id{1, 6}, 2), Unknown::kMayStillCome);
  EXPECT_EQ(owner.kept_values(), 2);
  std::vector<Id> unfilled;
  owner.peer_failed(1, "killed", [](const Id&) { return false; }, &unfilled);
  EXPECT_EQ(unfilled, just(1, 9));
  EXPECT_EQ(owner.classify_unknown(Id{1, 20}, 2), Unknown::kCreatorGone);
  EXPECT_EQ(*owner.failure_of(1), "killed");
  EXPECT_FALSE(owner.failure_of(2));
}

TEST(ForkLedger, AGonePeerIsForgottenEverywhereAndNeverWrittenTo) {
  ForkLedger ledger(0);
  ledger.add_fork(kValue, Id{0, 1}, 2);          // worker 2 holds our value
  ledger.add_fork(Id{0, 5}, Id{0, 6}, 2);
  ledger.add_fork(Id{0, 5}, Id{0, 7}, 3);        // and worker 3 a fork of another
  ledger.user_created(Id{2, 0}, Id{0, 8}, 2);    // we hold worker 2's value, unconfirmed
  ledger.user_created(Id{3, 0}, Id{0, 9}, 3);    // and worker 3's
  ledger.child_pending(Id{0, 10}, /*child=*/2, /*owner=*/3);
  ledger.child_pending(Id{0, 11}, /*child=*/3, /*owner=*/2);
  std::vector<Id> unfilled;
  Effects gone = ledger.peer_failed(2, "heartbeat", always_filled, &unfilled);
  EXPECT_EQ(gone.forks_dropped, 2);
  EXPECT_EQ(gone.released_owners, std::vector<Id>{kValue});
  EXPECT_EQ(gone.lost_users, just(0, 8));
  EXPECT_EQ(gone.released_children.size(), 2u);
  EXPECT_EQ(ledger.kept_values(), 1);
  EXPECT_TRUE(ledger.peer_failed(2, "again", always_filled, &unfilled).lost_users.empty());  // once per peer
  EXPECT_TRUE(ledger.user_destroyed(Id{0, 8}).controls.empty());  // no delete to a gone owner
  EXPECT_TRUE(ledger.returned_to_owner(kValue, Id{2, 1}, 2).controls.empty());
  EXPECT_EQ(ledger.unconfirmed_users(), 1);  // worker 3's
}

TEST(ForkLedger, LeavingDeletesConfirmedReferencesOnceAndStoppingSendsNothing) {
  ForkLedger ledger(1);
  ledger.user_created(kValue, Id{0, 1}, 0);
  ledger.confirmed(Id{0, 1});
  ledger.user_created(kValue, Id{2, 1}, 0);  // unconfirmed: not deleted by a leave
  Effects leave = ledger.release_all();
  ASSERT_EQ(leave.controls.size(), 1u);
  EXPECT_TRUE(has_control(leave, 0, kRRefUserDelete, Id{0, 1}));
  EXPECT_TRUE(ledger.release_all().controls.empty());
  EXPECT_TRUE(ledger.user_destroyed(Id{0, 1}).controls.empty());  // deleted already
  ledger.add_fork(Id{1, 9}, Id{1, 10}, 0);
  Effects stop = ledger.stop();
  EXPECT_EQ(stop.released_owners, just(1, 9));
  EXPECT_TRUE(ledger.confirmed(Id{2, 1}).controls.empty());
  EXPECT_TRUE(ledger.stopped());
}

// --- the model ------------------------------------------------------------------------------
// Worker 0 owns the value and gives worker 1 a reference; worker 1 hands it on to worker
// 2, which hands it back to worker 1 as a second reference; every application handle is
// dropped at a random moment. Messages (controls and the owner's fork-request acks) are
// delivered in a random order, each exactly once (the control channel retries lost ones).
class Model {
 public:
  explicit Model(uint32_t seed) : rng_(seed) {
    for (int w = 0; w < 3; ++w) ledgers_.push_back(std::make_unique<ForkLedger>(w));
  }

  void run() {
    // Worker 0 shares with worker 1 (a fork the owner records itself).
    const Id f1{0, 1};
    ledgers_[0]->add_fork(kValue, f1, 1);
    user_arrives(1, f1, /*parent=*/0);
    // Worker 1 hands its reference on to worker 2, which hands it on to worker 1 again.
    const Id f2{1, 1}, f3{2, 1};
    hand_on(1, f1, 2, f2);
    hand_on(2, f2, 1, f3);
    while (!pending_.empty() || !app_.empty()) {
      check_value_kept();
      std::uniform_int_distribution<size_t> pick(0, pending_.size() + app_.size() - 1);
      const size_t i = pick(rng_);
      if (i < pending_.size()) {
        Msg m = pending_[i];
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
        deliver(m);
      } else {
        auto it = std::next(app_.begin(), static_cast<std::ptrdiff_t>(i - pending_.size()));
        Id fork = *it;
        app_.erase(it);
        maybe_destroy(fork);
      }
    }
    check_value_kept();
    EXPECT_EQ(ledgers_[0]->kept_values(), 0) << "the value outlived every reference";
    for (auto& l : ledgers_) {
      EXPECT_TRUE(l->settled());
      EXPECT_EQ(l->live_users(), 0);
    }
    EXPECT_TRUE(handles_.empty());
  }

 private:
  struct Msg {
    int from, to;
    int32_t type;  // a control type, or kAck: the owner's answer to a fork request
    Id fork;
  };
  static constexpr int32_t kAck = -1;

  void user_arrives(int w, const Id& fork, int parent) {
    handles_[fork] = w;
    app_.push_back(fork);
    ledgers_[w]->user_created(kValue, fork, 0);
    send(w, ledgers_[w]->user_received(kValue, fork, 0, parent));
  }

  // Worker `w` sends its reference `fork` on as `child` (its own handle is kept for it).
  void hand_on(int w, const Id& fork, int to, const Id& child) {
    ledgers_[w]->child_pending(child, to, 0);
    kept_for_child_[child] = fork;
    user_arrives(to, child, w);
  }

  void send(int from, const Effects& e) {
    for (const Control& c : e.controls) pending_.push_back(Msg{from, c.to, c.type, c.fork});
    for (const Id& child : e.released_children) {
      Id parent_fork = kept_for_child_.at(child);
      kept_for_child_.erase(child);
      maybe_destroy(parent_fork);
    }
    EXPECT_TRUE(e.released_owners.empty() || from == 0);
    if (!e.released_owners.empty()) value_freed_ = true;
  }

  void deliver(const Msg& m) {
    ForkLedger& to = *ledgers_[m.to];
    switch (m.type) {
      case kRRefForkRequest:
        to.add_fork(kValue, m.fork, m.from);
        pending_.push_back(Msg{m.to, m.from, kAck, m.fork});
        break;
      case kAck:
        send(m.to, to.confirmed(m.fork));
        break;
      case kRRefChildAccept:
        send(m.to, to.child_accepted(m.fork));
        break;
      case kRRefUserDelete:
        send(m.to, to.user_deleted(kValue, m.fork));
        break;
      default:
        ADD_FAILURE() << "unexpected message " << m.type;
    }
  }

  // A handle goes once the application dropped it and no pending child keeps it.
  void maybe_destroy(const Id& fork) {
    if (std::find(app_.begin(), app_.end(), fork) != app_.end()) return;
    for (const auto& [child, parent] : kept_for_child_) {
      if (parent == fork) return;
    }
    auto it = handles_.find(fork);
    if (it == handles_.end()) return;
    const int w = it->second;
    handles_.erase(it);
    send(w, ledgers_[w]->user_destroyed(fork));
  }

  void check_value_kept() {
    if (!handles_.empty()) {
      EXPECT_FALSE(value_freed_) << "the value was freed while a reference existed";
    }
  }

  std::mt19937 rng_;
  std::vector<std::unique_ptr<ForkLedger>> ledgers_;
  std::vector<Msg> pending_;
  std::vector<Id> app_;                   // handles the application still holds
  std::map<Id, int> handles_;             // live user handles -> their worker
  std::map<Id, Id> kept_for_child_;       // pending child fork -> the parent's fork kept for it
  bool value_freed_ = false;
};

TEST(ForkLedger, InEveryDeliveryOrderTheValueLivesExactlyAsLongAsAReference) {
  for (uint32_t seed = 0; seed < 3000; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Model(seed).run();
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace rref_internal
}  // namespace drpc
