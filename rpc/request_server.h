#pragma once

// The serving side of the agent: records each request as it arrives (metrics, a profiled
// request's trace), runs it on its handler (on the handler threads, or inline for the types
// registered so), and turns the handler's result into a reply envelope that carries the
// request's extensions, the metrics and the served spans. Sending the reply is the agent's:
// it gets each one through Deliver. Part of the agent's implementation
// (rpc/process_group_agent.cc).

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rpc/call_tracing.h"
#include "rpc/handler_pool.h"
#include "rpc/metrics.h"
#include "rpc/proto/rpc.pb.h"
#include "rpc/rpc_agent.h"

namespace drpc {

class RequestServer {
 public:
  // A request on its way to its handler.
  struct Request {
    int source = -1;
    int64_t id = 0;
    Message message;
    Metrics::Function* fn = nullptr;
    std::string what;  // its label, bounded
    int64_t arrival_ns = 0;
    std::shared_ptr<ServeTrace> trace;  // profiled requests only
    std::exception_ptr refused;         // an interceptor refused it: the answer
  };

  // Gets the reply to a request from `source`: `envelope` has the request's id, the type or
  // error and the spans; `reply` its payload, tensors and extensions. On whichever thread
  // completed the handler's future; it must not throw.
  using Deliver = std::function<void(int source, rpc::Envelope envelope, Message reply)>;

  // `workers` names the peers by rank; `self` is this worker's rank; `around` wraps each
  // handler thread's loop (HandlerPool).
  RequestServer(std::vector<WorkerInfo> workers, int self, HandlerPool::AroundThread around, Deliver deliver);
  RequestServer(const RequestServer&) = delete;
  RequestServer& operator=(const RequestServer&) = delete;

  // Before start(): the handler of a message type, run inline (on the arriving thread) for
  // the requests `run_inline` picks; and the instruments (either may be null; they must
  // outlive this).
  void register_handler(int32_t type, RpcAgent::Handler handler, RpcAgent::InlinePolicy run_inline);
  void set_instruments(Metrics* metrics, Tracer* tracer);

  // A request arrived from `source` at `arrival_ns`, labelled `what` by its caller (bounded
  // again here: a peer's bytes are not trusted), `profiled` if the caller traces it.
  // Counts it and returns it ready for serve(). Thread-safe.
  Request receive(int source, int64_t id, const std::string& what, bool profiled, Message message,
                  std::exception_ptr refused, int64_t arrival_ns);

  // Runs `request` on its handler: inline or queued on the handler threads. Its reply goes
  // to Deliver exactly once, unless the pool has stopped and drops it (false). Thread-safe.
  bool serve(Request request);

  // The handler threads (also RpcAgent::run_on_pool's).
  HandlerPool& pool() { return pool_; }

 private:
  void run(Request request);
  void answer(c10::ivalue::Future& done, const Extensions& request_extensions, const Request& served);

  const std::vector<WorkerInfo> workers_;
  const int self_;
  const Deliver deliver_;
  Metrics* metrics_ = nullptr;            // set before start()
  Tracer* tracer_ = nullptr;              // set before start()
  std::map<int32_t, RpcAgent::Handler> handlers_;  // set before start()
  std::map<int32_t, RpcAgent::InlinePolicy> inline_policies_;  // set before start()
  HandlerPool pool_;
};

}  // namespace drpc
