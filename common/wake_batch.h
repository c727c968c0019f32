#pragma once

// Wake-ups a network thread owes for a burst of messages, made once when the burst ends.
//
// A thread that delivers messages one by one (a link's progress thread, a gRPC reader)
// opens a WakeBatch around each burst it takes in. A pool that a delivery hands work to
// (CallbackPool) defers waking its idle thread to the end of the open batch, once per pool,
// instead of waking it for every message: woken per message, the pool thread finishes each
// task before the next is queued and sleeps again, two context switches per message.
// Without an open batch, wake-ups happen at once.
//
// A deliverer about to do long work inside a batch (a large body to copy) flushes it first.
// Thread-compatible: a batch belongs to the thread that opened it.

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <vector>

namespace drpc {

class WakeBatch {
 public:
  WakeBatch() : outer_(current()) {
    if (outer_ == nullptr) current() = this;
  }
  WakeBatch(const WakeBatch&) = delete;
  WakeBatch& operator=(const WakeBatch&) = delete;
  // The outermost batch on this thread makes the deferred wake-ups; an inner one leaves
  // them to it.
  ~WakeBatch() {
    if (outer_ != nullptr) return;
    flush();
    current() = nullptr;
  }

  // Notifies one waiter of `cv` when this thread's open batch ends (once however often it
  // is asked), or at once when no batch is open. The batch holds `cv` by shared_ptr, so its
  // owner may go away first. Call without holding the mutex the waiters use.
  static void notify_one(const std::shared_ptr<std::condition_variable>& cv) {
    WakeBatch* batch = current();
    if (batch == nullptr) {
      cv->notify_one();
      return;
    }
    for (const auto& owed : batch->owed_) {
      if (owed == cv) return;
    }
    batch->owed_.push_back(cv);
  }

  // Makes the wake-ups this thread's open batch owes now; the batch stays open. For a
  // deliverer about to do long work (copy a large body), so what it delivered before does
  // not wait for that.
  static void flush() {
    WakeBatch* batch = current();
    if (batch == nullptr) return;
    std::vector<std::shared_ptr<std::condition_variable>> owed;
    owed.swap(batch->owed_);
    for (const auto& cv : owed) cv->notify_one();
  }

  // How many wake-ups this thread's open batch owes (0 without one).
  static size_t owed() {
    WakeBatch* batch = current();
    return batch == nullptr ? 0 : batch->owed_.size();
  }

 private:
  static WakeBatch*& current() {
    static thread_local WakeBatch* batch = nullptr;
    return batch;
  }

  WakeBatch* const outer_;
  std::vector<std::shared_ptr<std::condition_variable>> owed_;
};

}  // namespace drpc
