// The agent's dispatch: messages in from the process group go to the pending call they
// answer (rpc/pending_calls.h), to the join (rpc/join_follower.h) or, as requests, to their
// handler on the handler threads (rpc/handler_pool.h); calls and replies go out the same
// way, through the interceptors, metrics and traces (rpc/call_tracing.h).

#include "rpc/process_group_agent.h"

#include <ATen/ops/tensor.h>
#include <glog/logging.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <mutex>

#include "common/callback_pool.h"
#include "common/executor.h"
#include "common/error_wire.h"
#include "common/logging.h"
#include "rpc/metrics.h"
#include "rpc/call_tracing.h"
#include "rpc/handler_pool.h"
#include "rpc/join_follower.h"
#include "rpc/pending_calls.h"
#include "rpc/profiler.h"
#include "rpc/proto/rpc.pb.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Upper layers' headers travel opaquely in the envelope.
void put_extensions(const Message& m, rpc::Envelope* e) {
  for (const auto& [id, bytes] : m.extensions) (*e->mutable_extensions())[id] = bytes;
}

void take_extensions(rpc::Envelope& e, Message* m) {
  for (auto& [id, bytes] : *e.mutable_extensions()) m->extensions.emplace(id, std::move(bytes));
}

// An exception as an error reply: drpc's Errors keep their kind, anything else is kRemote.
void put_error(const std::exception_ptr& error, rpc::Envelope* e) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& err) {
    e->set_error_kind(to_wire(err.kind()));
    e->set_error(err.message());
  } catch (const std::exception& err) {
    e->set_error_kind(to_wire(ErrorKind::kRemote));
    e->set_error(err.what());
  }
}

int64_t tensor_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return n;
}

ErrorKind kind_of(const rpc::Envelope& e) {
  return from_wire(e.error_kind());
}

class ProcessGroupAgent final : public RpcAgent {
 public:
  ProcessGroupAgent(MessagePort& port, Executor& executor, std::vector<WorkerInfo> workers,
                    const AgentOptions& options)
      : port_(port),
        workers_(std::move(workers)),
        options_(options),
        default_timeout_ms_(options.default_timeout.count()),
        join_(port.rank(), static_cast<int>(workers_.size())),
        pending_(executor, [this](int64_t id, PendingCall p) { on_deadline(id, std::move(p)); }),
        pool_([this](int index, const HandlerPool::Task& serve) {
          ScopedLogTag tag(&log_tag_);
          set_current_thread_name("handler " + std::to_string(index));
          serve();
        }),
        callbacks_([this](const std::function<void()>& serve) {
          ScopedLogTag tag(&log_tag_);
          set_current_thread_name("callback");
          serve();
        }) {
    if (static_cast<int>(workers_.size()) != port_.size()) {
      throw Error(ErrorKind::kBadArgument, "the agent needs one worker per rank");
    }
    self_ = workers_.at(port_.rank());
    log_tag_ = make_log_tag(self_.name, self_.id);
    port_.set_message_listener(MessageListener{
        [this](int source, PgMessage message) { on_message(source, std::move(message)); },
        [this](int rank, const Error& reason) { on_peer_failed(rank, reason); }});
  }

  ~ProcessGroupAgent() override {
    if (metrics_) metrics_->set_gauge_source(nullptr);
    shutdown(false);
    port_.set_message_listener(MessageListener{});
  }

  const WorkerInfo& self() const override { return self_; }

  WorkerInfo worker(const std::string& name) const override {
    for (const auto& w : workers_) {
      if (w.name == name) return w;
    }
    throw Error(ErrorKind::kBadArgument, "unknown worker '" + name + "'");
  }

  WorkerInfo worker(int id) const override {
    if (id < 0 || id >= static_cast<int>(workers_.size())) {
      throw Error(ErrorKind::kBadArgument, "unknown worker id " + std::to_string(id));
    }
    return workers_[id];
  }

  std::vector<WorkerInfo> workers() const override { return workers_; }
  milliseconds default_timeout() const override { return milliseconds(default_timeout_ms_.load()); }
  void set_default_timeout(milliseconds timeout) override {
    if (timeout.count() < 0) throw Error(ErrorKind::kBadArgument, "an RPC timeout cannot be negative");
    default_timeout_ms_ = timeout.count();
  }

