// The RPC layer with every worker a real process on its own port.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "testing/worker_processes.h"

namespace drpc {
namespace {

std::vector<int> run_workers(int world_size, const std::string& scenario) {
  return testing::run_worker_processes("tests/rpc_worker", world_size, scenario);
}

TEST(RpcProcesses, CallsBetweenFourWorkersAndGracefulShutdown) {
  const auto codes = run_workers(4, "calls");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
}

TEST(RpcProcesses, RRefsForkedAcrossFourWorkersAreAllReleased) {
  const auto codes = run_workers(4, "rrefs");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
}

// The serving workers wait in graceful shutdown for 3x the job's init timeout and 12x its
// RPC timeout while the trainer keeps computing and calling them (the main job's shape).
TEST(RpcProcesses, GracefulShutdownWaitsForTheWholeJobHoweverLong) {
  const auto codes = run_workers(3, "long_job");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
}

TEST(RpcProcesses, NoRRefIsDeletedBeforeEveryWorkerReachedShutdown) {
  const auto codes = run_workers(3, "shutdown_order");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
}

TEST(RpcProcesses, WorkerKilledDuringDistributedBackward) {
  const auto codes = run_workers(3, "backward_killed");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

TEST(RpcProcesses, CalleeKilledMidCallFailsTheCallerWithinTwoSeconds) {
  const auto codes = run_workers(3, "peer_killed");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[2], 0);
}

}  // namespace
}  // namespace drpc
