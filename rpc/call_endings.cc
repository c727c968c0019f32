#include "rpc/call_endings.h"

#include <glog/logging.h>

#include "rpc/call_tracing.h"
#include "rpc/envelope.h"
#include "rpc/metrics.h"

namespace drpc {

CallEndings::CallEndings(std::vector<WorkerInfo> workers, int self) : workers_(std::move(workers)), self_(self) {}

void CallEndings::set_instruments(Metrics* metrics, Tracer* tracer) {
  metrics_ = metrics;
  tracer_ = tracer;
}

void CallEndings::replied(PendingCall& p, const rpc::Envelope& envelope, Message reply, int64_t receipt_ns) {
  const bool error = envelope.error_kind() != 0;
  const std::string& peer = workers_[p.dst].name;
  VLOG(1) << "reply " << envelope.id() << " from " << peer << " after " << (receipt_ns - p.start_ns) / 1000 << " us"
          << (error ? " (error)" : "");
  if (metrics_ && p.fn) {
    metrics_->reply_received(p.fn, std::chrono::nanoseconds(receipt_ns - p.start_ns));
    if (error) metrics_->error(true, kind_of(envelope));
  }
  if (p.trace) {
    record(p, envelope.has_profile_spans() ? &envelope.profile_spans() : nullptr, receipt_ns,
           error ? error_kind_name(kind_of(envelope)) : nullptr);
  }
  if (error) {
    p.future->setErrorIfNeeded(std::make_exception_ptr(
        Error(kind_of(envelope), "rpc " + p.what.text() + " on " + peer + " failed: " + envelope.error())));
  } else {
    p.future->markCompleted(message_to_ivalue(std::move(reply)));
  }
}

void CallEndings::timed_out(PendingCall& p) {
  failed(p, ErrorKind::kTimeout,
         "rpc " + p.what.text() + " to " + workers_[p.dst].name + " timed out after " +
             std::to_string(p.timeout.count()) + " ms");
}

void CallEndings::peer_gone(PendingCall& p, const std::string& reason) {
  const std::string& peer = workers_[p.dst].name;
  failed(p, ErrorKind::kPeerUnavailable,
         "rpc " + p.what.text() + " to " + peer + " failed: " + peer + " is unavailable (" + reason + ")");
}

void CallEndings::not_sent(PendingCall& p, const std::exception_ptr& why) {
  std::string text;
  ErrorKind kind = ErrorKind::kPeerUnavailable;
  try {
    std::rethrow_exception(why);
  } catch (const Error& e) {
    text = e.what();
    if (e.kind() == ErrorKind::kBadArgument) kind = e.kind();  // the message itself, not the peer
  } catch (const std::exception& e) {
    text = e.what();
  } catch (...) {
    text = "unknown error";
  }
  failed(p, kind, "rpc " + p.what.text() + " to " + workers_[p.dst].name + " could not be sent: " + text);
}

void CallEndings::shut_down(PendingCall& p) {
  failed(p, ErrorKind::kShutdown, "the RPC agent of " + workers_[self_].name + " shut down before a reply came");
}

void CallEndings::failed(PendingCall& p, ErrorKind kind, const std::string& text) {
  if (metrics_ && p.fn) metrics_->error(true, kind);
  VLOG(1) << "call to " << workers_[p.dst].name << " (" << p.what.text() << ") failed: " << error_kind_name(kind);
  if (p.trace) record(p, nullptr, steady_now_ns(), error_kind_name(kind));
  p.future->setErrorIfNeeded(std::make_exception_ptr(Error(kind, text)));
}

// The caller's spans of a profiled call, with the callee's (`profile`, if it answered).
void CallEndings::record(const PendingCall& p, const rpc::Profile* profile, int64_t end_ns, const char* error) {
  record_call_spans(*tracer_, *p.trace, self_, workers_[p.dst].name, profile, end_ns, error);
}

}  // namespace drpc
