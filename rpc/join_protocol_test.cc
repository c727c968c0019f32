// The join leader's decisions, without agents: quiet only when every live worker reported
// the same round and every request sent was answered; another round otherwise; the dead
// do not count; a late report after the verdict gets the verdict again.

#include "rpc/join_protocol.h"

#include <gtest/gtest.h>

#include <vector>

namespace drpc {
namespace {

rpc::JoinReport report(int64_t generation, int64_t round, std::vector<int64_t> sent_to,
                       std::vector<int64_t> answered_from) {
  rpc::JoinReport r;
  r.set_generation(generation);
  r.set_round(round);
  for (auto n : sent_to) r.add_sent_to(n);
  for (auto n : answered_from) r.add_answered_from(n);
  return r;
}

// "dst:round:done" for each verdict, in order.
std::vector<std::string> summary(const std::vector<JoinVerdictFor>& verdicts) {
  std::vector<std::string> out;
  for (const auto& v : verdicts) {
    EXPECT_EQ(v.verdict.generation(), 1);
    out.push_back(std::to_string(v.dst) + ":" + std::to_string(v.verdict.round()) + ":" +
                  (v.verdict.done() ? "done" : "again"));
  }
  return out;
}

using Strings = std::vector<std::string>;

TEST(JoinLeader, TheJobIsQuietOnlyWhenEveryRequestSentWasAnsweredByEveryLiveWorker) {
  JoinLeader leader(3);
  const std::vector<bool> alive(3, false);
  std::vector<JoinVerdictFor> out;
  // Worker 0 sent 2 requests to 1; worker 1 has answered only 1 of them so far.
  leader.on_report(0, report(1, 0, {0, 2, 0}, {0, 0, 0}), alive, &out);
  leader.on_report(1, report(1, 0, {0, 0, 0}, {1, 0, 0}), alive, &out);
  EXPECT_TRUE(out.empty());  // worker 2 has not reported
  leader.on_report(2, report(1, 0, {0, 0, 0}, {0, 0, 0}), alive, &out);
  EXPECT_EQ(summary(out), (Strings{"0:1:again", "1:1:again", "2:1:again"}));
  out.clear();
  leader.on_report(0, report(1, 0, {0, 2, 0}, {0, 0, 0}), alive, &out);  // a stale round: ignored
  EXPECT_TRUE(out.empty());
  leader.on_report(0, report(1, 1, {0, 2, 0}, {0, 0, 0}), alive, &out);
  leader.on_report(1, report(1, 1, {0, 0, 0}, {2, 0, 0}), alive, &out);
  leader.on_report(2, report(1, 1, {0, 0, 0}, {0, 0, 0}), alive, &out);
  EXPECT_EQ(summary(out), (Strings{"0:1:done", "1:1:done", "2:1:done"}));
  out.clear();
  // A worker whose report reached this leader late (it had reported to a dead one) hears
  // the verdict again, alone.
  leader.on_report(2, report(1, 1, {0, 0, 0}, {0, 0, 0}), alive, &out);
  EXPECT_EQ(summary(out), (Strings{"2:1:done"}));
}

TEST(JoinLeader, ADeadWorkerIsNotWaitedForAndItsCountsDoNotMatter) {
  JoinLeader leader(3);
  std::vector<bool> dead(3, false);
  std::vector<JoinVerdictFor> out;
  // Worker 2 sent a request to 0 that 0 never answered, then died.
  leader.on_report(0, report(1, 0, {0, 0, 0}, {0, 0, 0}), dead, &out);
  leader.on_report(1, report(1, 0, {0, 0, 0}, {0, 0, 0}), dead, &out);
  EXPECT_TRUE(out.empty());
  dead[2] = true;
  leader.on_peer_dead(dead, &out);
  EXPECT_EQ(summary(out), (Strings{"0:0:done", "1:0:done"}));
}

TEST(JoinLeader, AReportOfALaterRoundRestartsTheRoundForEveryone) {
  // A new leader (the old one died) hears of round 2 from a worker its predecessor asked.
  JoinLeader leader(3);
  const std::vector<bool> dead = {true, false, false};
  std::vector<JoinVerdictFor> out;
  leader.on_report(1, report(1, 0, {0, 0, 0}, {0, 0, 0}), dead, &out);
  EXPECT_TRUE(out.empty());
  leader.on_report(2, report(1, 2, {0, 0, 0}, {0, 0, 0}), dead, &out);
  EXPECT_EQ(summary(out), (Strings{"1:2:again"}));  // worker 1 must report round 2 too
  out.clear();
  leader.on_report(1, report(1, 2, {0, 0, 0}, {0, 0, 0}), dead, &out);
  EXPECT_EQ(summary(out), (Strings{"1:2:done", "2:2:done"}));
}

TEST(JoinLeader, OnlyReportsCountingEveryRankOfARealJoinAreWellFormed) {
  EXPECT_TRUE(JoinLeader::well_formed(report(1, 0, {0, 0}, {0, 0}), 2));
  EXPECT_FALSE(JoinLeader::well_formed(report(1, 0, {0}, {0, 0}), 2));
  EXPECT_FALSE(JoinLeader::well_formed(report(1, 0, {0, 0}, {0, 0, 0}), 2));
  EXPECT_FALSE(JoinLeader::well_formed(report(0, 0, {0, 0}, {0, 0}), 2));
  EXPECT_FALSE(JoinLeader::well_formed(report(1, -1, {0, 0}, {0, 0}), 2));
}

}  // namespace
}  // namespace drpc
