// The RPC layer with every worker a real process on its own port.

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
  return std::string(srcdir ? srcdir : ".") + "/" + (workspace ? workspace : "drpc") + "/tests/rpc_worker";
}

std::vector<int> run_workers(int world_size, const std::string& scenario) {
  auto store = start_store_server("127.0.0.1", 0);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < world_size; ++r) {
    workers.push_back(Subprocess::start({worker_path(), "--rank=" + std::to_string(r),
                                         "--world_size=" + std::to_string(world_size),
                                         "--store_port=" + std::to_string(store->port()), "--scenario=" + scenario},
                                        {"GLOG_minloglevel=1", "GLOG_logtostderr=1"}));
  }
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(120000);
  std::vector<int> codes;
  for (auto& w : workers) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    auto code = w->wait(std::max(left, milliseconds(1)));
    codes.push_back(code ? *code : -1);
  }
  return codes;
}

TEST(RpcProcesses, CallsBetweenFourWorkersAndGracefulShutdown) {
  const auto codes = run_workers(4, "calls");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
}

TEST(RpcProcesses, RRefsForkedAcrossFourWorkersAreAllReleased) {
  const auto codes = run_workers(4, "rrefs");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
}

TEST(RpcProcesses, CalleeKilledMidCallFailsTheCallerWithinTwoSeconds) {
  const auto codes = run_workers(3, "peer_killed");
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_EQ(codes[2], 0);
}

}  // namespace
}  // namespace drpc
