#include "rref/fork_ledger.h"

#include <iterator>

namespace drpc {
namespace rref_internal {

void Effects::append(Effects other) {
  auto move_all = [](auto& to, auto& from) { to.insert(to.end(), from.begin(), from.end()); };
  move_all(controls, other.controls);
  move_all(confirmed_users, other.confirmed_users);
  move_all(lost_users, other.lost_users);
  move_all(released_owners, other.released_owners);
  move_all(released_children, other.released_children);
  forks_dropped += other.forks_dropped;
}

void ForkLedger::send(Effects* effects, int to, int32_t type, const Id& rref, const Id& fork) const {
  if (stopped_ || failed_.count(to)) return;  // nobody there to tell
  effects->controls.push_back(Control{to, type, rref, fork});
}

void ForkLedger::drop_kept(Effects* effects, const Id& rref) {
  if (kept_.erase(rref)) effects->released_owners.push_back(rref);
}

// --- the owner's side ---------------------------------------------------------------------

void ForkLedger::add_fork(const Id& rref, const Id& fork, int holder) {
  kept_.insert(rref);
  forks_[rref].emplace(fork, holder);
}

Effects ForkLedger::user_deleted(const Id& rref, const Id& fork) {
  Effects effects;
  auto forks = forks_.find(rref);
  if (forks == forks_.end()) return effects;
  forks->second.erase(fork);
  if (forks->second.empty()) {
    forks_.erase(forks);
    drop_kept(&effects, rref);
  }
  return effects;
}

Effects ForkLedger::returned_to_owner(const Id& rref, const Id& fork, int parent) {
  Effects effects;
  if (parent != self_) send(&effects, parent, kRRefChildAccept, rref, fork);
  return effects;
}

// --- records that overtook their remote call ----------------------------------------------

// Its creator's remote call can no longer come when the creator is gone, when it is this
// worker's own id or the asker is the creator (the remote call went first on the same
// stream), or when the id is at or below the creator's latest remote call here (they
// come in order).
Unknown ForkLedger::classify_unknown(const Id& rref, int from) const {
  if (failed_.count(rref.worker)) return Unknown::kCreatorGone;
  auto latest = latest_remote_call_.find(rref.worker);
  if (rref.worker == self_ || rref.worker == from ||
      (latest != latest_remote_call_.end() && rref.local <= latest->second)) {
    return Unknown::kGone;
  }
  return Unknown::kMayStillCome;
}

void ForkLedger::add_placeholder(const Id& rref) {
  kept_.insert(rref);
  placeholders_.insert(rref);
}

std::vector<Id> ForkLedger::remote_call_arrived(const Id& rref) {
  placeholders_.erase(rref);
  int64_t& latest = latest_remote_call_.emplace(rref.worker, -1).first->second;
  latest = std::max(latest, rref.local);
  std::vector<Id> dead;
  for (auto p = placeholders_.lower_bound(Id{rref.worker, -1});
       p != placeholders_.end() && p->worker == rref.worker && p->local < rref.local;) {
    kept_.erase(*p);
    forks_.erase(*p);
    dead.push_back(*p);
    p = placeholders_.erase(p);
  }
  return dead;
}

// --- the user's side ----------------------------------------------------------------------

void ForkLedger::user_created(const Id& rref, const Id& fork, int owner) { users_[fork] = User{rref, owner}; }

Effects ForkLedger::user_destroyed(const Id& fork) {
  Effects effects;
  auto it = users_.find(fork);
  if (it == users_.end()) return effects;
  User& user = it->second;
  user.alive = false;
  if (user.released) {
    users_.erase(it);  // its delete was sent already, or can never be
  } else if (user.confirmed) {
    send(&effects, user.owner, kRRefUserDelete, user.rref, fork);
    users_.erase(it);
  }  // else: deleted when the owner confirms it
  return effects;
}

Effects ForkLedger::user_received(const Id& rref, const Id& fork, int owner, int parent) {
  if (parent == owner) return confirmed(fork);  // the owner recorded the fork before sending it
  Effects effects;
  fork_parents_[fork] = parent;
  send(&effects, owner, kRRefForkRequest, rref, fork);
  return effects;
}

void ForkLedger::child_pending(const Id& fork, int child, int owner) { pending_children_[fork] = Child{child, owner}; }

Effects ForkLedger::child_accepted(const Id& fork) {
  Effects effects;
  if (pending_children_.erase(fork)) effects.released_children.push_back(fork);
  return effects;
}

Effects ForkLedger::confirmed(const Id& fork) {
  Effects effects;
  auto parent = fork_parents_.find(fork);
  if (parent != fork_parents_.end()) {
    send(&effects, parent->second, kRRefChildAccept, Id{}, fork);
    fork_parents_.erase(parent);
  }
  auto it = users_.find(fork);
  if (it == users_.end()) return effects;
  User& user = it->second;
  if (!user.confirmed) effects.confirmed_users.push_back(fork);
  user.confirmed = true;
  if (!user.alive) {
    if (!user.released) send(&effects, user.owner, kRRefUserDelete, user.rref, fork);
    users_.erase(it);
  }
  return effects;
}

// --- the job ------------------------------------------------------------------------------

Effects ForkLedger::peer_failed(int peer, const std::string& reason, const std::function<bool(const Id&)>& filled,
                                std::vector<Id>* unfilled) {
  Effects effects;
  if (stopped_ || failed_.count(peer)) return effects;
  failed_[peer] = reason;
  for (auto rref = forks_.begin(); rref != forks_.end();) {
    for (auto fork = rref->second.begin(); fork != rref->second.end();) {
      if (fork->second == peer) {
        fork = rref->second.erase(fork);
        ++effects.forks_dropped;
      } else {
        ++fork;
      }
    }
    if (!rref->second.empty()) {
      ++rref;
      continue;
    }
    drop_kept(&effects, rref->first);
    rref = forks_.erase(rref);
  }
  // Records made for RRefs the gone worker was creating here, which nothing will fill.
  for (auto it = kept_.begin(); it != kept_.end();) {
    if (it->worker == peer && !filled(*it)) {
      unfilled->push_back(*it);
      effects.released_owners.push_back(*it);
      forks_.erase(*it);
      placeholders_.erase(*it);
      it = kept_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = users_.begin(); it != users_.end();) {
    User& user = it->second;
    if (user.owner != peer) {
      ++it;
      continue;
    }
    if (!user.confirmed) effects.lost_users.push_back(it->first);
    user.confirmed = true;
    user.released = true;  // no delete can reach a gone owner
    it = user.alive ? std::next(it) : users_.erase(it);
  }
  for (auto it = pending_children_.begin(); it != pending_children_.end();) {
    if (it->second.child == peer || it->second.owner == peer) {
      effects.released_children.push_back(it->first);
      it = pending_children_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = fork_parents_.begin(); it != fork_parents_.end();) {
    it = it->second == peer ? fork_parents_.erase(it) : std::next(it);
  }
  return effects;
}

std::optional<std::string> ForkLedger::failure_of(int worker) const {
  auto it = failed_.find(worker);
  if (it == failed_.end()) return std::nullopt;
  return it->second;
}

bool ForkLedger::settled() const {
  if (!pending_children_.empty()) return false;
  for (const auto& [fork, user] : users_) {
    if (!user.confirmed) return false;
  }
  return true;
}

Effects ForkLedger::release_all() {
  Effects effects;
  for (auto it = users_.begin(); it != users_.end();) {
    User& user = it->second;
    if (!user.released && user.confirmed) {
      user.released = true;
      send(&effects, user.owner, kRRefUserDelete, user.rref, it->first);
    }
    it = user.alive ? std::next(it) : users_.erase(it);
  }
  return effects;
}

Effects ForkLedger::stop() {
  Effects effects;
  stopped_ = true;
  effects.released_owners.assign(kept_.begin(), kept_.end());
  kept_.clear();
  forks_.clear();
  return effects;
}

int64_t ForkLedger::live_users() const {
  int64_t n = 0;
  for (const auto& [fork, user] : users_) n += user.alive && !user.released;
  return n;
}

int64_t ForkLedger::unconfirmed_users() const {
  int64_t n = 0;
  for (const auto& [fork, user] : users_) n += !user.confirmed;
  return n;
}

std::vector<std::string> ForkLedger::leaks() const {
  std::vector<std::string> out;
  for (const Id& rref : kept_) {
    std::string forks;
    auto it = forks_.find(rref);
    if (it != forks_.end()) {
      for (const auto& [fork, holder] : it->second) forks += (forks.empty() ? "" : ", ") + fork.str();
    }
    out.push_back("RRef " + rref.str() + " still referenced by forks " + forks);
  }
  return out;
}

}  // namespace rref_internal
}  // namespace drpc
