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
// Thread-compatible: a batch belongs to the thread that opened it.

#include <functional>
#include <utility>
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
    current() = nullptr;
    for (auto& deferred : deferred_) deferred.second();
  }

  // Calls `wake` when this thread's open batch ends, once per `key` however often it is
  // asked (the first `wake` given for it), or at once when no batch is open. `wake` must
  // stay safe to call after its asker is gone (hold what it notifies by shared_ptr), and
  // is called without the asker's locks: call this without holding them either.
  static void wake(const void* key, std::function<void()> wake) {
    WakeBatch* batch = current();
    if (batch == nullptr) {
      wake();
      return;
    }
    for (const auto& deferred : batch->deferred_) {
      if (deferred.first == key) return;
    }
    batch->deferred_.emplace_back(key, std::move(wake));
  }

 private:
  static WakeBatch*& current() {
    static thread_local WakeBatch* batch = nullptr;
    return batch;
  }

  WakeBatch* const outer_;
  std::vector<std::pair<const void*, std::function<void()>>> deferred_;
};

}  // namespace drpc
