// The connection protocol without a network: hello checks, the goodbye handshake, and
// heartbeat timeouts on an explicit clock.

#include "process_group/connection_protocol.h"

#include <gtest/gtest.h>

#include "process_group/frame.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
using Clock = ConnectionProtocol::Clock;

// A rank of a 4-rank world in group "train" with token "s3cret"; heartbeats every 100 ms,
// a peer silent for 3 of them is lost.
ConnectionIdentity identity(int rank, std::string token = "s3cret") { return {rank, 4, std::move(token), "train"}; }
ConnectionProtocol protocol(int rank) { return ConnectionProtocol(identity(rank), milliseconds(100), 3); }

// One network message holding `headers`, encoded as the transport does.
std::string message(const std::vector<pg::FrameHeader>& headers) {
  struct Bytes final : FramePieces {
    std::string out;
    void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) override {
      std::string piece(size, '\0');
      fill(reinterpret_cast<uint8_t*>(piece.data()));
      out += piece;
    }
    void add_tensor(const at::Tensor&) override { ADD_FAILURE() << "no tensors here"; }
  } bytes;
  for (const auto& h : headers) encode_frame(h, {}, bytes);
  return bytes.out;
}

HelloVerdict accept(ConnectionProtocol& p, const std::string& bytes) {
  return p.accept_hello({ByteSpan{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}});
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class F>
Error error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::kInternal, "no error");
}

TEST(ConnectionProtocol, AMatchingHelloIsAcceptedOnceForItsRank) {
  ConnectionProtocol p(identity(2), milliseconds(100), 3);
  HelloVerdict v = accept(p, message({hello_header(identity(0))}));
  EXPECT_EQ(v.problem, "");
  EXPECT_EQ(v.rank, 0);
  // A second stream claiming rank 0 is refused; rank 1 may still join.
  v = accept(p, message({hello_header(identity(0))}));
  EXPECT_EQ(v.problem, "rank 0 is already connected");
  EXPECT_EQ(v.rank, -1);
  EXPECT_EQ(accept(p, message({hello_header(identity(1))})).rank, 1);
}

TEST(ConnectionProtocol, AWrongTokenIsRefusedNamingTheTokenNotRevealingIt) {
  ConnectionProtocol p = protocol(1);
  HelloVerdict v = accept(p, message({hello_header(identity(0, "guess"))}));
  EXPECT_EQ(v.problem, "wrong or missing job token");
  EXPECT_FALSE(contains(v.problem, "guess") || contains(v.problem, "s3cret")) << v.problem;
  EXPECT_EQ(v.rank, -1);
  EXPECT_EQ(accept(p, message({hello_header(identity(0, ""))})).problem, "wrong or missing job token");
  // The refusal claimed nothing: the right token still gets in.
  EXPECT_EQ(accept(p, message({hello_header(identity(0))})).problem, "");
}

TEST(ConnectionProtocol, HellosFromAnotherJobOrARankThatDoesNotDialAreRefused) {
  ConnectionProtocol p = protocol(2);
  ConnectionIdentity other_group = identity(0);
  other_group.group = "eval";
  EXPECT_EQ(accept(p, message({hello_header(other_group)})).problem, "peer belongs to group 'eval', not 'train'");
  ConnectionIdentity other_size = identity(0);
  other_size.size = 8;
  EXPECT_EQ(accept(p, message({hello_header(other_size)})).problem, "peer has world size 8, this rank has 4");
  // Only lower ranks dial a rank.
  EXPECT_EQ(accept(p, message({hello_header(identity(3))})).problem, "peer claims rank 3, which does not dial rank 2");
  EXPECT_EQ(accept(p, message({hello_header(identity(-1))})).problem,
            "peer claims rank -1, which does not dial rank 2");
}

