// The agent's matching and dispatch: messages in from the process group go to the call
// they answer (rpc/pending_calls.h; rpc/call_endings.h completes it), to the join
// (rpc/join_follower.h) or, as requests, to the request server (rpc/request_server.h);
// calls and replies leave through the interceptors, metrics and the wire format
// (rpc/envelope.h). The agent owns the lifecycle: start, join, shutdown, peer failures.

#include "rpc/process_group_agent.h"

#include <glog/logging.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "common/callback_pool.h"
#include "common/executor.h"
#include "common/logging.h"
#include "rpc/metrics.h"
#include "rpc/call_endings.h"
#include "rpc/envelope.h"
#include "rpc/interceptor_chain.h"
#include "rpc/join_follower.h"
#include "rpc/pending_calls.h"
#include "rpc/request_server.h"
#include "rpc/profiler.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

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
        endings_(workers_, port.rank()),
        server_(
            workers_, port.rank(),
            [this](int index, const HandlerPool::Task& serve) {
              ScopedLogTag tag(&log_tag_);
              set_current_thread_name("handler " + std::to_string(index));
              serve();
            },
            [this](int source, rpc::Envelope envelope, Message reply) {
              send_reply(source, std::move(envelope), std::move(reply));
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

  void register_handler(int32_t type, Handler handler, InlinePolicy run_inline) override {
    server_.register_handler(type, std::move(handler), run_inline);
  }
  void add_interceptor(Interceptor interceptor) override { interceptors_.add(std::move(interceptor)); }
  void set_instruments(Metrics* metrics, Tracer* tracer) override {
    if (metrics_) metrics_->set_gauge_source(nullptr);
    metrics_ = metrics;
    tracer_ = tracer;
    endings_.set_instruments(metrics, tracer);
    server_.set_instruments(metrics, tracer);
    if (!metrics_) return;
    metrics_->set_gauge_source([this](MetricsSnapshot& s) {
      std::lock_guard<std::mutex> lock(mu_);
      s.in_flight_sent = static_cast<int64_t>(pending_.size());
      s.in_flight_received = processing_;
      s.handler_queue = static_cast<int64_t>(server_.pool().queued());
      for (auto& peer : s.peers) {
        auto gone = gone_reason_.find(peer.rank);  // the peers join_ counts dead
        if (gone == gone_reason_.end()) continue;
        peer.alive = false;
        peer.reason = gone->second;
        // The transport's reason for a peer that said goodbye (process_group/connection_protocol.cc, lose()).
        peer.left = peer.reason.find("rank " + std::to_string(peer.rank) + " shut down") != std::string::npos;
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
    interceptors_.on_send(dst, request);
    const std::string label = function_label(what.function);
    Metrics::Function* fn = metrics_ ? metrics_->function(label) : nullptr;
    auto future = make_message_future();
    const int64_t id = next_id_.fetch_add(1);
    // Serialized before the call is registered, so the send span ends before the message
    // can leave (and a reply come back).
    std::string header;
    int64_t wire_bytes = 0;
    if (dst.id != self_.id) {
      header = encode_request(id, label, collector != nullptr, request);
      wire_bytes = static_cast<int64_t>(header.size()) + tensor_bytes(request.tensors);
    }
    std::shared_ptr<CallTrace> trace = collector ? begin_call_trace(collector, start_ns, label) : nullptr;
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
      // A call to oneself skips the network but not the handler pool, nor the interceptors:
      // they see it arrive as they saw it leave.
      interceptors_.on_receive(self_, request);
      schedule_request(server_.receive(self_.id, id, label, collector != nullptr, std::move(request), nullptr,
                                       steady_now_ns()));
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

  // Refused once shutdown() stopped the pool (which also drops what is queued then).
  void run_on_pool(std::function<void()> task) override { server_.pool().post(std::move(task)); }

  using RpcAgent::join;
  void run_callback(std::function<void()> task) override { callbacks_.run(std::move(task)); }

  void start() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (starting_) return;
      starting_ = true;
    }
    server_.pool().start(options_.num_threads);
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
    server_.pool().stop();  // queued requests are dropped; running ones finish
    // Outside mu_: it waits for deadline callbacks in progress, which take mu_.
    std::vector<PendingCall> pending = pending_.close();
    idle_cv_.notify_all();
    for (auto& p : pending) endings_.shut_down(p);
    server_.pool().join();  // after failing the calls: a handler may be waiting on one
    callbacks_.close();  // runs what the failed calls queued
  }

 private:
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
    std::string problem;
    if (!decode_envelope(std::move(raw.header), &envelope, &problem)) {
      if (metrics_) {
        metrics_->bytes_received(source, bytes);
        metrics_->error(false, ErrorKind::kProtocol);
      }
      LOG(ERROR) << self_.name << ": dropping a malformed message from " << workers_[source].name << ": " << problem;
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
    Message message = take_message(envelope, std::move(raw.tensors));
    // An interceptor refuses what it cannot read (a peer's malformed extension): the
    // request is answered with its error, a reply fails its call with it.
    std::exception_ptr refused;
    try {
      interceptors_.on_receive(workers_[source], message);
    } catch (...) {
      refused = std::current_exception();
    }
    if (refused && envelope.is_response()) put_error(refused, &envelope);
    if (!envelope.is_response()) {
      schedule_request(server_.receive(source, envelope.id(), envelope.what(), envelope.profile(), std::move(message),
                                       refused, arrival_ns));
      return;
    }
    std::optional<PendingCall> pending = pending_.take(envelope.id());
    if (!pending) {  // timed out already: the late reply is dropped
      VLOG(2) << "dropping the late reply " << envelope.id() << " from " << workers_[source].name;
      return;
    }
    notify_idle();
    endings_.replied(*pending, envelope, std::move(message), arrival_ns);
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
    for (auto& p : failed) endings_.peer_gone(p, reason.message());
  }

  // --- the job-wide join ----------------------------------------------------------------
  // Join messages go straight to the process group: they are not requests, so they count
  // in nobody's totals (nor in the byte metrics).
  void send_all(std::vector<JoinMessage> outbox) {
    for (auto& out : outbox) {
      try {
        port_.send_message(out.dst, PgMessage{encode_control(out.type, std::move(out.payload)), {}});
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
  void schedule_request(RequestServer::Request request) {
    const int source = request.source;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      ++processing_;
    }
    if (!server_.serve(std::move(request))) request_done(source);  // the pool stopped: dropped
  }

  // Sends the reply to a request (or, to oneself, delivers it), through the interceptors.
  void send_reply(int source, rpc::Envelope envelope, Message reply) {
    interceptors_.on_send(workers_[source], reply);
    if (source == self_.id) {
      // A reply to oneself skips the network, not the interceptors.
      interceptors_.on_receive(self_, reply);
      std::optional<PendingCall> pending = pending_.take(envelope.id());
      if (pending) endings_.replied(*pending, envelope, std::move(reply), steady_now_ns());
    } else {
      try {
        std::string header = encode_with(envelope, reply);
        if (metrics_) {
          metrics_->bytes_sent(source, static_cast<int64_t>(header.size()) + tensor_bytes(reply.tensors));
        }
        port_.send_message(source, PgMessage{std::move(header), std::move(reply.tensors)});
      } catch (const Error& e) {
        LOG(WARNING) << self_.name << ": cannot answer " << workers_[source].name << ": " << e.what();
        // A reply the network refuses (too large a header) is answered with why, so that
        // the caller does not wait for its deadline.
        if (e.kind() == ErrorKind::kBadArgument) send_refusal(source, envelope.id(), e);
      }
    }
    request_done(source);
  }

  void send_refusal(int source, int64_t id, const Error& why) {
    rpc::Envelope refusal;
    refusal.set_id(id);
    refusal.set_is_response(true);
    put_error(std::make_exception_ptr(Error(why.kind(), "the reply cannot be sent: " + why.message())), &refusal);
    try {
      port_.send_message(source, PgMessage{encode_envelope(refusal), {}});
    } catch (const Error& e) {
      LOG(WARNING) << self_.name << ": cannot answer " << workers_[source].name << ": " << e.what();
    }
  }

  void request_done(int source) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --processing_;
      if (source != self_.id) join_.request_answered(source);
    }
    idle_cv_.notify_all();
  }

  // --- deadlines (kept by pending_ on the executor's timers) ----------------------------
  // Call `id`'s deadline passed: it already left pending_. On an executor thread.
  void on_deadline(int64_t id, PendingCall p) {
    ScopedLogTag tag(&log_tag_);
    VLOG(2) << "deadline of call " << id << " passed";
    notify_idle();
    endings_.timed_out(p);
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
    notify_idle();
    endings_.not_sent(*taken, error);
  }

  MessagePort& port_;  // the process group's message port
  const std::vector<WorkerInfo> workers_;
  const AgentOptions options_;
  WorkerInfo self_;
  std::string log_tag_;                       // "[name/rank]"
  Metrics* metrics_ = nullptr;                // set before start(); may be null
  Tracer* tracer_ = nullptr;                  // set before start(); may be null
  InterceptorChain interceptors_;            // set before start()
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
  CallEndings endings_;  // ends the calls pending_ hands back
  // Serves requests on the handler threads, with the members above; its pool is stopped and
  // joined by shutdown().
  RequestServer server_;

  // Last: its threads run callbacks that use the members above; destroyed (closed) first.
  CallbackPool callbacks_;
};

}  // namespace

std::unique_ptr<RpcAgent> create_process_group_agent(MessagePort& port, Executor& executor,
                                                     std::vector<WorkerInfo> workers, const AgentOptions& options) {
  return std::make_unique<ProcessGroupAgent>(port, executor, std::move(workers), options);
}

}  // namespace drpc
