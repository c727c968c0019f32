// The conformance suite with every rank a real process on its own port, for world sizes
// 1 to 4, and a rank killed with SIGKILL in the middle of a collective.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <tuple>

#include "testing/worker_processes.h"

namespace drpc {
namespace {

std::vector<int> run_workers(int world_size, const std::string& scenario) {
  return testing::run_worker_processes("process_group/conformance_worker", world_size, scenario);
}

// World size, and the data plane the workers take from DRPC_DATA_PLANE.
class ProcessRanks : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ProcessRanks, Conformance) {
  setenv("DRPC_DATA_PLANE", std::get<1>(GetParam()).c_str(), 1);
  const auto codes = run_workers(std::get<0>(GetParam()), "conformance");
  unsetenv("DRPC_DATA_PLANE");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ProcessRanks,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("grpc", "auto")),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_world" + std::to_string(std::get<0>(info.param));
                         });

// On the default data plane: UCX links between these processes.
TEST(ProcessRanksFailure, PeerKilledMidCollective) {
  const auto codes = run_workers(3, "peer_killed");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 128 + SIGKILL);
}

}  // namespace
}  // namespace drpc