TEST(ConnectionProtocol, MalformedHelloBytesAreAClearProblemNeverACrash) {
  ConnectionProtocol p = protocol(1);
  EXPECT_EQ(accept(p, "").problem, "expected one hello frame");
  EXPECT_EQ(accept(p, std::string("\x01\x00", 2)).problem, "Protocol: frame shorter than its length prefix");
  EXPECT_EQ(accept(p, std::string("\xff\xff\xff\x00" "abc", 7)).problem,
            "Protocol: frame header length 16777215 exceeds the message (7 bytes)");
  EXPECT_EQ(accept(p, message({control_header(pg::FrameHeader::MESSAGE)})).problem, "first frame is not a hello");
  EXPECT_EQ(accept(p, message({hello_header(identity(0)), control_header(pg::FrameHeader::MESSAGE)})).problem,
            "expected one hello frame");
  // Every truncation and every single-byte corruption of a good hello is refused or
  // accepted, never thrown; a fresh protocol each time, as a claim would refuse the rest.
  const std::string good = message({hello_header(identity(0))});
  for (size_t n = 0; n < good.size(); ++n) {
    ConnectionProtocol fresh = protocol(1);
    EXPECT_NE(accept(fresh, good.substr(0, n)).problem, "") << "truncated to " << n;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    ConnectionProtocol fresh = protocol(1);
    const HelloVerdict v = accept(fresh, bad);
    EXPECT_EQ(v.problem.empty(), v.rank == 0) << "byte " << i;
  }
}

TEST(ConnectionProtocol, ASilentPeerIsDeclaredLostAfterTheHeartbeatWindow) {
  ConnectionProtocol p = protocol(0);
  const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);
  p.connected(1, "10.0.0.1:5000", t0);
  p.connected(2, "10.0.0.2:5000", t0);

  // Within the window (3 x 100 ms) both get heartbeats.
  auto round = p.check_heartbeats(t0 + milliseconds(300));
  EXPECT_EQ(round.beat, (std::vector<int>{1, 2}));
  EXPECT_TRUE(round.lost.empty());

  // Rank 2 spoke; rank 1 stays silent past the window.
  p.heard_from(2, t0 + milliseconds(250));
  round = p.check_heartbeats(t0 + milliseconds(301));
  EXPECT_EQ(round.beat, (std::vector<int>{2}));
  ASSERT_EQ(round.lost.size(), 1u);
  EXPECT_EQ(round.lost[0].first, 1);
  const Error& why = round.lost[0].second;
  EXPECT_EQ(why.kind(), ErrorKind::kPeerUnavailable);
  EXPECT_EQ(why.message(),
            "rank 1 (10.0.0.1:5000) sent nothing for 301 ms (3 heartbeats of 100 ms missed): declared failed");

  // The transport loses it: reported once, then no longer checked.
  auto loss = p.lose(1, why);
  ASSERT_TRUE(loss.has_value());
  EXPECT_TRUE(loss->was_connected);
  EXPECT_EQ(loss->error.message(), why.message());
  EXPECT_TRUE(p.is_lost(1));
  EXPECT_FALSE(p.lose(1, why).has_value());
  round = p.check_heartbeats(t0 + milliseconds(400));
  EXPECT_EQ(round.beat, (std::vector<int>{2}));
  EXPECT_TRUE(round.lost.empty());
  EXPECT_EQ(p.connected_peers(), (std::vector<int>{2}));
}

