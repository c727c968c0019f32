// WakeBatch: wake-ups asked for while a batch is open on a thread are owed once per
// condition variable and made when the outermost batch ends (or is flushed); elsewhere at
// once.

#include "common/wake_batch.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>

namespace drpc {
namespace {

// A thread waiting on `cv` until it is notified (no predicate but the notification, so a
// wake-up that is never made leaves it waiting).
class Waiter {
 public:
  explicit Waiter(std::shared_ptr<std::condition_variable> cv) : cv_(std::move(cv)) {
    std::unique_lock<std::mutex> lock(mu_);
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      waiting_ = true;
      started_.notify_one();
      while (!woken_) {
        cv_->wait(lock);
        woken_ = notified_;
      }
    });
    started_.wait(lock, [&] { return waiting_; });
  }
  ~Waiter() { thread_.join(); }
  // Marks the coming notification as real (spurious wake-ups go back to waiting).
  void expect() {
    std::lock_guard<std::mutex> lock(mu_);
    notified_ = true;
  }

 private:
  std::shared_ptr<std::condition_variable> cv_;
  std::mutex mu_;
  std::condition_variable started_;
  bool waiting_ = false, notified_ = false, woken_ = false;
  std::thread thread_;
};

TEST(WakeBatch, NotifiesAtOnceWithoutABatch) {
  auto cv = std::make_shared<std::condition_variable>();
  Waiter waiter(cv);
  waiter.expect();
  WakeBatch::notify_one(cv);
  EXPECT_EQ(WakeBatch::owed(), 0u);
}  // ~Waiter joins: hangs if the notification was not made

TEST(WakeBatch, OwesOneWakeUpPerConditionVariableUntilTheBatchEnds) {
  auto first = std::make_shared<std::condition_variable>();
  auto second = std::make_shared<std::condition_variable>();
  Waiter first_waiter(first), second_waiter(second);
  {
    WakeBatch batch;
    for (int i = 0; i < 3; ++i) WakeBatch::notify_one(first);
    WakeBatch::notify_one(second);
    EXPECT_EQ(WakeBatch::owed(), 2u);
    first_waiter.expect();
    second_waiter.expect();
  }
  EXPECT_EQ(WakeBatch::owed(), 0u);
}

TEST(WakeBatch, FlushMakesTheOwedWakeUpsAndKeepsTheBatchOpen) {
  auto cv = std::make_shared<std::condition_variable>();
  WakeBatch batch;
  {
    Waiter waiter(cv);
    WakeBatch::notify_one(cv);
    waiter.expect();
    WakeBatch::flush();
    EXPECT_EQ(WakeBatch::owed(), 0u);
  }
  WakeBatch::notify_one(cv);
  EXPECT_EQ(WakeBatch::owed(), 1u);  // still open: owed again
}

TEST(WakeBatch, AnInnerBatchLeavesItsWakeUpsToTheOuterOne) {
  auto cv = std::make_shared<std::condition_variable>();
  WakeBatch outer;
  {
    WakeBatch inner;
    WakeBatch::notify_one(cv);
  }
  EXPECT_EQ(WakeBatch::owed(), 1u);
}

TEST(WakeBatch, ABatchDefersOnlyItsOwnThreadsWakeUps) {
  WakeBatch batch;
  std::thread([] {
    auto cv = std::make_shared<std::condition_variable>();
    Waiter waiter(cv);
    waiter.expect();
    WakeBatch::notify_one(cv);
    EXPECT_EQ(WakeBatch::owed(), 0u);
  }).join();
  EXPECT_EQ(WakeBatch::owed(), 0u);
}

TEST(WakeBatch, AWakeUpOutlivesTheConditionVariablesOwner) {
  WakeBatch batch;
  std::weak_ptr<std::condition_variable> watch;
  {
    auto cv = std::make_shared<std::condition_variable>();
    watch = cv;
    WakeBatch::notify_one(cv);
  }
  EXPECT_FALSE(watch.expired());  // the batch holds it until it notifies
}

}  // namespace
}  // namespace drpc
