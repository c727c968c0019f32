// WakeBatch: wake-ups asked for while a batch is open on a thread are made once each, when
// the outermost batch ends; elsewhere at once.

#include "common/wake_batch.h"

#include <gtest/gtest.h>

#include <thread>

namespace drpc {
namespace {

TEST(WakeBatch, WakesAtOnceWithoutABatch) {
  int woken = 0;
  WakeBatch::wake(&woken, [&] { ++woken; });
  EXPECT_EQ(woken, 1);
}

TEST(WakeBatch, DefersWakesToTheEndOfTheBatchOncePerKey) {
  int first = 0, second = 0;
  {
    WakeBatch batch;
    for (int i = 0; i < 3; ++i) WakeBatch::wake(&first, [&] { ++first; });
    WakeBatch::wake(&second, [&] { ++second; });
    EXPECT_EQ(first, 0);
    EXPECT_EQ(second, 0);
  }
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 1);
  WakeBatch::wake(&first, [&] { ++first; });  // the batch is over: at once again
  EXPECT_EQ(first, 2);
}

TEST(WakeBatch, AnInnerBatchLeavesItsWakesToTheOuterOne) {
  int woken = 0;
  {
    WakeBatch outer;
    {
      WakeBatch inner;
      WakeBatch::wake(&woken, [&] { ++woken; });
    }
    EXPECT_EQ(woken, 0);
    WakeBatch::wake(&woken, [&] { ++woken; });
  }
  EXPECT_EQ(woken, 1);
}

TEST(WakeBatch, ABatchDefersOnlyItsOwnThreadsWakes) {
  WakeBatch batch;
  int woken = 0;
  std::thread([&] { WakeBatch::wake(&woken, [&] { ++woken; }); }).join();
  EXPECT_EQ(woken, 1);
}

}  // namespace
}  // namespace drpc
