#pragma once

// Internal to //process_group: the rules of the connections between ranks, without the
// network. Which hello a rank sends and whether a dialling peer's hello is accepted (job
// token, group, world size, rank), the goodbye handshake, and the heartbeat bookkeeping
// that declares a silent peer lost. A transport (grpc_transport.cc) tells it what arrived
// and when, and does what it answers. No gRPC type here.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "process_group/proto/frame.pb.h"
#include "process_group/transport.h"

namespace drpc {

// Who this rank is, as its hello says and as a peer's hello must match.
struct ConnectionIdentity {
  int rank = 0;
  int size = 1;
  std::string token;  // the job token; empty: none required
  std::string group;
};

// The hello `self` sends first on every stream (and the higher rank sends back to accept).
pg::FrameHeader hello_header(const ConnectionIdentity& self);

// A frame of `kind` with nothing else in it: GOODBYE, GOODBYE_ACK, HEARTBEAT.
pg::FrameHeader control_header(pg::FrameHeader::Kind kind);

// What a dialling peer's first message said: the rank it is, or why it is refused.
struct HelloVerdict {
  int rank = -1;
  std::string problem;  // empty: accepted
};

// What to do with a frame that arrived on an established stream.
enum class FrameAction {
  kIgnore,               // hello, heartbeat, and the goodbye acknowledgement (recorded)
  kAcknowledgeGoodbye,   // the peer is leaving: send it GOODBYE_ACK
  kDeliver,              // for the sink
};

// The state of this rank's connection to every other. Thread-safe.
class ConnectionProtocol {
 public:
  using Clock = std::chrono::steady_clock;

  // Heartbeats: a connected peer from which nothing arrived for `heartbeat_misses`
  // intervals is lost (check_heartbeats).
  ConnectionProtocol(ConnectionIdentity self, std::chrono::milliseconds heartbeat_interval, int heartbeat_misses);

  const ConnectionIdentity& self() const { return self_; }

  // --- connecting ---------------------------------------------------------------------
  // The address this rank dials or was dialled from, for messages.
  void set_address(int peer, std::string address);
  std::string address(int peer);

  // Reads the first message on a stream a peer dialled (as the pieces of one network
  // message) and decides whether it may join. Accepting claims the peer's rank, so a
  // second stream claiming it is refused. Never throws: malformed bytes are a problem.
  HelloVerdict accept_hello(const std::vector<ByteSpan>& message);

  // The stream to `peer` is established (its hello, or our acceptance, was exchanged).
  void connected(int peer, std::string address, Clock::time_point now);
  // The stream this rank dialled to `peer` ended before the peer answered: `reason` is
  // the peer's refusal.
  void refused(int peer, const std::string& reason);
  // ... or it broke (`how`: e.g. the network's status), which says nothing of our hello.
  void ended_before_answer(int peer, const std::string& how);

  // Waits until every peer is connected; throws kUnauthenticated when a peer refused this
  // rank, kPeerUnavailable when a stream ended before its peer answered, kTimeout naming
  // the missing ranks at `deadline`.
  void wait_connected(Clock::time_point deadline, std::chrono::milliseconds timeout);

  // --- established streams ------------------------------------------------------------
  // Anything arrived from `peer` at `now`. Lock-free: called on every message.
  void heard_from(int peer, Clock::time_point now);
  // Records what `header` means for the connection and says what to do with the frame.
  FrameAction on_frame(int peer, const pg::FrameHeader& header);

  // Peers that are connected and not lost: whom a leaving rank says goodbye to.
  std::vector<int> connected_peers();
  // Waits up to `timeout` until each of `peers` acknowledged our goodbye or was lost.
  bool wait_goodbyes_acknowledged(const std::vector<int>& peers, std::chrono::milliseconds timeout);

  // The result of one heartbeat round.
  struct HeartbeatRound {
    std::vector<int> beat;                    // send these a heartbeat
    std::vector<std::pair<int, Error>> lost;  // silent too long: call lose() with these
  };
  // Live peers (connected, not lost, not leaving) that were heard from within the window
  // get a heartbeat; the others are silent too long at `now`.
  HeartbeatRound check_heartbeats(Clock::time_point now);

  // What lose() found.
  struct Loss {
    Error error;        // `why`, or "rank N shut down" when the peer had said goodbye
    bool was_connected;  // whether anyone was told the peer had joined: report the loss
  };
  // The stream to `peer` is gone. Returns what to report the first time, nothing after.
  std::optional<Loss> lose(int peer, const Error& why);
  bool is_lost(int peer) const;
  // The error for a stream to `peer` that broke.
  Error lost_error(int peer);

 private:
  struct Peer {
    // Guarded by mu_.
    std::string address;
    bool connected = false;
    bool server_attached = false;  // a stream the peer dialled was accepted
    bool said_goodbye = false;
    bool acked_goodbye = false;
    std::string refusal;  // why the peer refused our hello
    std::string failure;  // how our stream ended before the peer answered, if not refused
    std::atomic<bool> lost{false};          // written under mu_
    std::atomic<int64_t> last_heard_ns{0};  // Clock; when anything last arrived
  };

  std::string check_hello(const pg::FrameHeader& hello);

  const ConnectionIdentity self_;
  const std::chrono::milliseconds heartbeat_interval_;
  const int heartbeat_misses_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::mutex mu_;
  std::condition_variable changed_;
};

}  // namespace drpc
