#include "rpc/call_tracing.h"

#include <utility>
#include <vector>

#include "rpc/proto/rpc.pb.h"

namespace drpc {
namespace {

void to_proto(const TraceEvent& e, rpc::Span* s) {
  s->set_name(e.name);
  s->set_category(e.category);
  s->set_worker(e.worker);
  s->set_tid(e.tid);
  s->set_thread(e.thread);
  s->set_start_ns(e.start_ns);
  s->set_duration_ns(e.duration_ns);
  s->set_id(e.id);
  s->set_parent(e.parent);
  for (const auto& [k, v] : e.args) {
    auto* arg = s->add_args();
    arg->set_key(k);
    arg->set_value(v);
  }
}

// `shift` moves the span from its sender's clock onto ours.
TraceEvent from_proto(const rpc::Span& s, int64_t shift) {
  TraceEvent e{s.name(), s.category(), s.worker(), s.tid(), s.thread(), s.start_ns() + shift, s.duration_ns(), {}};
  for (const auto& arg : s.args()) e.args.emplace_back(arg.key(), arg.value());
  e.id = s.id();
  e.parent = s.parent();
  return e;
}

}  // namespace

std::shared_ptr<CallTrace> begin_call_trace(std::shared_ptr<TraceCollector> collector, int64_t start_ns,
                                            std::string what) {
  return std::make_shared<CallTrace>(CallTrace{std::move(collector), start_ns, steady_now_ns(), current_thread_id(),
                                               current_thread_name(), std::move(what)});
}

void record_call_spans(Tracer& tracer, const CallTrace& t, int self, const std::string& peer,
                       const rpc::Profile* profile, int64_t end_ns, const char* error) {
  const uint64_t id = tracer.new_span_id(self);
  std::vector<TraceEvent> events;
  TraceEvent call{t.what, "rpc", self, t.tid, t.thread, t.start_ns, end_ns - t.start_ns, {{"to", peer}}};
  if (error) call.args.emplace_back("error", error);
  call.id = id;
  call.parent = t.collector->parent();
  events.push_back(std::move(call));
  auto part = [&](TraceEvent e) {
    e.id = tracer.new_span_id(self);
    e.parent = id;
    events.push_back(std::move(e));
  };
  part(TraceEvent{"send", "send", self, t.tid, t.thread, t.start_ns, t.sent_ns - t.start_ns,
                  {{"function", t.what}, {"to", peer}}});
  if (profile) {
    const ClockAlignment a = align_clocks(t.sent_ns, profile->arrival_ns(), profile->reply_ns(), end_ns);
    part(TraceEvent{"network", "network", self, t.tid, t.thread, t.sent_ns, a.request_ns,
                    {{"function", t.what}, {"direction", "request"}, {"to", peer}}});
    part(TraceEvent{"network", "network", self, t.tid, t.thread, profile->reply_ns() - a.offset, a.reply_ns,
                    {{"function", t.what}, {"direction", "reply"}, {"from", peer}}});
    for (const auto& span : profile->spans()) {
      TraceEvent e = from_proto(span, -a.offset);
      // The callee's execution of this call (its nested calls' executions already have
      // their own callers): its parent is the call, which the trace draws as a flow arrow.
      if (e.category == "execute" && e.parent == 0) e.parent = id;
      events.push_back(std::move(e));
    }
  }
  t.collector->add_all(std::move(events));
}

void add_served_spans(Tracer& tracer, ServeTrace& t, int self, const std::string& from, int64_t arrival_ns,
                      int64_t reply_ns, const char* error, rpc::Profile* out) {
  out->set_arrival_ns(arrival_ns);
  out->set_reply_ns(reply_ns);
  TraceEvent queue{"queue", "queue", self, t.tid, t.thread, arrival_ns, t.start_ns - arrival_ns,
                   {{"function", t.what}, {"from", from}}};
  queue.id = tracer.new_span_id(self);
  to_proto(queue, out->add_spans());
  TraceEvent execute{t.what, "execute", self, t.tid, t.thread, t.start_ns, reply_ns - t.start_ns, {{"from", from}}};
  execute.id = t.execute_id;
  if (error) execute.args.emplace_back("error", error);
  to_proto(execute, out->add_spans());
  for (const auto& e : t.collector->take()) to_proto(e, out->add_spans());
}

}  // namespace drpc
