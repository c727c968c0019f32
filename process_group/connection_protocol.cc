// The rules of the connections between ranks, without the network (connection_protocol.h).

#include "process_group/connection_protocol.h"

#include "process_group/security.h"

namespace drpc {

using std::chrono::milliseconds;

pg::FrameHeader hello_header(const ConnectionIdentity& self) {
  pg::FrameHeader hello;
  hello.set_kind(pg::FrameHeader::HELLO);
  hello.set_rank(self.rank);
  hello.set_world_size(self.size);
  hello.set_token(self.token);
  hello.set_group(self.group);
  return hello;
}

pg::FrameHeader control_header(pg::FrameHeader::Kind kind) {
  pg::FrameHeader header;
  header.set_kind(kind);
  return header;
}

ConnectionProtocol::ConnectionProtocol(ConnectionIdentity self, milliseconds heartbeat_interval, int heartbeat_misses)
    : self_(std::move(self)), heartbeat_interval_(heartbeat_interval), heartbeat_misses_(heartbeat_misses) {
  for (int r = 0; r < self_.size; ++r) peers_.push_back(std::make_unique<Peer>());
}

void ConnectionProtocol::set_address(int peer, std::string address) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_.at(peer)->address = std::move(address);
}

std::string ConnectionProtocol::address(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  return peers_.at(peer)->address;
}

HelloVerdict ConnectionProtocol::accept_hello(const std::vector<ByteSpan>& message) {
  HelloVerdict verdict;
  try {
    const std::vector<Frame> frames = decode_wire_frames(message, nullptr, -1);
    verdict.problem = frames.size() == 1 ? check_hello(frames[0].header) : "expected one hello frame";
    if (verdict.problem.empty()) verdict.rank = frames[0].header.rank();
  } catch (const Error& e) {
    verdict.problem = e.what();
  }
  return verdict;
}

// Empty if `hello` may join this rank's group, else why not; claims the rank if so.
std::string ConnectionProtocol::check_hello(const pg::FrameHeader& hello) {
  if (hello.kind() != pg::FrameHeader::HELLO) return "first frame is not a hello";
  if (!token_matches(hello.token(), self_.token)) return "wrong or missing job token";
  if (hello.group() != self_.group) {
    return "peer belongs to group '" + hello.group() + "', not '" + self_.group + "'";
  }
  if (hello.world_size() != self_.size) {
    return "peer has world size " + std::to_string(hello.world_size()) + ", this rank has " +
           std::to_string(self_.size);
  }
  if (hello.rank() < 0 || hello.rank() >= self_.rank) {
    return "peer claims rank " + std::to_string(hello.rank()) + ", which does not dial rank " +
           std::to_string(self_.rank);
  }
  std::lock_guard<std::mutex> lock(mu_);
  Peer& p = *peers_[hello.rank()];
  if (p.connected || p.server_attached) return "rank " + std::to_string(hello.rank()) + " is already connected";
  p.server_attached = true;
  return "";
}

void ConnectionProtocol::connected(int peer, std::string address, Clock::time_point now) {
  heard_from(peer, now);
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers_.at(peer)->connected = true;
    peers_[peer]->address = std::move(address);
  }
  changed_.notify_all();
}

void ConnectionProtocol::refused(int peer, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers_.at(peer)->refusal = reason.empty() ? "no reason given" : reason;
  }
  changed_.notify_all();
}

void ConnectionProtocol::ended_before_answer(int peer, const std::string& how) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = *peers_.at(peer);
    p.failure = "the connection to rank " + std::to_string(peer) + " (" + p.address + ") ended before rank " +
                std::to_string(peer) + " answered rank " + std::to_string(self_.rank) + "'s hello (" + how + ")";
  }
  changed_.notify_all();
}

