// The in-memory double passes the same conformance suite as the real process group, so
// tests above it can trust it.

#include "process_group/in_memory_process_group.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>

#include <thread>

#include "process_group/testing/conformance.h"

namespace drpc {
namespace {

TEST(InMemoryProcessGroup, PassesTheConformanceSuite) {
  for (int world = 1; world <= 3; ++world) {
    auto groups = create_in_memory_process_groups(world);
    std::vector<std::vector<std::string>> failures(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] { failures[r] = testing::run_conformance(*groups[r], /*large_bytes=*/1 << 18); });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      for (const auto& f : failures[r]) ADD_FAILURE() << "world " << world << " rank " << r << ": " << f;
    }
  }
}

TEST(InMemoryProcessGroup, ALeavingRankFailsItsPeersWaits) {
  auto groups = create_in_memory_process_groups(2);
  auto pending = groups[0]->recv({at::empty({1})}, 1, 5);
  groups[1]->shutdown();
  try {
    pending->wait(std::chrono::milliseconds(5000));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
  }
}

}  // namespace
}  // namespace drpc
