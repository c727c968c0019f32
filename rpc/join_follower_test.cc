// A worker's part in the join, without agents: it reports only when idle, to the lowest
// live rank (handling its own report when it leads), reports again for a new round or a
// new leader, and finishes on a done verdict; malformed messages change nothing.

#include "rpc/join_follower.h"

#include <gtest/gtest.h>

#include <vector>

#include "rpc/message.h"

namespace drpc {
namespace {

rpc::JoinReport parse_report(const JoinMessage& m) {
  EXPECT_EQ(m.type, kJoinReport);
  rpc::JoinReport r;
  EXPECT_TRUE(r.ParseFromString(m.payload));
  return r;
}

std::string verdict(int64_t generation, int64_t round, bool done) {
  rpc::JoinVerdict v;
  v.set_generation(generation);
  v.set_round(round);
  v.set_done(done);
  return v.SerializeAsString();
}

TEST(JoinFollower, AFollowerReportsItsCountsWhenIdleAndFinishesOnTheVerdict) {
  JoinFollower follower(1, 3);
  follower.request_sent(0);
  follower.request_sent(2);
  follower.request_answered(0);
  std::vector<JoinMessage> out;
  JoinFollower::Call call = follower.begin();
  EXPECT_EQ(follower.step(call, /*idle=*/false, &out), JoinFollower::Step::kWait);
  EXPECT_TRUE(out.empty());
  ASSERT_EQ(follower.step(call, true, &out), JoinFollower::Step::kReported);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dst, 0);
  const rpc::JoinReport r = parse_report(out[0]);
  EXPECT_EQ(r.generation(), 1);
  EXPECT_EQ(std::vector<int64_t>(r.sent_to().begin(), r.sent_to().end()), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(std::vector<int64_t>(r.answered_from().begin(), r.answered_from().end()), (std::vector<int64_t>{1, 0, 0}));
  out.clear();
  EXPECT_EQ(follower.step(call, true, &out), JoinFollower::Step::kWait);  // reported once per round
  // Another round: a new report.
  ASSERT_TRUE(follower.on_message(0, kJoinVerdict, verdict(1, 1, false), &out));
  ASSERT_EQ(follower.step(call, true, &out), JoinFollower::Step::kReported);
  EXPECT_EQ(parse_report(out.back()).round(), 1);
  ASSERT_TRUE(follower.on_message(0, kJoinVerdict, verdict(1, 1, true), &out));
  EXPECT_EQ(follower.step(call, true, &out), JoinFollower::Step::kQuiet);
}

TEST(JoinFollower, WhenTheLeaderDiesTheNextLiveRankGetsTheReport) {
  JoinFollower follower(2, 3);
  std::vector<JoinMessage> out;
  JoinFollower::Call call = follower.begin();
  ASSERT_EQ(follower.step(call, true, &out), JoinFollower::Step::kReported);
  EXPECT_EQ(out.back().dst, 0);
  follower.peer_dead(0, &out);
  EXPECT_EQ(follower.leader(), 1);
  out.clear();
  ASSERT_EQ(follower.step(call, true, &out), JoinFollower::Step::kReported);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dst, 1);
}

TEST(JoinFollower, ALeaderAloneDecidesItsOwnJoin) {
  JoinFollower leader(0, 2);
  std::vector<JoinMessage> out;
  leader.peer_dead(1, &out);
  JoinFollower::Call call = leader.begin();
  ASSERT_EQ(leader.step(call, true, &out), JoinFollower::Step::kReported);
  EXPECT_TRUE(out.empty());  // its own report, and its own verdict, stay here
  EXPECT_EQ(leader.step(call, true, &out), JoinFollower::Step::kQuiet);
}

TEST(JoinFollower, MalformedJoinMessagesAreRefused) {
  JoinFollower follower(0, 2);
  std::vector<JoinMessage> out;
  EXPECT_FALSE(follower.on_message(1, kJoinReport, "\xff\xff", &out));
  rpc::JoinReport short_report;  // counts one rank of two
  short_report.set_generation(1);
  short_report.add_sent_to(0);
  short_report.add_answered_from(0);
  EXPECT_FALSE(follower.on_message(1, kJoinReport, short_report.SerializeAsString(), &out));
  EXPECT_FALSE(follower.on_message(1, kJoinVerdict, "\xff\xff", &out));
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace drpc
