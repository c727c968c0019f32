// SpinBackoff's policy on given yield times: when polling pauses, how the pause grows, and
// when it starts over.

#include "common/spin_backoff.h"

#include <gtest/gtest.h>

namespace drpc {
namespace {

using Clock = SpinBackoff::Clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(SpinBackoff, ShortYieldsNeverPausePolling) {
  SpinBackoff backoff;
  const auto t = Clock::now();
  EXPECT_TRUE(backoff.may_spin(t));
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(backoff.yielded(t, t + microseconds(500)));
  EXPECT_TRUE(backoff.may_spin(t + microseconds(500)));
}

TEST(SpinBackoff, ALongYieldPausesPollingAndEachLongYieldAfterAPauseDoublesIt) {
  SpinBackoff backoff;
  auto t = Clock::now();
  EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));
  t += milliseconds(4);
  EXPECT_FALSE(backoff.may_spin(t + milliseconds(9)));
  EXPECT_TRUE(backoff.may_spin(t + milliseconds(10)));
  t += milliseconds(10);
  EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));  // still busy: 20 ms
  t += milliseconds(4);
  EXPECT_FALSE(backoff.may_spin(t + milliseconds(19)));
  EXPECT_TRUE(backoff.may_spin(t + milliseconds(20)));
  for (int i = 0; i < 20; ++i) {
    t += std::chrono::seconds(2);
    EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));
    t += milliseconds(4);
  }
  EXPECT_FALSE(backoff.may_spin(t + milliseconds(999)));  // at most a second
  EXPECT_TRUE(backoff.may_spin(t + milliseconds(1000)));
}

TEST(SpinBackoff, AQuietWindowStartsThePausesOver) {
  SpinBackoff backoff;
  auto t = Clock::now();
  EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));
  t += milliseconds(20);
  EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));  // 20 ms
  t += milliseconds(40);
  backoff.quiet_window();
  EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));
  t += milliseconds(4);
  EXPECT_FALSE(backoff.may_spin(t + milliseconds(9)));
  EXPECT_TRUE(backoff.may_spin(t + milliseconds(10)));  // 10 ms again
}

}  // namespace
}  // namespace drpc
