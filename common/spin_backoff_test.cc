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

// A 4 ms yield at `t`, then checks that polling pauses for exactly `pause` after it; `t` moves
// to the pause's end.
void long_yield_pauses_for(SpinBackoff& backoff, Clock::time_point& t, milliseconds pause) {
  EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));
  t += milliseconds(4);
  EXPECT_FALSE(backoff.may_spin(t + pause - milliseconds(1))) << pause.count();
  EXPECT_TRUE(backoff.may_spin(t + pause)) << pause.count();
  t += pause;
}

TEST(SpinBackoff, ALongYieldPausesPollingAndEachLongYieldAfterAPauseDoublesIt) {
  SpinBackoff backoff;
  auto t = Clock::now();
  long_yield_pauses_for(backoff, t, milliseconds(10));
  long_yield_pauses_for(backoff, t, milliseconds(20));  // still busy
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(backoff.yielded(t, t + milliseconds(4)));
  long_yield_pauses_for(backoff, t, milliseconds(1000));  // at most a second
}

TEST(SpinBackoff, AQuietWindowStartsThePausesOver) {
  SpinBackoff backoff;
  auto t = Clock::now();
  long_yield_pauses_for(backoff, t, milliseconds(10));
  long_yield_pauses_for(backoff, t, milliseconds(20));
  backoff.quiet_window();
  long_yield_pauses_for(backoff, t, milliseconds(10));
}

TEST(SpinBackoff, PollStopsWhenDoneOrAtOnceWhilePaused) {
  SpinBackoff backoff;
  int polls = 0;
  EXPECT_TRUE(backoff.poll(Clock::now() + std::chrono::hours(1), [&] { return ++polls == 1; }));
  const auto later = Clock::now() + std::chrono::hours(1);
  EXPECT_FALSE(backoff.yielded(later, later + milliseconds(4)));  // paused until after `later`
  polls = 0;
  EXPECT_FALSE(backoff.poll(Clock::now() + std::chrono::hours(1), [&] { return ++polls > 1; }));
  EXPECT_EQ(polls, 1);
}

}  // namespace
}  // namespace drpc