void ConnectionProtocol::wait_connected(Clock::time_point deadline, milliseconds timeout) {
  const int me = self_.rank;
  std::unique_lock<std::mutex> lock(mu_);
  std::string refused, failed;
  auto all_connected = [&] {
    bool all = true;
    for (int r = 0; r < self_.size; ++r) {
      if (!peers_[r]->refusal.empty()) {
        refused = "rank " + std::to_string(r) + " refused rank " + std::to_string(me) + ": " + peers_[r]->refusal;
        return true;
      }
      if (!peers_[r]->failure.empty()) {
        failed = "rank " + std::to_string(me) + ": " + peers_[r]->failure;
        return true;
      }
      if (r != me && !peers_[r]->connected) all = false;
    }
    return all;
  };
  const bool done = changed_.wait_until(lock, deadline, all_connected);
  if (!refused.empty()) throw Error(ErrorKind::kUnauthenticated, refused);
  if (!failed.empty()) throw Error(ErrorKind::kPeerUnavailable, failed);
  if (!done) {
    std::string missing;
    for (int r = 0; r < self_.size; ++r) {
      if (r != me && !peers_[r]->connected) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    throw Error(ErrorKind::kTimeout, "rank " + std::to_string(me) + ": ranks " + missing + " did not connect within " +
                                         std::to_string(timeout.count()) + " ms");
  }
}

void ConnectionProtocol::heard_from(int peer, Clock::time_point now) {
  peers_[peer]->last_heard_ns.store(now.time_since_epoch().count(), std::memory_order_relaxed);
}

FrameAction ConnectionProtocol::on_frame(int peer, const pg::FrameHeader& header) {
  switch (header.kind()) {
    case pg::FrameHeader::GOODBYE: {
      std::lock_guard<std::mutex> lock(mu_);
      peers_[peer]->said_goodbye = true;
      return FrameAction::kAcknowledgeGoodbye;
    }
    case pg::FrameHeader::GOODBYE_ACK: {
      {
        std::lock_guard<std::mutex> lock(mu_);
        peers_[peer]->acked_goodbye = true;
      }
      changed_.notify_all();
      return FrameAction::kIgnore;
    }
    case pg::FrameHeader::HELLO:
    case pg::FrameHeader::HEARTBEAT:
      return FrameAction::kIgnore;
    default:
      return FrameAction::kDeliver;
  }
}

std::vector<int> ConnectionProtocol::connected_peers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> peers;
  for (int r = 0; r < self_.size; ++r) {
    if (r != self_.rank && peers_[r]->connected && !peers_[r]->lost) peers.push_back(r);
  }
  return peers;
}

bool ConnectionProtocol::wait_goodbyes_acknowledged(const std::vector<int>& peers, milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] {
    for (int r : peers) {
      if (!peers_[r]->acked_goodbye && !peers_[r]->lost) return false;
    }
    return true;
  });
}

ConnectionProtocol::HeartbeatRound ConnectionProtocol::check_heartbeats(Clock::time_point now) {
  const auto window = heartbeat_interval_ * heartbeat_misses_;
  HeartbeatRound round;
  std::lock_guard<std::mutex> lock(mu_);
  for (int r = 0; r < self_.size; ++r) {
    const Peer& p = *peers_[r];
    if (r == self_.rank || !p.connected || p.lost || p.said_goodbye) continue;
    const auto silent = std::chrono::duration_cast<milliseconds>(
        now - Clock::time_point(Clock::duration(p.last_heard_ns.load(std::memory_order_relaxed))));
    if (silent > window) {
      round.lost.emplace_back(
          r, Error(ErrorKind::kPeerUnavailable,
                   "rank " + std::to_string(r) + " (" + p.address + ") sent nothing for " +
                       std::to_string(silent.count()) + " ms (" + std::to_string(heartbeat_misses_) +
                       " heartbeats of " + std::to_string(heartbeat_interval_.count()) + " ms missed): declared failed"));
    } else {
      round.beat.push_back(r);
    }
  }
  return round;
}

std::optional<ConnectionProtocol::Loss> ConnectionProtocol::lose(int peer, const Error& why) {
  std::optional<Loss> loss;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Peer& p = *peers_.at(peer);
    if (p.lost) return std::nullopt;
    p.lost = true;
    const std::string reason = p.said_goodbye ? "rank " + std::to_string(peer) + " shut down" : why.message();
    loss.emplace(Loss{Error(why.kind(), reason), p.connected});
  }
  changed_.notify_all();  // a leaving rank stops waiting for this peer's goodbye
  return loss;
}

bool ConnectionProtocol::is_lost(int peer) const { return peers_.at(peer)->lost.load(); }

Error ConnectionProtocol::lost_error(int peer) {
  return Error(ErrorKind::kPeerUnavailable,
               "connection to rank " + std::to_string(peer) + " (" + address(peer) + ") was lost");
}

}  // namespace drpc
