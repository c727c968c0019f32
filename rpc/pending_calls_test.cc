// The pending-call table on a manual executor: deadlines fire exactly at their time and
// in their order, a reply cancels its deadline, a peer's failure takes only its calls,
// close takes everything once; and its safety with timers it could not cancel.

#include "rpc/pending_calls.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/manual_executor.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;

PendingCall call_to(int dst, milliseconds timeout, const std::string& what = "f") {
  return PendingCall{make_message_future(), dst, CallName(what), timeout};
}

struct Expired {
  std::vector<int64_t> ids;
  std::vector<std::string> what;
  PendingCalls::OnExpired callback() {
    return [this](int64_t id, PendingCall call) {
      ids.push_back(id);
      what.push_back(call.what.text());
    };
  }
};

TEST(PendingCalls, ADeadlineFiresExactlyAtItsTime) {
  ManualExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  ASSERT_EQ(calls.add(1, call_to(1, milliseconds(100), "slow")), PendingCalls::AddResult::kAdded);
  EXPECT_EQ(executor.timers(), 1u);
  EXPECT_EQ(executor.advance(milliseconds(99)), 0);
  EXPECT_TRUE(expired.ids.empty());
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_EQ(executor.advance(milliseconds(1)), 1);
  EXPECT_EQ(expired.ids, std::vector<int64_t>{1});
  EXPECT_EQ(expired.what, std::vector<std::string>{"slow"});
  EXPECT_TRUE(calls.empty());
  EXPECT_FALSE(calls.take(1));  // the late reply finds nothing
}

TEST(PendingCalls, DeadlinesFireInTheirOrderNotTheCalls) {
  ManualExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  calls.add(1, call_to(1, milliseconds(400)));
  calls.add(2, call_to(1, milliseconds(100)));
  calls.add(3, call_to(1, milliseconds(0)));  // no deadline: no timer
  EXPECT_EQ(executor.timers(), 2u);
  EXPECT_EQ(executor.advance(milliseconds(100)), 1);
  EXPECT_EQ(expired.ids, std::vector<int64_t>{2});
  EXPECT_EQ(executor.advance(milliseconds(300)), 1);
  EXPECT_EQ(expired.ids, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(executor.advance(std::chrono::hours(24)), 0);
  EXPECT_EQ(calls.size(), 1u);  // the call without a deadline waits on
}

TEST(PendingCalls, AReplyBeforeTheDeadlineCancelsIt) {
  ManualExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  calls.add(7, call_to(1, milliseconds(100), "answered"));
  executor.advance(milliseconds(99));
  std::optional<PendingCall> taken = calls.take(7);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->what.text(), "answered");
  EXPECT_EQ(executor.timers(), 0u);  // cancelled, not left to fire and find nothing
  EXPECT_EQ(executor.advance(milliseconds(1000)), 0);
  EXPECT_TRUE(expired.ids.empty());
  EXPECT_FALSE(calls.take(7));  // a call leaves once
}

TEST(PendingCalls, APeerFailureTakesOnlyThatPeersCalls) {
  ManualExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  calls.add(1, call_to(1, milliseconds(100), "a"));
  calls.add(2, call_to(2, milliseconds(100), "b"));
  calls.add(3, call_to(1, milliseconds(0), "c"));
  calls.add(4, call_to(1, milliseconds(50), "d"));
  std::vector<PendingCall> failed = calls.take_peer(1);
  ASSERT_EQ(failed.size(), 3u);
  EXPECT_EQ(failed[0].what.text(), "a");  // in call order
  EXPECT_EQ(failed[1].what.text(), "c");
  EXPECT_EQ(failed[2].what.text(), "d");
  EXPECT_EQ(executor.timers(), 1u);  // their deadlines are cancelled; rank 2's is kept
  EXPECT_TRUE(calls.take_peer(1).empty());
  EXPECT_EQ(executor.advance(milliseconds(100)), 1);
  EXPECT_EQ(expired.ids, std::vector<int64_t>{2});
}

TEST(PendingCalls, CloseTakesEverythingOnceAndRefusesLaterCalls) {
  ManualExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  calls.add(1, call_to(1, milliseconds(100)));
  calls.add(2, call_to(2, milliseconds(0)));
  EXPECT_EQ(calls.close().size(), 2u);
  EXPECT_EQ(executor.timers(), 0u);
  EXPECT_TRUE(calls.close().empty());
  EXPECT_EQ(calls.add(3, call_to(1, milliseconds(100))), PendingCalls::AddResult::kClosed);
  EXPECT_EQ(calls.add(4, call_to(1, milliseconds(0))), PendingCalls::AddResult::kClosed);
  EXPECT_EQ(executor.advance(milliseconds(1000)), 0);
  EXPECT_TRUE(expired.ids.empty());
  EXPECT_TRUE(calls.empty());
}

