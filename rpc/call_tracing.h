#pragma once

// The spans of profiled calls, kept apart from the agent's matching and dispatch: what a
// caller records of a call it made (send, network, and the callee's spans moved onto its
// clock) and what a callee returns of a request it served (queue, execution, its nested
// calls). Part of the agent's implementation (rpc/process_group_agent.cc).

#include <cstdint>
#include <memory>
#include <string>

#include "rpc/profiler.h"

namespace drpc {
namespace rpc {
class Profile;
}  // namespace rpc

// A profiled call, as its caller records it.
struct CallTrace {
  std::shared_ptr<TraceCollector> collector;
  int64_t start_ns;  // send() called
  int64_t sent_ns;   // handed to the transport
  int64_t tid;
  std::string thread;
  std::string what;
};

// The record of a profiled call sent from this thread, begun at `start_ns` and handed to
// the transport now.
std::shared_ptr<CallTrace> begin_call_trace(std::shared_ptr<TraceCollector> collector, int64_t start_ns,
                                            std::string what);

// A profiled request, as its callee records it.
struct ServeTrace {
  ServeTrace(std::string what, uint64_t execute_id)
      : what(std::move(what)), execute_id(execute_id), collector(std::make_shared<TraceCollector>(execute_id)) {}
  std::string what;
  uint64_t execute_id;                        // the execution span, parent of its nested calls
  std::shared_ptr<TraceCollector> collector;  // its nested calls
  int64_t start_ns = 0;                       // handler started
  int64_t tid = 0;
  std::string thread;
};

// The caller's spans of call `t` from worker `self` to `peer`, ended at `end_ns` (with
// `error`'s kind name, or null), plus the callee's (`profile`, if it answered: moved onto
// this worker's clock), go to the call's collector. `tracer` numbers the spans.
void record_call_spans(Tracer& tracer, const CallTrace& t, int self, const std::string& peer,
                       const rpc::Profile* profile, int64_t end_ns, const char* error);

// Fills `out` with a served request's spans on worker `self`: its queue and execution (from
// `from`, arrived at `arrival_ns`, answered at `reply_ns`, failed with `error` or null) and
// the calls it made meanwhile (already on this worker's clock).
void add_served_spans(Tracer& tracer, ServeTrace& t, int self, const std::string& from, int64_t arrival_ns,
                      int64_t reply_ns, const char* error, rpc::Profile* out);

}  // namespace drpc
