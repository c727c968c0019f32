// Faults made real: workers are processes on their own ports, killed, stopped, cut off from
// their master, or made to lose and reorder protocol messages. See chaos_worker.cc.

#include <gtest/gtest.h>
#include <signal.h>

#include "testing/worker_processes.h"

namespace drpc {
namespace {

std::vector<int> run_workers(int world_size, const std::string& scenario) {
  return testing::run_worker_processes("tests/chaos_worker", world_size, scenario, std::chrono::minutes(3));
}

TEST(Chaos, CalleeKilledDuringAStreamOfCalls) {
  const auto codes = run_workers(3, "callee_killed");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[2], 0);
}

TEST(Chaos, StoppedWorkerIsDeclaredFailedByTheHeartbeat) {
  const auto codes = run_workers(3, "stopped");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[2], 0);
}

TEST(Chaos, MasterKilledAfterStartUp) {
  const auto codes = run_workers(3, "master_killed");
  EXPECT_EQ(codes[0], 128 + SIGKILL);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 0);
}

TEST(Chaos, DeadOwnersRRefsFailClearlyAndItsReferencesAndContextsAreReclaimed) {
  const auto codes = run_workers(2, "owner_killed");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
}

TEST(Chaos, RRefControlMessagesLostAndReordered) {
  const auto codes = run_workers(3, "rref_faults");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
}

}  // namespace
}  // namespace drpc