  void register_handler(int32_t type, Handler handler, bool run_inline) override {
    handlers_[type] = std::move(handler);
    if (run_inline) inline_types_.insert(type);
  }
  void add_interceptor(Interceptor interceptor) override { interceptors_.push_back(std::move(interceptor)); }
  void set_instruments(Metrics* metrics, Tracer* tracer) override {
    if (metrics_) metrics_->set_gauge_source(nullptr);
    metrics_ = metrics;
    tracer_ = tracer;
    if (!metrics_) return;
    metrics_->set_gauge_source([this](MetricsSnapshot& s) {
      std::lock_guard<std::mutex> lock(mu_);
      s.in_flight_sent = static_cast<int64_t>(pending_.size());
      s.in_flight_received = processing_;
      s.handler_queue = static_cast<int64_t>(pool_.queued());
      for (auto& peer : s.peers) {
        const std::vector<bool>& dead = join_.dead();
        if (peer.rank < 0 || peer.rank >= static_cast<int>(dead.size()) || !dead[peer.rank]) continue;
        peer.alive = false;
        auto it = gone_reason_.find(peer.rank);
        if (it != gone_reason_.end()) peer.reason = it->second;
        // The transport's reason for a peer that said goodbye (grpc_transport.cc, lost()).
        const std::string goodbye = "rank " + std::to_string(peer.rank) + " shut down";
        peer.left = peer.reason.find(goodbye) != std::string::npos;
      }
      const auto now = steady_now_ns();
      pending_.visit_oldest(MetricsSnapshot::kMaxCallsListed, [&](const PendingCall& p) {
        s.calls_in_flight.push_back({function_label(p.what.function), workers_[p.dst].name, (now - p.start_ns) * 1e-9});
      });
    });
  }
  void add_peer_failure_listener(PeerFailureListener listener) override {
    std::lock_guard<std::mutex> lock(mu_);  // a peer can fail before start(), on a network thread
    peer_failure_listeners_.push_back(std::move(listener));
  }

