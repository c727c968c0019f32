#pragma once

// drpc's call requests (rpc_sync, rpc_async): sending them, serving them, and running the
// functions and methods the RRef layer asks a worker to run, each in its caller's
// distributed autograd context and with the runtime current. Internal to //:drpc.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/spin_backoff.h"
#include "dist_autograd/dist_autograd.h"
#include "rpc/function_registry.h"
#include "rpc/profiler.h"
#include "rpc/rpc_agent.h"
#include "rref/rref_context.h"

namespace drpc {

class Runtime;

class CallService {
 public:
  // Every argument is borrowed and must outlive the service. Registers the call handler
  // on `agent` (before agent.start()).
  CallService(Runtime& runtime, RpcAgent& agent, RRefContext& rrefs, AutogradContainer& autograd,
              FunctionRegistry& functions, Tracer& tracer);
  CallService(const CallService&) = delete;
  CallService& operator=(const CallService&) = delete;

  // drpc::rpc_async: the future completes on a callback thread with the result, or the
  // call's error (timeouts, a gone peer, a remote failure). Thread-safe.
  FuturePtr rpc_async(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                      std::chrono::milliseconds timeout);
  // drpc::rpc_sync: waits on the reply itself; throws the call's error. Thread-safe.
  c10::IValue rpc_sync(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                       std::chrono::milliseconds timeout);

  // RRefContext::Run: `fn` from the registry, for a caller whose request carried `caller`.
  FuturePtr run(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs, const Extensions& caller);
  // RRefContext::Apply: `fn` on a value this worker owns: a method of the value (a
  // TorchScript object's, or a builtin operator's with the value as `self`, as Python's
  // tensor methods), else a registered function (or operator) named in full with the
  // value as its first argument.
  FuturePtr apply(const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                  const Extensions& caller);

 private:
  // Encodes and sends a call; `hooks` receives the RRef hooks its reply decodes with.
  FuturePtr send(const std::string& to, const std::string& fn, const std::vector<c10::IValue>& args,
                 const Kwargs& kwargs, std::chrono::milliseconds timeout, ValueHooks* hooks);
  FuturePtr serve(const WorkerInfo& from, const Message& request);
  FuturePtr apply_here(const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs);

  Runtime& runtime_;
  RpcAgent& agent_;
  RRefContext& rrefs_;
  AutogradContainer& autograd_;
  FunctionRegistry& functions_;
  Tracer& tracer_;
  SpinBackoff reply_poll_;  // rpc_sync's, shared by its callers
};

}  // namespace drpc