TEST(PendingCalls, OnceTheExecutorIsClosedOnlyCallsWithoutADeadlineAreTaken) {
  ManualExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  executor.close();
  EXPECT_EQ(calls.add(1, call_to(1, milliseconds(100))), PendingCalls::AddResult::kNoTimer);
  EXPECT_EQ(calls.add(2, call_to(1, milliseconds(0))), PendingCalls::AddResult::kAdded);
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls.take(2));
}

TEST(PendingCalls, TheOldestAreVisitedFirst) {
  ManualExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  for (int64_t id = 1; id <= 5; ++id) calls.add(id, call_to(1, milliseconds(0), "f" + std::to_string(id)));
  std::vector<std::string> seen;
  calls.visit_oldest(3, [&](const PendingCall& c) { seen.push_back(c.what.text()); });
  EXPECT_EQ(seen, (std::vector<std::string>{"f1", "f2", "f3"}));
}

// An executor whose cancel() always comes too late (the timer "already started"), as a
// thread executor's may: the table must not rely on cancel() to stay safe.
class LateCancelExecutor final : public Executor {
 public:
  TimePoint now() const override { return inner.now(); }
  bool post(Task task) override { return inner.post(std::move(task)); }
  TimerId run_at(TimePoint when, Task task) override { return inner.run_at(when, std::move(task)); }
  bool cancel(TimerId) override { return false; }
  void close() override { inner.close(); }
  ManualExecutor inner;
};

TEST(PendingCalls, ADeadlineThatFiresAfterTheTableIsGoneDoesNothing) {
  LateCancelExecutor executor;
  Expired expired;
  {
    PendingCalls calls(executor, expired.callback());
    calls.add(1, call_to(1, milliseconds(100)));
    calls.add(2, call_to(1, milliseconds(200)));
    EXPECT_TRUE(calls.take(2));
  }
  EXPECT_EQ(executor.inner.advance(milliseconds(1000)), 2);  // both timers ran, into nothing
  EXPECT_TRUE(expired.ids.empty());
}

TEST(PendingCalls, ADeadlineThatFiresAfterCloseDoesNothing) {
  LateCancelExecutor executor;
  Expired expired;
  PendingCalls calls(executor, expired.callback());
  calls.add(1, call_to(1, milliseconds(100)));
  EXPECT_EQ(calls.close().size(), 1u);
  EXPECT_EQ(executor.inner.advance(milliseconds(1000)), 1);
  EXPECT_TRUE(expired.ids.empty());
}

// close() returns only once a deadline callback already running has finished, so its
// owner may be destroyed right after.
TEST(PendingCalls, CloseWaitsForADeadlineCallbackInProgress) {
  auto executor = create_thread_executor("[test]");
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, release = false;
  std::atomic<bool> callback_done{false};
  PendingCalls calls(*executor, [&](int64_t, PendingCall) {
    std::unique_lock<std::mutex> lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    callback_done = true;
  });
  calls.add(1, call_to(1, milliseconds(1)));
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    EXPECT_TRUE(calls.close().empty());  // the call already left, by its deadline
    EXPECT_TRUE(callback_done);
    closed = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(closed);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  closer.join();
  EXPECT_TRUE(closed);
}

// A deadline callback may close the table itself (its owner shutting down from a future's
// callback): close() does not wait for the thread it is called on.
TEST(PendingCalls, ADeadlineCallbackMayCloseTheTable) {
  ManualExecutor executor;
  std::unique_ptr<PendingCalls> calls;
  size_t closed_with = 99;
  calls = std::make_unique<PendingCalls>(executor, [&](int64_t, PendingCall) { closed_with = calls->close().size(); });
  calls->add(1, call_to(1, milliseconds(10)));
  calls->add(2, call_to(1, milliseconds(20)));
  EXPECT_EQ(executor.advance(milliseconds(10)), 1);
  EXPECT_EQ(closed_with, 1u);
  EXPECT_EQ(executor.timers(), 0u);
}

}  // namespace
}  // namespace drpc