  FuturePtr send(const WorkerInfo& to, Message request, milliseconds timeout, CallName what) override {
    const int64_t start_ns = steady_now_ns();
    const WorkerInfo dst = worker(to.id);
    std::shared_ptr<TraceCollector> collector;
    if (tracer_ && tracer_->active()) collector = tracer_->collector_for_send();
    for (auto& i : interceptors_) {
      if (i.on_send) i.on_send(dst, request);
    }
    const std::string label = function_label(what.function);
    Metrics::Function* fn = metrics_ ? metrics_->function(label) : nullptr;
    auto future = make_message_future();
    const int64_t id = next_id_.fetch_add(1);
    // Serialized before the call is registered, so the send span ends before the message
    // can leave (and a reply come back).
    std::string header;
    int64_t wire_bytes = 0;
    if (dst.id != self_.id) {
      rpc::Envelope envelope;
      envelope.set_type(request.type);
      envelope.set_id(id);
      envelope.set_what(label);
      if (collector) envelope.set_profile(true);
      put_extensions(request, &envelope);
      envelope.set_payload(std::move(request.payload));
      header = envelope.SerializeAsString();
      wire_bytes = static_cast<int64_t>(header.size()) + tensor_bytes(request.tensors);
    }
    std::shared_ptr<CallTrace> trace;
    if (collector) {
      trace = std::make_shared<CallTrace>(
          CallTrace{collector, start_ns, steady_now_ns(), current_thread_id(), current_thread_name(), label});
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) throw Error(ErrorKind::kShutdown, "the RPC agent of " + self_.name + " is shut down");
      // Under mu_, so a join sees the call pending or not counted as sent, never between.
      switch (pending_.add(id, PendingCall{future, dst.id, std::move(what), timeout, fn, start_ns, trace})) {
        case PendingCalls::AddResult::kAdded:
          break;
        case PendingCalls::AddResult::kClosed:
          throw Error(ErrorKind::kShutdown, "the RPC agent of " + self_.name + " is shut down");
        case PendingCalls::AddResult::kNoTimer:
          throw Error(ErrorKind::kShutdown,
                      "the RPC agent of " + self_.name + " cannot keep deadlines: its executor is closed");
      }
      if (dst.id != self_.id) join_.request_sent(dst.id);
    }
    if (metrics_) {
      metrics_->call_sent(fn, dst.id);
      metrics_->bytes_sent(dst.id, wire_bytes);
    }
    VLOG(1) << "call " << id << " to " << dst.name << ": " << label << " (type " << request.type << ", "
            << wire_bytes << " bytes" << (collector ? ", profiled" : "") << ")";
    if (dst.id == self_.id) {
      // A call to oneself skips the network but not the handler pool.
      Served served{fn, steady_now_ns(),
                    collector ? std::make_shared<ServeTrace>(label, tracer_->new_span_id(self_.id)) : nullptr};
      if (metrics_) metrics_->call_received(fn, self_.id);
      // Nor the interceptors: they see it arrive as they saw it leave.
      for (auto& i : interceptors_) {
        if (i.on_receive) i.on_receive(self_, request);
      }
      schedule_request(self_.id, id, std::move(request), std::move(served));
      return future;
    }
    try {
      WorkPtr work = port_.send_message(dst.id, PgMessage{std::move(header), std::move(request.tensors)});
      work->on_completion([this, id](Work& w) {
        if (auto error = w.exception()) fail_pending(id, error);
      });
    } catch (const Error& e) {
      fail_pending(id, std::current_exception());
    }
    return future;
  }

  void run_on_pool(std::function<void()> task) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
    }
    pool_.post(std::move(task));  // refused once shutdown() stopped the pool
  }

  using RpcAgent::join;
  void run_callback(std::function<void()> task) override { callbacks_.run(std::move(task)); }

  void start() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (starting_) return;
      starting_ = true;
    }
    pool_.start(options_.num_threads);
    // Messages keep arriving while the held ones are served: they queue behind them until
    // none is left, so each peer's messages are served in the order it sent them. Served on
    // this (the caller's) thread, they log as this worker's, like the network threads'.
    ScopedLogTag tag(&log_tag_);
    while (true) {
      std::deque<std::pair<int, PgMessage>> held;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (held_.empty()) {
          started_ = true;
          return;
        }
        held.swap(held_);
      }
      for (auto& [source, message] : held) process_message(source, std::move(message));
    }
  }

  // Each round: once idle, report this worker's counts to the leader and wait for its
  // verdict; a new round when some request was still on its way, a new report when the
  // leader changes (it died).
  void join(milliseconds timeout) override {
    const auto deadline = timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
    std::vector<JoinMessage> outbox;
    std::unique_lock<std::mutex> lock(mu_);
    JoinFollower::Call call = join_.begin();
    while (true) {
      if (stopped_)
        throw Error(ErrorKind::kShutdown, "the RPC agent of " + self_.name + " stopped while joining the job");
      const JoinFollower::Step step = join_.step(call, pending_.empty() && processing_ == 0, &outbox);
      if (step == JoinFollower::Step::kQuiet) return;
      if (step == JoinFollower::Step::kReported) {
        VLOG(1) << "join " << call.generation << " round " << call.round << ": reported to "
                << workers_[call.reported_to].name;
        lock.unlock();
        send_all(std::move(outbox));
        outbox.clear();
        lock.lock();
        continue;
      }
      if (idle_cv_.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
        throw Error(ErrorKind::kTimeout, self_.name + " waited " + std::to_string(timeout.count()) +
                                             " ms for the job's workers to join (leader " +
                                             workers_[join_.leader()].name + ")");
      }
    }
  }

  void shutdown(bool graceful) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) return;
      shutting_down_ = true;
    }
    if (graceful) {
      try {
        join();
      } catch (const Error& e) {
        LOG(WARNING) << self_.name << ": graceful shutdown could not wait for the job: " << e.what();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    pool_.stop();  // queued requests are dropped; running ones finish
    // Outside mu_: it waits for deadline callbacks in progress, which take mu_.
    std::vector<PendingCall> pending = pending_.close();
    idle_cv_.notify_all();
    auto error = std::make_exception_ptr(
        Error(ErrorKind::kShutdown, "the RPC agent of " + self_.name + " shut down before a reply came"));
    for (auto& p : pending) {
      call_failed(p, ErrorKind::kShutdown);
      p.future->setErrorIfNeeded(error);
    }
    pool_.join();  // after failing the calls: a handler may be waiting on one
    callbacks_.close();  // runs what the failed calls queued
  }

 private:
  // What the agent keeps about a request it serves.
  struct Served {
    Metrics::Function* fn = nullptr;
    int64_t arrival_ns = 0;
    std::shared_ptr<ServeTrace> trace;  // profiled requests only
    std::exception_ptr refused;         // an interceptor refused the request: the answer
  };

  // --- network threads -----------------------------------------------------------------
  void on_message(int source, PgMessage raw) {
    name_current_thread_if_unnamed("network");
    ScopedLogTag tag(&log_tag_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      if (!started_) {
        VLOG(2) << "holding a message from " << workers_[source].name << " until start";
        held_.emplace_back(source, std::move(raw));
        return;
      }
    }
    process_message(source, std::move(raw));
  }

  void process_message(int source, PgMessage raw) {
    const int64_t arrival_ns = steady_now_ns();
    const int64_t bytes = static_cast<int64_t>(raw.header.size()) + tensor_bytes(raw.tensors);
    rpc::Envelope envelope;
    if (!envelope.ParseFromString(raw.header)) {
      if (metrics_) {
        metrics_->bytes_received(source, bytes);
        metrics_->error(false, ErrorKind::kProtocol);
      }
      LOG(ERROR) << self_.name << ": dropping a malformed message from " << workers_[source].name;
      return;
    }
    // The join's own messages are the agent's bookkeeping, counted in neither side's bytes
    // (as the transport's heartbeats are not): they go out whenever a worker in shutdown
    // turns idle, so counting them would make the two sides' totals race.
    if (envelope.type() == kJoinReport || envelope.type() == kJoinVerdict) {
      on_join_message(source, envelope);
      return;
    }
    if (metrics_) metrics_->bytes_received(source, bytes);
    Message message{envelope.type(), std::move(*envelope.mutable_payload()), std::move(raw.tensors)};
    take_extensions(envelope, &message);
    // An interceptor refuses what it cannot read (a peer's malformed extension): the
    // request is answered with its error, a reply fails its call with it.
    std::exception_ptr refused;
    try {
      for (auto& i : interceptors_) {
        if (i.on_receive) i.on_receive(workers_[source], message);
      }
    } catch (...) {
      refused = std::current_exception();
    }
    if (refused && envelope.is_response()) put_error(refused, &envelope);
    if (!envelope.is_response()) {
      // The caller's label, bounded again: a peer's bytes are not to be trusted.
      const std::string label = function_label(envelope.what());
      Served served{metrics_ ? metrics_->function(label) : nullptr, arrival_ns,
                    envelope.profile() && tracer_
                        ? std::make_shared<ServeTrace>(label, tracer_->new_span_id(self_.id))
                        : nullptr,
                    refused};
      if (metrics_) metrics_->call_received(served.fn, source);
      VLOG(1) << "request " << envelope.id() << " from " << workers_[source].name << ": " << label
              << " (type " << envelope.type() << (served.trace ? ", profiled" : "") << ")";
      schedule_request(source, envelope.id(), std::move(message), std::move(served));
      return;
    }
    std::optional<PendingCall> pending = pending_.take(envelope.id());
    if (!pending) {  // timed out already: the late reply is dropped
      VLOG(2) << "dropping the late reply " << envelope.id() << " from " << workers_[source].name;
      return;
    }
    notify_idle();
    finish_call(*pending, envelope, std::move(message), arrival_ns);
  }

  // A reply (or an error reply) arrived at `receipt_ns` for `p`.
  void finish_call(PendingCall& p, const rpc::Envelope& envelope, Message message, int64_t receipt_ns) {
    const bool failed = envelope.error_kind() != 0;
    VLOG(1) << "reply " << envelope.id() << " from " << workers_[p.dst].name << " after "
            << (receipt_ns - p.start_ns) / 1000 << " us" << (failed ? " (error)" : "");
    if (metrics_ && p.fn) {
      metrics_->reply_received(p.fn, std::chrono::nanoseconds(receipt_ns - p.start_ns));
      if (failed) metrics_->error(true, kind_of(envelope));
    }
    if (p.trace) {
      record_call(p, envelope.has_profile_spans() ? &envelope.profile_spans() : nullptr, receipt_ns,
                  failed ? error_kind_name(kind_of(envelope)) : nullptr);
    }
    if (failed) {
      p.future->setErrorIfNeeded(std::make_exception_ptr(Error(
          kind_of(envelope), "rpc " + p.what.text() + " on " + workers_[p.dst].name + " failed: " + envelope.error())));
    } else {
      p.future->markCompleted(message_to_ivalue(std::move(message)));
    }
  }

  // A call that ends without a reply (deadline, peer gone, shutdown).
  void call_failed(PendingCall& p, ErrorKind kind) {
    if (metrics_ && p.fn) metrics_->error(true, kind);
    VLOG(1) << "call to " << workers_[p.dst].name << " (" << p.what.text() << ") failed: " << error_kind_name(kind);
    if (p.trace) record_call(p, nullptr, steady_now_ns(), error_kind_name(kind));
  }

  // The caller's spans of a profiled call, with the callee's (`profile`, if it answered).
  void record_call(const PendingCall& p, const rpc::Profile* profile, int64_t end_ns, const char* error) {
    record_call_spans(*tracer_, *p.trace, self_.id, workers_[p.dst].name, profile, end_ns, error);
  }

  void on_peer_failed(int rank, const Error& reason) {
    std::vector<PendingCall> failed;
    std::vector<PeerFailureListener> listeners;
    std::vector<JoinMessage> outbox;
    {
      std::lock_guard<std::mutex> lock(mu_);
      listeners = peer_failure_listeners_;
      // A join no longer waits for it: the reports in hand may now be complete, and if it
      // led, the next live rank leads (workers waiting report again).
      join_.peer_dead(rank, &outbox);
      gone_reason_[rank] = reason.message();
      failed = pending_.take_peer(rank);
    }
    idle_cv_.notify_all();
    send_all(std::move(outbox));
    // Listeners first: whoever sees a call fail then also sees the layers' cleanup done.
    for (const auto& listener : listeners) listener(workers_[rank], reason);
    for (auto& p : failed) {
      call_failed(p, ErrorKind::kPeerUnavailable);
      p.future->setErrorIfNeeded(std::make_exception_ptr(
          Error(ErrorKind::kPeerUnavailable, "rpc " + p.what.text() + " to " + workers_[rank].name + " failed: " +
                                                 workers_[rank].name + " is unavailable (" + reason.message() + ")")));
    }
  }

  // --- the job-wide join ----------------------------------------------------------------
  // Join messages go straight to the process group: they are not requests, so they count
  // in nobody's totals (nor in the byte metrics).
  void send_all(std::vector<JoinMessage> outbox) {
    for (auto& out : outbox) {
      rpc::Envelope envelope;
      envelope.set_type(out.type);
      envelope.set_payload(std::move(out.payload));
      try {
        port_.send_message(out.dst, PgMessage{envelope.SerializeAsString(), {}});
      } catch (const Error& e) {
        VLOG(1) << "join message to " << workers_[out.dst].name << " not sent: " << e.what();  // it is gone
      }
    }
  }

  void on_join_message(int source, const rpc::Envelope& envelope) {
    std::vector<JoinMessage> outbox;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!join_.on_message(source, envelope.type(), envelope.payload(), &outbox)) {
        LOG(ERROR) << self_.name << ": dropping a malformed join "
                   << (envelope.type() == kJoinReport ? "report" : "verdict") << " from " << workers_[source].name;
        return;
      }
    }
    idle_cv_.notify_all();
    send_all(std::move(outbox));
  }

  // --- handler threads -----------------------------------------------------------------
  void schedule_request(int source, int64_t id, Message request, Served served) {
    const bool run_inline = inline_types_.count(request.type) > 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      ++processing_;
    }
    if (run_inline) {
      serve(source, id, std::move(request), std::move(served));
      return;
    }
    pool_.post([this, source, id, request = std::move(request), served = std::move(served)]() mutable {
      serve(source, id, std::move(request), std::move(served));
    });
  }

  void serve(int source, int64_t id, Message request, Served served) {
    // The reply starts with the request's extensions (rpc/message.h).
    Extensions request_extensions = request.extensions;
    if (served.trace) {
      served.trace->start_ns = steady_now_ns();
      served.trace->tid = current_thread_id();
      served.trace->thread = current_thread_name();
    }
    FuturePtr reply;
    auto handler = handlers_.find(request.type);
    if (served.refused) {
      reply = make_message_future();
      reply->setError(served.refused);
    } else if (handler == handlers_.end()) {
      reply = make_message_future();
      reply->setError(std::make_exception_ptr(Error(
          ErrorKind::kBadArgument, self_.name + " has no handler for message type " + std::to_string(request.type))));
    } else {
      // Calls the handler makes on this thread belong to a profiled request's trace.
      Tracer::Scope scope(tracer_, served.trace ? served.trace->collector : nullptr);
      try {
        reply = handler->second(workers_[source], std::move(request));
      } catch (...) {
        reply = make_message_future();
        reply->setError(std::current_exception());
      }
    }
    // The reply goes out when the future completes, whichever thread completes it.
    reply->addCallback([this, source, id, request_extensions = std::move(request_extensions),
                        served = std::move(served)](c10::ivalue::Future& done) {
      answer(source, id, done, request_extensions, served);
    });
  }

  // The reply carries the request's extensions that it does not set itself (so it belongs
  // to the request's autograd context, say), whichever thread sends it.
  void answer(int source, int64_t id, c10::ivalue::Future& done, const Extensions& request_extensions,
              const Served& served) {
    const int64_t reply_ns = steady_now_ns();
    rpc::Envelope envelope;
    envelope.set_id(id);
    envelope.set_is_response(true);
    Message reply;
    if (done.hasError()) {
      put_error(done.exception_ptr(), &envelope);
    } else {
      try {
        reply = message_from_ivalue(done.value());
        envelope.set_type(reply.type);
        reply.extensions.insert(request_extensions.begin(), request_extensions.end());  // keeps its own
      } catch (const Error& e) {  // the handler's bug, told to its caller
        envelope.set_error_kind(to_wire(e.kind()));
        envelope.set_error(e.message());
      }
    }
    if (metrics_ && served.fn) {
      metrics_->request_served(served.fn, std::chrono::nanoseconds(reply_ns - served.arrival_ns));
      if (envelope.error_kind() != 0) metrics_->error(false, kind_of(envelope));
    }
    VLOG(1) << "answering " << id << " from " << workers_[source].name << " after "
            << (reply_ns - served.arrival_ns) / 1000 << " us" << (envelope.error_kind() != 0 ? " (error)" : "");
    if (served.trace) {
      add_served_spans(*tracer_, *served.trace, self_.id, workers_[source].name, served.arrival_ns, reply_ns,
                       envelope.error_kind() != 0 ? error_kind_name(kind_of(envelope)) : nullptr,
                       envelope.mutable_profile_spans());
    }
    for (auto& i : interceptors_) {
      if (i.on_send) i.on_send(workers_[source], reply);
    }
    if (source == self_.id) {
      // A reply to oneself skips the network, not the interceptors.
      for (auto& i : interceptors_) {
        if (i.on_receive) i.on_receive(self_, reply);
      }
      deliver_local_reply(id, envelope, std::move(reply));
    } else {
      put_extensions(reply, &envelope);
      envelope.set_payload(std::move(reply.payload));
      try {
        std::string header = envelope.SerializeAsString();
        if (metrics_) {
          metrics_->bytes_sent(source, static_cast<int64_t>(header.size()) + tensor_bytes(reply.tensors));
        }
        port_.send_message(source, PgMessage{std::move(header), std::move(reply.tensors)});
      } catch (const Error& e) {
        LOG(WARNING) << self_.name << ": cannot answer " << workers_[source].name << ": " << e.what();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --processing_;
      if (source != self_.id) join_.request_answered(source);
    }
    idle_cv_.notify_all();
  }

  void deliver_local_reply(int64_t id, const rpc::Envelope& envelope, Message reply) {
    const int64_t receipt_ns = steady_now_ns();
    std::optional<PendingCall> pending = pending_.take(id);
    if (!pending) return;
    finish_call(*pending, envelope, std::move(reply), receipt_ns);
  }

  // --- deadlines (kept by pending_ on the executor's timers) ----------------------------
  // Call `id`'s deadline passed: it already left pending_. On an executor thread.
  void on_deadline(int64_t id, PendingCall p) {
    ScopedLogTag tag(&log_tag_);
    VLOG(2) << "deadline of call " << id << " passed";
    notify_idle();
    call_failed(p, ErrorKind::kTimeout);
    p.future->setErrorIfNeeded(std::make_exception_ptr(
        Error(ErrorKind::kTimeout, "rpc " + p.what.text() + " to " + workers_[p.dst].name + " timed out after " +
                                       std::to_string(p.timeout.count()) + " ms")));
  }

  // Wakes a join waiting for the job to go quiet. Takes mu_ first: pending_ changes
  // outside it, and a join that just found calls pending must be waiting when woken.
  void notify_idle() {
    { std::lock_guard<std::mutex> lock(mu_); }
    idle_cv_.notify_all();
  }

  void fail_pending(int64_t id, std::exception_ptr error) {
    std::optional<PendingCall> taken = pending_.take(id);
    if (!taken) return;
    PendingCall& p = *taken;
    notify_idle();
    std::string why;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      why = e.what();
    }
    call_failed(p, ErrorKind::kPeerUnavailable);
    p.future->setErrorIfNeeded(std::make_exception_ptr(
        Error(ErrorKind::kPeerUnavailable,
              "rpc " + p.what.text() + " to " + workers_[p.dst].name + " could not be sent: " + why)));
  }

  MessagePort& port_;  // the process group's message port
  const std::vector<WorkerInfo> workers_;
  const AgentOptions options_;
  WorkerInfo self_;
  std::string log_tag_;                       // "[name/rank]"
  Metrics* metrics_ = nullptr;                // set before start(); may be null
  Tracer* tracer_ = nullptr;                  // set before start(); may be null
  std::map<int32_t, Handler> handlers_;       // set before start()
  std::set<int32_t> inline_types_;            // set before start()
  std::vector<Interceptor> interceptors_;     // set before start()
  std::vector<PeerFailureListener> peer_failure_listeners_;  // guarded by mu_
  std::atomic<int64_t> next_id_{1};

  std::atomic<int64_t> default_timeout_ms_;

  std::mutex mu_;
  std::condition_variable idle_cv_;
  // Guarded by mu_.
  bool starting_ = false;
  bool started_ = false;  // every held message has been served
  bool shutting_down_ = false;
  bool stopped_ = false;
  std::deque<std::pair<int, PgMessage>> held_;
  int64_t processing_ = 0;
  std::map<int, std::string> gone_reason_;  // guarded by mu_: why each dead peer is gone
  JoinFollower join_;                       // guarded by mu_: counts, the dead, the joins

  // The calls awaiting replies, with their deadlines (its own lock; taken inside mu_,
  // never around it). Its deadline callbacks use the members above; closed by shutdown().
  PendingCalls pending_;
  // The handler threads, which serve requests with the members above; stopped and joined
  // by shutdown().
  HandlerPool pool_;

  // Last: its threads run callbacks that use the members above; destroyed (closed) first.
  CallbackPool callbacks_;
};

}  // namespace

std::unique_ptr<RpcAgent> create_process_group_agent(MessagePort& port, Executor& executor,
                                                     std::vector<WorkerInfo> workers, const AgentOptions& options) {
  return std::make_unique<ProcessGroupAgent>(port, executor, std::move(workers), options);
}

}  // namespace drpc
