// The conformance suite with every rank a real process on its own port, for world sizes
// 1 to 4, and a rank killed with SIGKILL in the middle of a collective.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>

#include "common/subprocess.h"
#include "process_group/grpc_store.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;

std::string worker_path() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (workspace ? workspace : "drpc") +
         "/process_group/conformance_worker";
}

// Starts `world_size` workers against a store this test hosts; returns their exit codes
// (-1 for one that had to be killed at the deadline).
std::vector<int> run_workers(int world_size, const std::string& scenario) {
  auto store = start_store_server("127.0.0.1", 0);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < world_size; ++r) {
    workers.push_back(Subprocess::start(
        {worker_path(), "--rank=" + std::to_string(r), "--world_size=" + std::to_string(world_size),
         "--store_port=" + std::to_string(store->port()), "--scenario=" + scenario},
        {"GLOG_minloglevel=1"}));
  }
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(240000);
  std::vector<int> codes;
  for (auto& w : workers) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    auto code = w->wait(std::max(left, milliseconds(1)));
    codes.push_back(code ? *code : -1);
  }
  return codes;  // the Subprocess destructors kill whatever still runs
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
