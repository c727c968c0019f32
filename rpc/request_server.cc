#include "rpc/request_server.h"

#include <glog/logging.h>

#include "rpc/envelope.h"

namespace drpc {

RequestServer::RequestServer(std::vector<WorkerInfo> workers, int self, HandlerPool::AroundThread around,
                             Deliver deliver)
    : workers_(std::move(workers)), self_(self), deliver_(std::move(deliver)), pool_(std::move(around)) {}

void RequestServer::register_handler(int32_t type, RpcAgent::Handler handler, RpcAgent::InlinePolicy run_inline) {
  handlers_[type] = std::move(handler);
  if (run_inline) inline_policies_[type] = std::move(run_inline);
}

void RequestServer::set_instruments(Metrics* metrics, Tracer* tracer) {
  metrics_ = metrics;
  tracer_ = tracer;
}

RequestServer::Request RequestServer::receive(int source, int64_t id, const std::string& what, bool profiled,
                                              Message message, std::exception_ptr refused, int64_t arrival_ns) {
  const std::string label = function_label(what);
  Request request{source, id, std::move(message), metrics_ ? metrics_->function(label) : nullptr, label, arrival_ns,
                  profiled && tracer_ ? std::make_shared<ServeTrace>(label, tracer_->new_span_id(self_)) : nullptr,
                  std::move(refused)};
  if (metrics_) metrics_->call_received(request.fn, source);
  VLOG(1) << "request " << id << " from " << workers_[source].name << ": " << label << " (type "
          << request.message.type << (request.trace ? ", profiled" : "") << ")";
  return request;
}

bool RequestServer::serve(Request request) {
  auto policy = inline_policies_.find(request.message.type);
  if (policy != inline_policies_.end() && policy->second(request.what, request.message)) {
    run(std::move(request));
    return true;
  }
  return pool_.post([this, request = std::move(request)]() mutable { run(std::move(request)); });
}

void RequestServer::run(Request request) {
  // The reply starts with the request's extensions (rpc/message.h).
  Extensions request_extensions = request.message.extensions;
  if (request.trace) {
    request.trace->start_ns = steady_now_ns();
    request.trace->tid = current_thread_id();
    request.trace->thread = current_thread_name();
  }
  FuturePtr reply;
  auto handler = handlers_.find(request.message.type);
  if (request.refused) {
    reply = make_message_future();
    reply->setError(request.refused);
  } else if (handler == handlers_.end()) {
    reply = make_message_future();
    reply->setError(std::make_exception_ptr(Error(ErrorKind::kBadArgument,
                                                  workers_[self_].name + " has no handler for message type " +
                                                      std::to_string(request.message.type))));
  } else {
    // Calls the handler makes on this thread belong to a profiled request's trace.
    Tracer::Scope scope(tracer_, request.trace ? request.trace->collector : nullptr);
    try {
      reply = handler->second(workers_[request.source], std::move(request.message));
    } catch (...) {
      reply = make_message_future();
      reply->setError(std::current_exception());
    }
  }
  // The reply goes out when the future completes, whichever thread completes it.
  request.message = Message{};
  reply->addCallback([this, request_extensions = std::move(request_extensions),
                      served = std::move(request)](c10::ivalue::Future& done) {
    answer(done, request_extensions, served);
  });
}

void RequestServer::answer(c10::ivalue::Future& done, const Extensions& request_extensions, const Request& served) {
  const int64_t reply_ns = steady_now_ns();
  const int source = served.source;
  Message reply;
  rpc::Envelope envelope = reply_envelope(served.id, done, request_extensions, &reply);
  const bool failed = envelope.error_kind() != 0;
  if (metrics_ && served.fn) {
    metrics_->request_served(served.fn, std::chrono::nanoseconds(reply_ns - served.arrival_ns));
    if (failed) metrics_->error(false, kind_of(envelope));
  }
  VLOG(1) << "answering " << served.id << " from " << workers_[source].name << " after "
          << (reply_ns - served.arrival_ns) / 1000 << " us" << (failed ? " (error)" : "");
  if (served.trace) {
    add_served_spans(*tracer_, *served.trace, self_, workers_[source].name, served.arrival_ns, reply_ns,
                     failed ? error_kind_name(kind_of(envelope)) : nullptr, envelope.mutable_profile_spans());
  }
  deliver_(source, std::move(envelope), std::move(reply));
}

}  // namespace drpc
