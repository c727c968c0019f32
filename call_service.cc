#include "call_service.h"

#include <algorithm>
#include <chrono>

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "drpc.h"
#include "rpc/call_codec.h"
#include "rpc/proto/rpc.pb.h"
#include "runtime_scope.h"

namespace drpc {
namespace {

// Calls of builtin operators on at most this many tensor bytes are served on the network
// thread that received them: an ATen kernel cannot wait on RPC, and on small tensors the
// hop to a handler thread costs more than the kernel (pipelined rpc_async of aten::add:
// 36,000 -> 80,000 calls/s on 2 cores, tools/bench/rpc.sh).
constexpr size_t kInlineBuiltinBytes = 64 * 1024;
// How long rpc_sync polls for its reply before it sleeps (see rpc_sync).
constexpr auto kSyncReplyPoll = std::chrono::microseconds(100);

bool cheap_builtin_call(const std::string& what, const Message& request) {
  // Not factories (no tensor in: the output's size is an argument), not in an autograd
  // context (the recorded functions are the handler threads' to run).
  if (what.rfind("aten::", 0) != 0 || request.tensors.empty() || !request.extensions.empty()) return false;
  size_t bytes = 0;
  for (const auto& t : request.tensors) bytes += t.nbytes();
  if (bytes > kInlineBuiltinBytes) return false;
  try {  // the label is the caller's word; the function named inside is what runs
    return call_function(request.payload).rfind("aten::", 0) == 0;
  } catch (const Error&) {
    return false;  // the handler says what is malformed
  }
}

}  // namespace

using runtime_internal::CurrentAutogradContext;
using runtime_internal::CurrentRuntime;

CallService::CallService(Runtime& runtime, RpcAgent& agent, RRefContext& rrefs, AutogradContainer& autograd,
                         FunctionRegistry& functions, Tracer& tracer)
    : runtime_(runtime), agent_(agent), rrefs_(rrefs), autograd_(autograd), functions_(functions), tracer_(tracer) {
  agent_.register_handler(
      kCallRequest, [this](const WorkerInfo& from, Message request) { return serve(from, request); },
      cheap_builtin_call);
}

FuturePtr CallService::rpc_async(const std::string& to, const std::string& fn, std::vector<c10::IValue> args,
                                 Kwargs kwargs, std::chrono::milliseconds timeout) {
  ValueHooks hooks;
  FuturePtr reply = send(to, fn, args, kwargs, timeout, &hooks);
  // The reply completes on a network thread; the user's future, and whatever its
  // callbacks do, on a callback thread.
  return complete_on_callback_thread(agent_, reply, [hooks = std::move(hooks)](const c10::IValue& done) {
    return decode_result(message_from_ivalue(done), hooks);
  });
}

// Waits on the reply itself and decodes it here: no hop through a callback thread. A quick
// call's reply arrives within tens of microseconds: the caller polls for it that long,
// yielding the core to any thread with work, before it sleeps (a sleeping thread's wake-up
// costs about as much again on a busy 2-core machine); not while other work holds the cores
// (SpinBackoff).
c10::IValue CallService::rpc_sync(const std::string& to, const std::string& fn, std::vector<c10::IValue> args,
                                  Kwargs kwargs, std::chrono::milliseconds timeout) {
  ValueHooks hooks;
  FuturePtr reply = send(to, fn, args, kwargs, timeout, &hooks);
  reply_poll_.poll(std::chrono::steady_clock::now() + kSyncReplyPoll, [&] { return reply->completed(); });
  reply->wait();
  return decode_result(message_from_ivalue(reply->value()), hooks);  // value() rethrows the call's error
}

FuturePtr CallService::send(const std::string& to, const std::string& fn, const std::vector<c10::IValue>& args,
                            const Kwargs& kwargs, std::chrono::milliseconds timeout, ValueHooks* hooks) {
  const WorkerInfo dst = agent_.worker(to);
  if (timeout == kDefaultTimeout) timeout = agent_.default_timeout();
  *hooks = rrefs_.hooks(dst.id);
  Message request{kCallRequest, "", {}};
  encode_call(fn, args, kwargs, *hooks, &request.payload, &request.tensors);
  return agent_.send(dst, std::move(request), timeout, fn);
}

FuturePtr CallService::serve(const WorkerInfo& from, const Message& request) {
  CurrentRuntime current(&runtime_);
  ValueHooks hooks = rrefs_.hooks(from.id);
  CallArgs args;
  std::string fn;
  decode_call(request.payload, request.tensors, hooks, &fn, &args.args, &args.kwargs);
  FuturePtr confirmed;
  if (args.kwargs.empty()) {
    confirmed = rrefs_.confirmations(args.args);
  } else {
    std::vector<c10::IValue> all = args.args;
    for (const auto& kw : args.kwargs) all.push_back(kw.second);
    confirmed = rrefs_.confirmations(all);
  }
  const int64_t autograd_context = autograd_.context_of(request.extensions);
  // A profiled request's trace follows the function if it runs on another thread.
  auto profiled = tracer_.serving();
  auto run = [this, fn, autograd_context, profiled](CallArgs args) {
    CurrentRuntime current(&runtime_);
    Tracer::Scope scope(&tracer_, profiled);
    // Calls the function makes belong to the caller's autograd context.
    CurrentAutogradContext in_context(autograd_, autograd_context);
    return functions_.call(fn, std::move(args), agent_.self().name);
  };
  auto encode = [fn = std::move(fn), hooks = std::move(hooks)](const c10::IValue& value) {
    return message_to_ivalue(encode_result(0, value, ValuePath(fn, ": result"), hooks));
  };
  // The function runs once the owners have confirmed every RRef among its arguments:
  // mostly at once (no RRef, or confirmed), and then, if it finishes at once too, its reply
  // is encoded here, without the futures and callbacks that chain the other case.
  FuturePtr out;
  if (confirmed->completed()) {
    out = run(std::move(args));
    if (out->completed() && !out->hasError()) {
      auto reply = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
      try {
        reply->markCompleted(encode(out->value()));
      } catch (...) {
        reply->setError(std::current_exception());
      }
      return reply;
    }
  } else {
    auto result = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    after_on_pool(agent_, confirmed, [args = std::move(args), result, run]() mutable {
      forward_future(run(std::move(args)), result);
    });
    out = result;
  }
  return out->then([encode = std::move(encode)](c10::ivalue::Future& done) { return encode(done.value()); },
                   c10::AnyType::get());
}

FuturePtr CallService::run(const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                           const Extensions& caller) {
  CurrentRuntime current(&runtime_);
  CurrentAutogradContext in_context(autograd_, autograd_.context_of(caller));
  return functions_.call(fn, CallArgs{std::move(args), std::move(kwargs)}, agent_.self().name);
}

FuturePtr CallService::apply(const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args,
                             Kwargs kwargs, const Extensions& caller) {
  CurrentRuntime current(&runtime_);
  CurrentAutogradContext in_context(autograd_, autograd_.context_of(caller));
  return apply_here(value, fn, std::move(args), std::move(kwargs));
}

FuturePtr CallService::apply_here(const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args,
                                  Kwargs kwargs) {
  // A plain name is a method; qualified names ("my.fn", "aten::add") name functions.
  const bool method = !fn.empty() && std::all_of(fn.begin(), fn.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  auto no_method = [&] {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    future->setError(std::make_exception_ptr(Error(ErrorKind::kBadArgument, "a value of type " + value.type()->str() +
                                                                                " on " + agent_.self().name +
                                                                                " has no method '" + fn + "'")));
    return future;
  };
  if (value.isObject()) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    try {
      torch::jit::Module module(value.toObject());
      if (!module.find_method(fn)) return no_method();
      CallArgs call{std::move(args), std::move(kwargs)};
      future->markCompleted(FunctionRegistry::call_script(module, fn, call));
    } catch (const Error&) {
      future->setError(std::current_exception());
    } catch (const std::exception& e) {
      future->setError(
          std::make_exception_ptr(Error(ErrorKind::kRemote, fn + " raised on " + agent_.self().name + ": " + e.what())));
    }
    return future;
  }
  std::string resolved = fn;
  if (method) {
    resolved = "aten::" + fn;
    if (torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(resolved)).empty()) return no_method();
  }
  args.insert(args.begin(), value);
  return functions_.call(resolved, CallArgs{std::move(args), std::move(kwargs)}, agent_.self().name);
}

}  // namespace drpc
