// The conformance suite with every rank a real process on its own port, for world sizes
// 1 to 4, and a rank killed with SIGKILL in the middle of a collective.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "testing/worker_processes.h"

namespace drpc {
namespace {

std::vector<int> run_workers(int world_size, const std::string& scenario) {
  return testing::run_worker_processes("process_group/conformance_worker", world_size, scenario);
}

class ProcessRanks : public ::testing::TestWithParam<int> {};

TEST_P(ProcessRanks, Conformance) {
  const auto codes = run_workers(GetParam(), "conformance");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ProcessRanks, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(ProcessRanksFailure, PeerKilledMidCollective) {
  const auto codes = run_workers(3, "peer_killed");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

}  // namespace
}  // namespace drpc
