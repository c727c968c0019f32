#pragma once

// Polling with sched_yield (for a reply or a message expected within microseconds) pays only
// while the cores are not busy with other work. A yield that took kLongYield let another
// thread run a whole time slice: CPU-bound work shares the cores (two busy loops beside a
// 3-worker job made 16% of yields take 4 ms here, and a 3-worker training epoch 3x slower
// than without polling). Every further yield would then cost a slice, while a thread asleep
// on an event is woken at once, so polling pauses: 10 ms after a long yield, twice as long
// after each long yield that follows a pause, up to 1 s, and back to 10 ms once a whole
// polling window went by without one. drpc's own threads seldom hold a core that long.

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>

namespace drpc {

class SpinBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::nanoseconds kLongYield = std::chrono::milliseconds(3);
  static constexpr std::chrono::nanoseconds kFirstPause = std::chrono::milliseconds(10);
  static constexpr std::chrono::nanoseconds kLongestPause = std::chrono::seconds(1);

  SpinBackoff() = default;
  SpinBackoff(const SpinBackoff&) = delete;
  SpinBackoff& operator=(const SpinBackoff&) = delete;

  // Whether polling may go on at `now`. Thread-safe.
  bool may_spin(Clock::time_point now) const {
    return now.time_since_epoch().count() >= pause_until_.load(std::memory_order_relaxed);
  }

  // Yields the core once. Returns false, and pauses polling for every thread that asks this
  // object, when the yield let another thread run a time slice. Thread-safe.
  bool yield() {
    const auto start = Clock::now();
    sched_yield();
    return yielded(start, Clock::now());
  }

  // What yield() does once the core is back: a yield from `start` to `end`. Thread-safe.
  bool yielded(Clock::time_point start, Clock::time_point end) {
    if (end - start < kLongYield) return true;
    const auto pause = std::clamp(std::chrono::nanoseconds(last_pause_.load(std::memory_order_relaxed)) * 2,
                                  kFirstPause, kLongestPause);
    last_pause_.store(pause.count(), std::memory_order_relaxed);
    pause_until_.store((end + pause).time_since_epoch().count(), std::memory_order_relaxed);
    return false;
  }

  // Polls until `done` returns true (then true), yielding the core between polls; false once
  // `until` passed (a quiet window), after a long yield, or at once while polling is paused.
  // Thread-safe.
  template <typename Done>
  bool poll(Clock::time_point until, const Done& done) {
    while (!done()) {
      const auto now = Clock::now();
      if (!may_spin(now)) return false;
      if (now >= until) {
        quiet_window();
        return false;
      }
      if (!yield()) return false;
    }
    return true;
  }

  // A polling window ended without a long yield: the next pause is the first again.
  // Thread-safe.
  void quiet_window() {
    if (last_pause_.load(std::memory_order_relaxed) != 0) last_pause_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<Clock::rep> pause_until_{0};
  std::atomic<std::chrono::nanoseconds::rep> last_pause_{0};
};

}  // namespace drpc
