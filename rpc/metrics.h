#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace drpc {

// Durations in fixed logarithmic buckets: 8 per power of two (12.5% wide) from 1 ns up,
// so recording is three relaxed atomic adds and a quantile is read from the counts with
// an error under 6.25%. Thread-safe.
class LatencyHistogram {
 public:
  void record(std::chrono::nanoseconds duration);

  int64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum_seconds() const { return sum_ns_.load(std::memory_order_relaxed) * 1e-9; }
  // The q-quantile (0 < q <= 1) in seconds: the middle of the bucket holding it; 0 if empty.
  double quantile(double q) const;
  // For each bound (seconds, ascending), how many durations were at most that long, and
  // (last) how many in all: a Prometheus histogram's cumulative buckets. A fine bucket
  // counts below a bound when its middle does, so a bound is placed within 6.25%.
  std::vector<int64_t> cumulative(const std::vector<double>& bounds_seconds) const;

  static constexpr int kSubBits = 3;
  static constexpr int kBuckets = (64 - kSubBits + 1) << kSubBits;
  static int bucket(uint64_t ns);
  static uint64_t bucket_lower(int index);  // in ns; the bucket is [lower, lower of the next)

 private:
  std::array<std::atomic<int64_t>, kBuckets> buckets_{};
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_ns_{0};
};

// The bounds (seconds) of the histograms drpc exports: the same on every worker, so that
// Prometheus can add workers' buckets up.
const std::vector<double>& latency_bucket_bounds();

struct LatencySummary {
  int64_t count = 0;
  double sum_seconds = 0;
  double p50 = 0, p90 = 0, p99 = 0;  // seconds
  // Cumulative counts for latency_bucket_bounds(), then (last) the count of all.
  std::vector<int64_t> buckets;
};

// One worker's metrics at one moment (see Metrics::snapshot and drpc::get_metrics).
struct MetricsSnapshot {
  std::string worker;
  int rank = -1;
  // Calls by (function, peer): requests this worker sent, and requests it received.
  std::map<std::pair<std::string, std::string>, int64_t> calls_sent, calls_received;
  // By error kind name ("Timeout", ...): calls this worker made that failed, and requests
  // it served that failed (or arrived malformed: "Protocol").
  std::map<std::string, int64_t> errors_sent, errors_received;
  // Bytes on the wire (headers and tensor data, requests and replies) by peer.
  std::map<std::string, int64_t> bytes_sent, bytes_received;
  int64_t in_flight_sent = 0;      // calls sent and not yet answered
  int64_t in_flight_received = 0;  // requests being served
  int64_t handler_queue = 0;       // tasks waiting for a handler thread
  // By function: the round trip a caller saw (replies only, errors included), and the
  // time from a request's arrival to its reply on the callee (queue plus execution).
  std::map<std::string, LatencySummary> latency, handler_latency;
  // Filled by the runtime: RRefs and distributed autograd.
  int64_t rref_owners = 0;         // RRefs this worker owns that some worker references
  int64_t rref_users = 0;          // user references held on this worker
  int64_t rref_pending_forks = 0;  // forks not confirmed by their owner yet
  int64_t autograd_contexts = 0;   // live distributed autograd contexts

  // Every other worker of the job, by rank: whether it is up, and when this worker last
  // received a message from it at the RPC layer (requests, replies, join and control
  // messages; the transport's heartbeats are not counted).
  struct Peer {
    std::string name;
    int rank = -1;
    bool alive = true;
    bool left = false;    // it shut down (said goodbye), rather than failed
    std::string reason;   // why it is gone, if it is
    double last_heard_seconds = -1;  // seconds since its last message; -1: none yet
  };
  std::vector<Peer> peers;  // filled by the agent (gauge source); the ranks' order
  // Calls this worker sent that await a reply, oldest first, at most kMaxCallsListed.
  struct Call {
    std::string function;
    std::string peer;
    double age_seconds = 0;
  };
  std::vector<Call> calls_in_flight;
  static constexpr size_t kMaxCallsListed = 100;

  int64_t total_calls_sent() const;
  int64_t total_calls_received() const;
};

// The counters of one worker's RPC agent. The agent records; anyone may snapshot.
// Recording takes a mutex only the first time a function is seen. Thread-safe.
class Metrics {
 public:
  // A function's counters, stable for the registry's life.
  struct Function;

  // `peers` names every worker of the job by rank (this one included).
  Metrics(std::string worker, int rank, std::vector<std::string> peers);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The entry for `label` (see function_label). A peer could name endless functions, so
  // past kMaxFunctions they all share the entry "other".
  Function* function(const std::string& label);
  static constexpr size_t kMaxFunctions = 1000;

  void call_sent(Function* f, int peer);
  void call_received(Function* f, int peer);
  void reply_received(Function* f, std::chrono::nanoseconds round_trip);
  void request_served(Function* f, std::chrono::nanoseconds arrival_to_reply);
  // When this worker last heard from `peer` (steady clock, ns; 0: never), as recorded by
  // bytes_received.
  int64_t last_heard_ns(int peer) const;
  // sent: a call this worker made failed; else a request it served failed.
  void error(bool sent, ErrorKind kind);
  void bytes_sent(int peer, int64_t n);
  void bytes_received(int peer, int64_t n);

  // Fills in, at snapshot time, the gauges the agent keeps anyway (in-flight calls, queue
  // length), so the hot path pays nothing for them. It must not call into this registry.
  // Set to null before whatever it refers to goes away; that waits for a running call.
  using GaugeSource = std::function<void(MetricsSnapshot& snapshot)>;
  void set_gauge_source(GaugeSource source);

  MetricsSnapshot snapshot() const;

 private:
  static constexpr int kKinds = static_cast<int>(ErrorKind::kInternal) + 1;

  const std::string worker_;
  const int rank_;
  const std::vector<std::string> peers_;
  std::unique_ptr<std::atomic<int64_t>[]> bytes_sent_, bytes_received_;  // by rank
  std::unique_ptr<std::atomic<int64_t>[]> last_heard_ns_;                // by rank
  std::array<std::atomic<int64_t>, kKinds> errors_sent_{}, errors_received_{};
  mutable std::mutex gauge_mu_;
  GaugeSource gauges_;  // guarded by gauge_mu_

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Function>> functions_;  // guarded by mu_; never erased
};

// A bounded metrics label for a call's function (CallName::function, or a peer's label
// for it): its length capped, "unknown" for none.
std::string function_label(const std::string& what);

// The Prometheus text exposition format (version 0.0.4) of `snapshot`, with
// drpc_peer_up{peer} (1 while a peer is up) and drpc_build_info{version,torch,grpc,protobuf}.
std::string to_prometheus_text(const MetricsSnapshot& snapshot);

// drpc's version, as drpc_build_info reports it.
extern const char* const kDrpcVersion;

std::string to_prometheus_text(const MetricsSnapshot& snapshot);

// One line for the log at shutdown: calls, errors, bytes, the slowest functions.
std::string summary_line(const MetricsSnapshot& snapshot);

}  // namespace drpc
