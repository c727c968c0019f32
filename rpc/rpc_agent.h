#pragma once

#include <ATen/core/ivalue.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "rpc/message.h"

namespace drpc {

class Metrics;
class Tracer;

// A worker of the job: its unique name and its id (its rank).
struct WorkerInfo {
  std::string name;
  int id = -1;
};

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

// Replies travel inside libtorch futures as a capsule holding the Message.
struct MessageCapsule : torch::CustomClassHolder {
  explicit MessageCapsule(Message m) : message(std::move(m)) {}
  Message message;
};
inline c10::IValue message_to_ivalue(Message message) {
  return c10::IValue::make_capsule(c10::make_intrusive<MessageCapsule>(std::move(message)));
}
// The Message in a reply future's value. Throws Error(kInternal) naming what it holds
// instead if it is not one (a handler that completed its future with something else).
inline const Message& message_from_ivalue(const c10::IValue& value) {
  auto* capsule = value.isCapsule() ? dynamic_cast<MessageCapsule*>(value.toCapsule().get()) : nullptr;
  if (!capsule) {
    throw Error(ErrorKind::kInternal,
                std::string("a reply future holds ") + value.tagKind() + ", not a drpc Message");
  }
  return capsule->message;
}
// A future that will hold a Message.
inline FuturePtr make_message_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
}
// Completes `to` as `from` completes, with its value or its error, on the thread that
// completes `from`. Nothing else may complete `to`.
inline void forward_future(const FuturePtr& from, const FuturePtr& to) {
  from->addCallback([to](c10::ivalue::Future& done) {
    if (done.hasError()) {
      to->setError(done.exception_ptr());
    } else {
      to->markCompleted(done.value());
    }
  });
}

// Sends messages between the workers of one job and dispatches those that arrive to
// the handler registered for their type. Every method is thread-safe.
// What a call is: `function` labels it in both sides' metrics and traces (one label per
// function, however many objects it is called on), `detail` says which object (an RRef's
// id) in error texts only. A plain string is a function with no detail.
struct CallName {
  CallName() = default;
  CallName(std::string function_name, std::string call_detail = "")  // NOLINT: implicit on purpose
      : function(std::move(function_name)), detail(std::move(call_detail)) {}
  CallName(const char* function_name) : function(function_name) {}  // NOLINT
  std::string text() const { return detail.empty() ? function : function + " " + detail; }
  std::string function;
  std::string detail;
};

class RpcAgent {
 public:
  // Serves one request; returns a future of the reply Message (a handler may complete it
  // later, from any thread, without holding the thread it was called on). Throwing, or
  // completing the future with an error, sends the error to the caller.
  using Handler = std::function<FuturePtr(const WorkerInfo& from, Message request)>;

  // Hooks that may rewrite every request and reply: on_send just before a message leaves,
  // on_receive as soon as one arrives (before its handler or its caller's future).
  struct Interceptor {
    std::function<void(const WorkerInfo& to, Message& message)> on_send;
    std::function<void(const WorkerInfo& from, Message& message)> on_receive;
  };

  RpcAgent() = default;
  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;
  virtual ~RpcAgent() = default;

  virtual const WorkerInfo& self() const = 0;
  // Throws Error(kBadArgument) naming the worker when there is none such.
  virtual WorkerInfo worker(const std::string& name) const = 0;
  virtual WorkerInfo worker(int id) const = 0;
  virtual std::vector<WorkerInfo> workers() const = 0;

  // The job's default deadline for send(); set_default_timeout changes it for the calls
  // made from then on (0: none), like torch's _set_rpc_timeout.
  virtual std::chrono::milliseconds default_timeout() const = 0;
  virtual void set_default_timeout(std::chrono::milliseconds timeout) = 0;

  // Sends `request` to `to` (which may be this worker) and returns a future of the reply
  // Message. It fails with an Error: kTimeout once `timeout` passes (0: never), naming `to`
  // and `what`; kPeerUnavailable when `to` goes away; kRemote (or the remote's own kind)
  // when the handler failed, with the remote worker's name and message; kShutdown after
  // shutdown. Throws kBadArgument for an unknown worker and kShutdown when stopped.
  virtual FuturePtr send(const WorkerInfo& to, Message request, std::chrono::milliseconds timeout,
                         CallName what) = 0;

