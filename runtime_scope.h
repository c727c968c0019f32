#pragma once

// What a served call sets on the thread that runs it, for the duration of the call: the
// runtime the free API functions (drpc::rpc_sync, ...) reach, and the caller's
// distributed autograd context. Internal to //:drpc.

#include <cstdint>

#include "dist_autograd/dist_autograd.h"

namespace drpc {

class Runtime;

namespace runtime_internal {

// The runtime serving a call on this thread, or null.
inline thread_local Runtime* serving_runtime = nullptr;

class CurrentRuntime {
 public:
  explicit CurrentRuntime(Runtime* runtime) : previous_(serving_runtime) { serving_runtime = runtime; }
  ~CurrentRuntime() { serving_runtime = previous_; }
  CurrentRuntime(const CurrentRuntime&) = delete;
  CurrentRuntime& operator=(const CurrentRuntime&) = delete;

 private:
  Runtime* previous_;
};

// Puts the thread in a caller's distributed autograd context (-1: none) while it serves
// the call, so that the calls the function makes are recorded in it.
class CurrentAutogradContext {
 public:
  CurrentAutogradContext(AutogradContainer& autograd, int64_t context)
      : autograd_(autograd), previous_(autograd.current_context()) {
    autograd_.set_current_context(context);
  }
  ~CurrentAutogradContext() { autograd_.set_current_context(previous_); }
  CurrentAutogradContext(const CurrentAutogradContext&) = delete;
  CurrentAutogradContext& operator=(const CurrentAutogradContext&) = delete;

 private:
  AutogradContainer& autograd_;
  int64_t previous_;
};

}  // namespace runtime_internal
}  // namespace drpc
