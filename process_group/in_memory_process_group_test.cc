// The in-memory double passes the same conformance suite as the real process group, so
// tests above it can trust it.

#include "process_group/in_memory_process_group.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
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
      threads.emplace_back([&, r] {
        failures[r] = testing::run_conformance(*groups[r].group, *groups[r].messages, /*large_bytes=*/1 << 18);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      for (const auto& f : failures[r]) ADD_FAILURE() << "world " << world << " rank " << r << ": " << f;
    }
  }
}

TEST(InMemoryProcessGroup, ALeavingRankFailsItsPeersWaits) {
  auto groups = create_in_memory_process_groups(2);
  auto pending = groups[0].group->recv({at::empty({1})}, 1, 5);
  groups[1].group->shutdown();
  try {
    pending->wait(std::chrono::milliseconds(5000));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
  }
}

// The group and its port share the transport: dropping the port leaves the group working;
// a group that goes is seen leaving by its peers' ports, and its own port refuses to send.
TEST(InMemoryProcessGroup, EitherEndpointMayGoFirst) {
  auto groups = create_in_memory_process_groups(2);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> failed;
  groups[1].messages->set_message_listener(MessageListener{[](int, PgMessage) {}, [&](int rank, const Error&) {
                                                             std::lock_guard<std::mutex> lock(mu);
                                                             failed.push_back(rank);
                                                             cv.notify_all();
                                                           }});
  groups[0].messages.reset();
  std::vector<at::Tensor> t = {at::ones({4}), at::ones({4})};
  auto w0 = groups[0].group->allreduce(t[0], ReduceOp::kSum);
  auto w1 = groups[1].group->allreduce(t[1], ReduceOp::kSum);
  w0->wait(std::chrono::milliseconds(5000));
  w1->wait(std::chrono::milliseconds(5000));
  EXPECT_TRUE(t[0].eq(2).all().item<bool>());

  groups[0].group.reset();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(5), [&] { return !failed.empty(); }));
    EXPECT_EQ(failed, std::vector<int>{0});
  }
  groups[1].messages->set_message_listener(MessageListener{});
  groups[1].group.reset();
  try {
    groups[1].messages->send_message(0, PgMessage{"x", {}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kShutdown) << e.what();
  }
}

}  // namespace
}  // namespace drpc