  // Which requests run on the network thread that received them instead of a handler
  // thread: cheap ones (protocol messages that must never wait behind busy handler threads,
  // small builtin calls that would spend more on the hop than on their work). They must not
  // block. `what` is the request's label (a call's function name, as its caller gave it).
  using InlinePolicy = std::function<bool(const std::string& what, const Message& request)>;
  static InlinePolicy always_inline() {
    return [](const std::string&, const Message&) { return true; };
  }

  // Registers the handler for `type`, run inline for the requests `run_inline` picks (none
  // when null); set before start(). Not thread-safe with send().
  virtual void register_handler(int32_t type, Handler handler, InlinePolicy run_inline = nullptr) = 0;
  virtual void add_interceptor(Interceptor interceptor) = 0;

  // Called once per peer that is gone (its connection broke, it went silent past the
  // heartbeat window, or it shut down: the reason says which), before the calls pending
  // to it fail, so their callers see the cleanup done. Runs on a network or timer
  // thread: it must not block. Add before start().
  using PeerFailureListener = std::function<void(const WorkerInfo& peer, const Error& reason)>;
  virtual void add_peer_failure_listener(PeerFailureListener listener) = 0;

  // Records this agent's calls into `metrics` and, while `tracer` profiles, their spans
  // (both borrowed and outliving the agent; null: not recorded). Set before start().
  virtual void set_instruments(Metrics* metrics, Tracer* tracer) = 0;

  // Runs `task` on a handler thread, where it may block (unlike future callbacks, which
  // can run on network threads). Dropped after shutdown.
  virtual void run_on_pool(std::function<void()> task) = 0;

  // Runs `task` on a callback thread: never a network or handler thread, and one that may
  // block (make RPCs, wait on futures), since the callback threads grow when all are
  // busy. Where futures handed to users complete, so their `then` callbacks run there.
  // After shutdown it runs on the calling thread. Never dropped.
  virtual void run_callback(std::function<void()> task) = 0;

  // Starts serving requests. Messages that arrive before are held until then.
  virtual void start() = 0;

  // Blocks until every live worker of the job has called join (as many times as this one)
  // and no worker has a request outstanding, however long that takes; requests are served
  // meanwhile. Workers known to be gone are not waited for. Throws kTimeout naming the
  // wait if `timeout` (0: none) passes first, kShutdown if the agent stops meanwhile.
  virtual void join(std::chrono::milliseconds timeout) = 0;
  void join() { join(std::chrono::milliseconds(0)); }

  // graceful: join(), then stop everywhere. Otherwise stop at once; pending calls fail
  // with kShutdown. Idempotent.
  virtual void shutdown(bool graceful) = 0;
};

// Runs `fn` once `future` completes on one of `agent`'s handler threads: never on the thread
// that completes the future, which may be a network thread.
inline void after_on_pool(RpcAgent& agent, const FuturePtr& future, std::function<void()> fn) {
  RpcAgent* a = &agent;
  future->addCallback([a, fn = std::move(fn)](c10::ivalue::Future&) mutable { a->run_on_pool(std::move(fn)); });
}

// A future of `decode(reply's value)` (or of the reply's error), completed on one of
// `agent`'s callback threads: what users are handed, so that their `then` callbacks never
// run on the network thread that completes `reply`. `agent` must outlive `reply`.
inline FuturePtr complete_on_callback_thread(RpcAgent& agent, const FuturePtr& reply,
                                             std::function<c10::IValue(const c10::IValue&)> decode) {
  auto result = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  RpcAgent* a = &agent;
  // Moved, not copied, from closure to closure: a decoder holds the call's RRef hooks, whose
  // copies allocate.
  reply->addCallback([a, result, decode = std::move(decode)](c10::ivalue::Future& done) mutable {
    a->run_callback([result, decode = std::move(decode), done = FuturePtr::reclaim_copy(&done)] {
      if (done->hasError()) {
        result->setError(done->exception_ptr());
        return;
      }
      try {
        result->markCompleted(decode(done->value()));
      } catch (...) {
        result->setError(std::current_exception());
      }
    });
  });
  return result;
}

}  // namespace drpc
