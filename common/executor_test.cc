// The executors: timers run in due order and can be cancelled, close() drops timers but
// finishes posted work, a strand runs its tasks one at a time in order, and the manual
// executor moves time only when told.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <vector>

#include "common/executor.h"
#include "common/manual_executor.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(ThreadExecutor, TimersRunInDueOrderNotInTheOrderTheyWereSet) {
  auto executor = create_thread_executor("[test/0]");
  std::mutex mu;
  std::vector<int> order;
  std::promise<void> all;
  auto record = [&](int n) {
    return [&, n] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(n);
      if (order.size() == 3) all.set_value();
    };
  };
  const auto start = executor->now();
  executor->run_at(start + milliseconds(60), record(3));
  executor->run_at(start + milliseconds(20), record(1));
  executor->run_at(start + milliseconds(40), record(2));
  ASSERT_EQ(all.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_GE(executor->now() - start, milliseconds(60));
}

TEST(ThreadExecutor, ACancelledTimerNeverRunsAndCancelSaysWhetherItWasInTime) {
  auto executor = create_thread_executor("[test/0]");
  std::atomic<bool> cancelled_ran{false};
  // Far off, so a test thread descheduled on a busy machine still cancels it in time.
  const auto id = executor->run_after(seconds(10), [&] { cancelled_ran = true; });
  EXPECT_TRUE(executor->cancel(id));
  EXPECT_FALSE(executor->cancel(id));
  std::promise<void> ran;
  const auto later = executor->run_after(milliseconds(60), [&] { ran.set_value(); });
  ASSERT_EQ(ran.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_FALSE(executor->cancel(later));  // it ran
  EXPECT_FALSE(cancelled_ran.load());
}

// The timer thread sleeps until its earliest timer; cancelling that timer frees it while
// the thread sleeps. Under AddressSanitizer this caught the thread reading the freed
// timer's due time when it woke (it waited on a reference into the timer map).
TEST(ThreadExecutor, CancellingTheTimerTheThreadSleepsOnIsSafe) {
  auto executor = create_thread_executor("[test/0]");
  std::promise<void> started;
  executor->run_after(milliseconds(0), [&] { started.set_value(); });
  ASSERT_EQ(started.get_future().wait_for(seconds(10)), std::future_status::ready);
  std::atomic<bool> cancelled_ran{false};
  const auto id = executor->run_after(seconds(10), [&] { cancelled_ran = true; });  // far off: cancelled in time
  EXPECT_TRUE(executor->cancel(id));
  std::promise<void> later;
  executor->run_after(milliseconds(80), [&] { later.set_value(); });
  ASSERT_EQ(later.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_FALSE(cancelled_ran.load());
  executor->run_after(seconds(3600), [] {});
  executor->close();  // frees the timer the thread sleeps on
}

TEST(ThreadExecutor, CloseDropsTimersFinishesPostedTasksAndRefusesNewWork) {
  auto executor = create_thread_executor("[test/0]");
  std::atomic<bool> timer_ran{false};
  std::atomic<int> tasks_ran{0};
  executor->run_after(seconds(3600), [&] { timer_ran = true; });
  std::promise<void> release;
  auto released = release.get_future().share();
  executor->post([&, released] {
    released.wait();
    ++tasks_ran;
  });
  for (int i = 0; i < 5; ++i) executor->post([&] { ++tasks_ran; });
  release.set_value();
  executor->close();  // returns at once although the timer is due in an hour
  EXPECT_EQ(tasks_ran.load(), 6);
  EXPECT_FALSE(timer_ran.load());
  EXPECT_FALSE(executor->post([&] { ++tasks_ran; }));
  EXPECT_EQ(executor->run_after(milliseconds(1), [&] { timer_ran = true; }), 0u);
  executor->close();  // idempotent
  EXPECT_EQ(tasks_ran.load(), 6);
}

TEST(ThreadExecutor, AStrandRunsItsTasksOneAtATimeInOrder) {
  auto executor = create_thread_executor("[test/0]");
  Strand strand(*executor);
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  std::vector<int> order;  // touched only from the strand
  std::promise<void> done;
  constexpr int kTasks = 200;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_TRUE(strand.post([&, i] {
      if (running.fetch_add(1) != 0) overlapped = true;
      order.push_back(i);
      running.fetch_sub(1);
      if (i == kTasks - 1) done.set_value();
    }));
  }
  ASSERT_EQ(done.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_FALSE(overlapped.load());
  ASSERT_EQ(order.size(), static_cast<size_t>(kTasks));
  for (int i = 0; i < kTasks; ++i) EXPECT_EQ(order[i], i);
}

TEST(ManualExecutor, TimeMovesOnlyWhenAdvancedAndTimersRunAtTheirDueTimes) {
  ManualExecutor executor;
  const auto start = executor.now();
  std::vector<std::pair<int, Executor::Clock::duration>> ran;
  executor.run_after(milliseconds(30), [&] { ran.emplace_back(2, executor.now() - start); });
  executor.run_after(milliseconds(10), [&] {
    ran.emplace_back(1, executor.now() - start);
    // A timer set from a timer counts from the time it runs at.
    executor.run_after(milliseconds(5), [&] { ran.emplace_back(3, executor.now() - start); });
  });
  EXPECT_EQ(executor.advance(milliseconds(9)), 0);
  EXPECT_TRUE(ran.empty());
  EXPECT_EQ(executor.advance(milliseconds(6)), 2);  // to 15 ms: the 10 ms one and the one it set
  EXPECT_EQ(executor.now() - start, milliseconds(15));
  EXPECT_EQ(executor.advance(milliseconds(100)), 1);
  using D = Executor::Clock::duration;
  EXPECT_EQ(ran, (std::vector<std::pair<int, D>>{{1, milliseconds(10)}, {3, milliseconds(15)}, {2, milliseconds(30)}}));
  EXPECT_EQ(executor.timers(), 0u);
}

TEST(ManualExecutor, PostedTasksRunOnlyInsideRunPendingIncludingThoseTheyPost) {
  ManualExecutor executor;
  Strand strand(executor);
  std::vector<int> order;
  strand.post([&] {
    order.push_back(1);
    strand.post([&] { order.push_back(3); });
  });
  strand.post([&] { order.push_back(2); });
  EXPECT_TRUE(order.empty());
  executor.run_pending();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  const auto id = executor.run_after(milliseconds(1), [&] { order.push_back(4); });
  EXPECT_TRUE(executor.cancel(id));
  executor.advance(seconds(1));
  EXPECT_EQ(order.size(), 3u);
}

}  // namespace
}  // namespace drpc
