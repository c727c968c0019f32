#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace drpc {

// The handle of one asynchronous process-group operation. Thread-safe. Completes exactly
// once, with result tensors (and, for a receive from any source, the source rank) or
// with an error. Shared because completion callbacks may outlive the caller's handle.
class Work {
 public:
  static constexpr std::chrono::milliseconds kNoTimeout{0};

  Work() : Work(std::string("a process-group operation")) {}
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the operation completes, then rethrows its error if it failed. Throws
  // Error(kTimeout) if `timeout` (0 = no limit) passes first; the operation goes on.
  void wait(std::chrono::milliseconds timeout = kNoTimeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return done_; });
    } else if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
      throw Error(ErrorKind::kTimeout, "waited " + std::to_string(timeout.count()) + " ms for " + describe_());
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  // Null while running or after success.
  std::exception_ptr exception() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  // The tensors the operation produced (received or gathered); valid once completed.
  std::vector<at::Tensor> result() const {
    std::lock_guard<std::mutex> lock(mu_);
    return result_;
  }

  // The rank a receive-from-any-source got its tensors from; -1 for other operations.
  int source_rank() const {
    std::lock_guard<std::mutex> lock(mu_);
    return source_rank_;
  }

  // Runs `callback` once the operation completes: at once on this thread if it already
  // has, otherwise on the completing thread. Callbacks must not block.
  void on_completion(std::function<void(Work&)> callback) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!done_) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    callback(*this);
  }

  // --- for implementations -------------------------------------------------------
  explicit Work(std::string what) : describe_([what = std::move(what)] { return what; }) {}
  // For operations made on every message: the text is built only if a wait times out.
  explicit Work(std::function<std::string()> describe) : describe_(std::move(describe)) {}

  void finish(std::vector<at::Tensor> result = {}, int source_rank = -1) {
    complete(nullptr, std::move(result), source_rank);
  }
  void finish_with_error(std::exception_ptr error) { complete(std::move(error), {}, -1); }

 private:
  void complete(std::exception_ptr error, std::vector<at::Tensor> result, int source_rank) {
    std::vector<std::function<void(Work&)>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;  // first completion wins; later ones are races with shutdown
      done_ = true;
      error_ = std::move(error);
      result_ = std::move(result);
      source_rank_ = source_rank;
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    for (auto& callback : callbacks) callback(*this);
  }

  const std::function<std::string()> describe_;  // names the operation in a timeout
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<at::Tensor> result_;
  int source_rank_ = -1;
  std::vector<std::function<void(Work&)>> callbacks_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace drpc