TEST(ConnectionProtocol, AGoodbyeIsNotALoss) {
  ConnectionProtocol p = protocol(0);
  const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);
  p.connected(1, "a:1", t0);
  p.connected(2, "a:2", t0);
  EXPECT_EQ(p.on_frame(1, control_header(pg::FrameHeader::HEARTBEAT)), FrameAction::kIgnore);
  EXPECT_EQ(p.on_frame(1, control_header(pg::FrameHeader::MESSAGE)), FrameAction::kDeliver);
  EXPECT_EQ(p.on_frame(1, control_header(pg::FrameHeader::GOODBYE)), FrameAction::kAcknowledgeGoodbye);

  // A leaving peer is not expected to keep beating.
  auto round = p.check_heartbeats(t0 + milliseconds(1000));
  ASSERT_EQ(round.lost.size(), 1u);
  EXPECT_EQ(round.lost[0].first, 2);
  EXPECT_TRUE(round.beat.empty());

  // Its stream closing afterwards is reported as a shutdown; rank 2's as what broke.
  const Error broke = p.lost_error(1);
  EXPECT_EQ(broke.message(), "connection to rank 1 (a:1) was lost");
  auto left = p.lose(1, broke);
  ASSERT_TRUE(left.has_value());
  EXPECT_EQ(left->error.kind(), ErrorKind::kPeerUnavailable);
  EXPECT_EQ(left->error.message(), "rank 1 shut down");
  auto lost = p.lose(2, p.lost_error(2));
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->error.message(), "connection to rank 2 (a:2) was lost");

  // A peer that never connected is lost without a report to anyone.
  auto never = p.lose(3, p.lost_error(3));
  ASSERT_TRUE(never.has_value());
  EXPECT_FALSE(never->was_connected);
}

TEST(ConnectionProtocol, ALeavingRankWaitsForAcknowledgementsOrLosses) {
  ConnectionProtocol p = protocol(0);
  const Clock::time_point now = Clock::now();
  for (int r = 1; r < 4; ++r) p.connected(r, "a", now);
  EXPECT_EQ(p.connected_peers(), (std::vector<int>{1, 2, 3}));
  EXPECT_FALSE(p.wait_goodbyes_acknowledged({1, 2, 3}, milliseconds(0)));
  EXPECT_EQ(p.on_frame(1, control_header(pg::FrameHeader::GOODBYE_ACK)), FrameAction::kIgnore);
  p.lose(2, p.lost_error(2));
  EXPECT_FALSE(p.wait_goodbyes_acknowledged({1, 2, 3}, milliseconds(0)));
  EXPECT_TRUE(p.wait_goodbyes_acknowledged({1, 2}, milliseconds(0)));
  p.on_frame(3, control_header(pg::FrameHeader::GOODBYE_ACK));
  EXPECT_TRUE(p.wait_goodbyes_acknowledged({1, 2, 3}, milliseconds(0)));
}

TEST(ConnectionProtocol, ConnectingFailsWithTheReasonOfTheFirstPeerThatSaidNo) {
  const Clock::time_point past = Clock::now();
  {
    ConnectionProtocol p = protocol(1);
    p.connected(0, "a", past);
    p.connected(2, "b", past);
    p.connected(3, "c", past);
    EXPECT_EQ(error_of([&] { p.wait_connected(past, milliseconds(5)); }).kind(), ErrorKind::kInternal);  // none
  }
  {
    ConnectionProtocol p = protocol(1);
    p.connected(0, "a", past);
    Error e = error_of([&] { p.wait_connected(past, milliseconds(5)); });
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_EQ(e.message(), "rank 1: ranks 2, 3 did not connect within 5 ms");
  }
  {
    ConnectionProtocol p = protocol(1);
    p.refused(3, "wrong or missing job token");
    Error e = error_of([&] { p.wait_connected(past + std::chrono::hours(1), milliseconds(5)); });
    EXPECT_EQ(e.kind(), ErrorKind::kUnauthenticated);
    EXPECT_EQ(e.message(), "rank 3 refused rank 1: wrong or missing job token");
  }
  {
    ConnectionProtocol p = protocol(1);
    p.set_address(2, "10.0.0.2:7");
    p.ended_before_answer(2, "gRPC status 14: Socket closed");
    Error e = error_of([&] { p.wait_connected(past + std::chrono::hours(1), milliseconds(5)); });
    EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable);
    EXPECT_EQ(e.message(),
              "rank 1: the connection to rank 2 (10.0.0.2:7) ended before rank 2 answered rank 1's hello "
              "(gRPC status 14: Socket closed)");
  }
}

}  // namespace
}  // namespace drpc
