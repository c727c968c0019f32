// The agent's handler threads: what was queued before start runs after it, one thread runs
// tasks in queue order, stop drops what is queued and refuses more, join waits for a
// running task.

#include "rpc/handler_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace drpc {
namespace {

HandlerPool::AroundThread plain() {
  return [](int, const HandlerPool::Task& serve) { serve(); };
}

TEST(HandlerPool, OneThreadRunsTasksInQueueOrderIncludingThoseQueuedBeforeStart) {
  HandlerPool pool(plain());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> ran;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(pool.post([&, i] {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(i);
      cv.notify_all();
    }));
  }
  EXPECT_EQ(pool.queued(), 5u);
  pool.start(1);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return ran.size() == 5; });
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(HandlerPool, StopDropsWhatIsQueuedAndJoinWaitsForTheRunningTask) {
  HandlerPool pool(plain());
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, release = false;
  std::atomic<bool> finished{false}, dropped_ran{false};
  pool.post([&] {
    std::unique_lock<std::mutex> lock(mu);
    started = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    finished = true;
  });
  pool.post([&] { dropped_ran = true; });
  pool.start(1);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started; });
  }
  pool.stop();
  EXPECT_EQ(pool.queued(), 0u);
  EXPECT_FALSE(pool.post([&] { dropped_ran = true; }));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  pool.join();
  EXPECT_TRUE(finished);
  EXPECT_FALSE(dropped_ran);
  pool.stop();  // idempotent
  pool.join();
}

}  // namespace
}  // namespace drpc
