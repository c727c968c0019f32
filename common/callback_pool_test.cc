// The callback pool: blocked callbacks do not starve later ones, bursts stay on few
// threads, and nothing submitted is lost after close().

#include "common/callback_pool.h"

#include "common/wake_batch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

namespace drpc {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(CallbackPool, ATaskWaitingForALaterOneDoesNotDeadlock) {
  CallbackPool pool;
  std::promise<void> later_ran;
  std::promise<void> first_done;
  auto later = later_ran.get_future().share();
  pool.run([&, later] {
    // Blocks the pool's only thread until a task queued behind it has run.
    later.wait();
    first_done.set_value();
  });
  pool.run([&] { later_ran.set_value(); });
  EXPECT_EQ(first_done.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_GE(pool.threads(), 2u);
}

TEST(CallbackPool, ABurstOfShortTasksStaysOnFewThreads) {
  // A stall of 100 ms, not the default 5: on a busy machine the pool's threads can all be
  // descheduled for 5 ms several times in a burst, and each time one more is (rightly) added.
  CallbackPool pool(nullptr, 64, milliseconds(100));
  std::atomic<int> ran{0};
  std::promise<void> all;
  constexpr int kTasks = 20000;
  for (int i = 0; i < kTasks; ++i) {
    pool.run([&] {
      if (++ran == kTasks) all.set_value();
    });
  }
  ASSERT_EQ(all.get_future().wait_for(seconds(30)), std::future_status::ready);
  // A thread is added only when none has started a task for the stall time; the old rule,
  // one per task queued beyond the idle ones, reached its cap of 64.
  EXPECT_LE(pool.threads(), 8u);
}

TEST(CallbackPool, TasksQueuedDuringABatchRunOnceItEnds) {
  CallbackPool pool;
  std::promise<void> warm;
  pool.run([&] { warm.set_value(); });  // the pool's thread exists, and goes idle
  warm.get_future().wait();
  std::atomic<int> ran{0};
  std::promise<void> all;
  {
    WakeBatch batch;  // what a network thread opens around a burst of deliveries
    for (int i = 0; i < 100; ++i) {
      pool.run([&] {
        if (++ran == 100) all.set_value();
      });
    }
  }
  EXPECT_EQ(all.get_future().wait_for(seconds(10)), std::future_status::ready);
}

TEST(CallbackPool, ABlockedTaskOfABurstDoesNotHoldUpTheRest) {
  CallbackPool pool;
  {  // two threads: the first blocks until the second has run a task
    std::promise<void> second_ran, both_done;
    auto second = second_ran.get_future().share();
    pool.run([second] { second.wait(); });
    pool.run([&] {
      second_ran.set_value();
      both_done.set_value();
    });
    ASSERT_EQ(both_done.get_future().wait_for(seconds(10)), std::future_status::ready);
    ASSERT_EQ(pool.threads(), 2u);
  }
  // The burst wakes one idle thread, once. It takes the first task, which blocks until the
  // second has run: the second must go to the other idle thread, which only the first one
  // can wake (no stall is seen while a thread idles).
  std::promise<void> released;
  auto release = released.get_future().share();
  std::promise<void> first_done;
  {
    WakeBatch batch;
    pool.run([&, release] {
      release.wait();
      first_done.set_value();
    });
    pool.run([&] { released.set_value(); });
  }
  EXPECT_EQ(first_done.get_future().wait_for(seconds(10)), std::future_status::ready);
}

TEST(CallbackPool, AfterCloseTasksRunOnTheCaller) {
  CallbackPool pool;
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) pool.run([&] { ++ran; });
  pool.close();
  EXPECT_EQ(ran.load(), 100);  // what was queued ran before close() returned
  const auto caller = std::this_thread::get_id();
  std::thread::id where;
  pool.run([&] { where = std::this_thread::get_id(); });
  EXPECT_EQ(where, caller);
  pool.close();  // idempotent
}

}  // namespace
}  // namespace drpc
