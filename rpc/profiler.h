#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace drpc {

// One span of a profile: something a worker did for a call, on one of its threads.
//   category "rpc"      a call, on the caller's thread, named by its function
//            "send"     the caller preparing and handing the request to the transport
//            "network"  request or reply in transit (args.direction), on the caller's thread
//            "queue"    the request waiting for a handler thread, on the callee
//            "execute"  the handler running until the reply is ready, on the callee,
//                       named by the function
struct TraceEvent {
  std::string name;
  std::string category;
  int worker = -1;   // rank
  int64_t tid = 0;   // the OS thread id
  std::string thread;
  int64_t start_ns = 0;  // steady clock of the worker that holds the event (see Tracer)
  int64_t duration_ns = 0;
  std::vector<std::pair<std::string, std::string>> args;
  // Unique in a profile; `parent` is the span this one is part of on the same thread (a
  // call's send and network spans, the calls an execution makes), 0 for none.
  uint64_t id = 0;
  uint64_t parent = 0;
};

// Collects the events of a profile, or of one profiled request. Thread-safe.
class TraceCollector {
 public:
  // `parent`: the span that calls recorded here are part of (a request's execution).
  explicit TraceCollector(uint64_t parent = 0) : parent_(parent) {}
  uint64_t parent() const { return parent_; }
  void add(TraceEvent event);
  void add_all(std::vector<TraceEvent> events);
  std::vector<TraceEvent> take();

 private:
  const uint64_t parent_;
  std::mutex mu_;
  std::vector<TraceEvent> events_;  // guarded by mu_
};

// One worker's profiling switch. While a profile runs (start() .. stop()), every call the
// worker sends asks its callee to record spans and return them with the reply, together
// with the spans of the calls the callee makes while serving it (Scope); the caller
// aligns them to its own clock and keeps them. When nothing is profiled, the agent's cost
// is one relaxed atomic load per call (active()). Thread-safe.
class Tracer {
 public:
  Tracer() = default;
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Throws Error(kBadArgument) if a profile is already running on this worker.
  void start();
  // Ends the profile and returns its events (calls still in flight are left out). Returns
  // nothing if none runs.
  std::vector<TraceEvent> stop();

  // False means no call sent now needs recording.
  bool active() const { return active_.load(std::memory_order_relaxed) != 0; }
  // Where a call sent now from this thread records: the profiled request this thread
  // serves, else the running profile; null when neither.
  std::shared_ptr<TraceCollector> collector_for_send();
  // The profiled request this thread serves (null if none), to carry it to another thread.
  std::shared_ptr<TraceCollector> serving() const;
  // A span id no other span of this worker (`rank`) or of another worker has.
  uint64_t new_span_id(int rank) {
    return (static_cast<uint64_t>(rank + 1) << 48) | next_span_.fetch_add(1, std::memory_order_relaxed);
  }

  // While it lives, calls this thread sends belong to `collector` (a profiled request this
  // worker serves). A null collector makes it a no-op.
  class Scope {
   public:
    Scope(Tracer* tracer, std::shared_ptr<TraceCollector> collector);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer* tracer_;
    bool engaged_;
    const Tracer* previous_tracer_;
    std::shared_ptr<TraceCollector> previous_;
  };

 private:
  std::atomic<int> active_{0};  // the running profile plus live Scopes
  std::atomic<uint64_t> next_span_{1};
  std::mutex mu_;
  std::shared_ptr<TraceCollector> profile_;  // guarded by mu_
};

// How a callee's clock maps onto its caller's, from the four timestamps of one call: the
// request left the caller at `sent` and its reply arrived at `receipt` (caller's clock);
// it arrived at `arrival` and was answered at `reply` (callee's clock). The network is
// taken to be equally slow both ways, so callee time t is caller time t - offset, and
// sent + request_ns + (reply - arrival) + reply_ns == receipt exactly (if the callee's
// interval exceeds the caller's, as a clock drifting fast can make it, the network gets 0).
struct ClockAlignment {
  int64_t offset = 0;
  int64_t request_ns = 0;
  int64_t reply_ns = 0;
};
ClockAlignment align_clocks(int64_t sent, int64_t arrival, int64_t reply, int64_t receipt);

// Now on the steady clock, in ns.
int64_t steady_now_ns();
// The calling thread's OS id and its name in traces ("main", "handler 2", ...).
int64_t current_thread_id();
const std::string& current_thread_name();
void set_current_thread_name(const std::string& name);
// For threads the caller does not own (a transport's): keeps a name given before.
void name_current_thread_if_unnamed(const std::string& name);

// A Chrome trace (JSON object format, opened by chrome://tracing and Perfetto): one "X"
// event per span; each worker is a process (pid = rank + 1, as pid 0 is special to
// Perfetto; named by `worker_names[rank]`), each of its threads a row. Times are in us
// from the earliest event. Viewers need the spans of a row properly nested, so spans that
// overlap without one containing the other (calls in flight together, from rpc_async)
// move, with their parts, to extra rows of that thread named "<thread> (async N)".
std::string to_chrome_trace(const std::vector<TraceEvent>& events, const std::vector<std::string>& worker_names);

}  // namespace drpc
