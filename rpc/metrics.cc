#include "rpc/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <grpcpp/version_info.h>
#include <google/protobuf/stubs/common.h>
#include <torch/csrc/api/include/torch/version.h>

#include "common/utf8.h"

namespace drpc {

const char* const kDrpcVersion = "0.1.0";

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

std::unique_ptr<std::atomic<int64_t>[]> zeros(size_t n) {
  // Value-initialization zeroes the atomics.
  return std::unique_ptr<std::atomic<int64_t>[]>(new std::atomic<int64_t>[n]());
}

std::string escape_label(const std::string& raw) {
  const std::string value = valid_utf8(raw);  // the format is UTF-8; names from peers may not be
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

LatencySummary summarize(const LatencyHistogram& h) {
  LatencySummary s;
  s.buckets = h.cumulative(latency_bucket_bounds());
  s.count = s.buckets.back();  // = the +Inf bucket, even with records landing meanwhile
  s.sum_seconds = h.sum_seconds();
  s.p50 = h.quantile(0.5);
  s.p90 = h.quantile(0.9);
  s.p99 = h.quantile(0.99);
  return s;
}

std::string human_bytes(int64_t n) {
  char buf[32];
  if (n < 10 * 1024) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(n));
  } else if (n < 10 * 1024 * 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", n / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", n / (1024.0 * 1024.0));
  }
  return buf;
}

std::string millis(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g ms", seconds * 1e3);
  return buf;
}

int64_t sum_values(const std::map<std::string, int64_t>& m) {
  int64_t total = 0;
  for (const auto& [k, v] : m) total += v;
  return total;
}

}  // namespace

// --- LatencyHistogram ---------------------------------------------------------------------

int LatencyHistogram::bucket(uint64_t ns) {
  constexpr uint64_t kSub = uint64_t{1} << kSubBits;
  if (ns < kSub) return static_cast<int>(ns);
  const int msb = 63 - __builtin_clzll(ns);
  const uint64_t top = ns >> (msb - kSubBits);  // in [kSub, 2 kSub)
  return ((msb - kSubBits + 1) << kSubBits) + static_cast<int>(top - kSub);
}

uint64_t LatencyHistogram::bucket_lower(int index) {
  constexpr int kSub = 1 << kSubBits;
  if (index < kSub) return static_cast<uint64_t>(index);
  const int exponent = index >> kSubBits;
  const uint64_t mantissa = static_cast<uint64_t>(kSub + (index & (kSub - 1)));
  return mantissa << (exponent - 1);
}

void LatencyHistogram::record(std::chrono::nanoseconds duration) {
  const int64_t ns = std::max<int64_t>(0, duration.count());
  buckets_[bucket(static_cast<uint64_t>(ns))].fetch_add(1, kRelaxed);
  count_.fetch_add(1, kRelaxed);
  sum_ns_.fetch_add(ns, kRelaxed);
}

double LatencyHistogram::quantile(double q) const {
  // Read the buckets, not count_: a concurrent record may have bumped one and not the other.
  int64_t total = 0;
  std::array<int64_t, kBuckets> counts;
  for (int i = 0; i < kBuckets; ++i) total += counts[i] = buckets_[i].load(kRelaxed);
  if (total == 0) return 0;
  const int64_t rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(std::min(q, 1.0) * total)));
  int64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts[i];
    if (seen >= rank) {
      const double lower = static_cast<double>(bucket_lower(i));
      const double upper = i + 1 < kBuckets ? static_cast<double>(bucket_lower(i + 1)) : std::ldexp(1.0, 64);
      return (i < (1 << kSubBits) ? lower : (lower + upper) / 2) * 1e-9;
    }
  }
  return 0;  // unreachable: seen reaches total >= rank
}

std::vector<int64_t> LatencyHistogram::cumulative(const std::vector<double>& bounds_seconds) const {
  std::vector<int64_t> out(bounds_seconds.size() + 1, 0);
  size_t b = 0;
  int64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    const int64_t n = buckets_[i].load(kRelaxed);
    if (n == 0) continue;
    const double lower = static_cast<double>(bucket_lower(i));
    const double upper = i + 1 < kBuckets ? static_cast<double>(bucket_lower(i + 1)) : std::ldexp(1.0, 64);
    const double middle_seconds = (lower + upper) / 2 * 1e-9;
    // Bounds below this bucket's middle are complete.
    while (b < bounds_seconds.size() && bounds_seconds[b] < middle_seconds) out[b++] = seen;
    seen += n;
  }
  while (b < bounds_seconds.size()) out[b++] = seen;
  out.back() = seen;
  return out;
}

const std::vector<double>& latency_bucket_bounds() {
  static const auto* bounds = new std::vector<double>{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                      0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1,
                                                      2.5,     5,      10,      30,     60};
  return *bounds;
}

// --- MetricsSnapshot ----------------------------------------------------------------------

int64_t MetricsSnapshot::total_calls_sent() const {
  int64_t total = 0;
  for (const auto& [k, v] : calls_sent) total += v;
  return total;
}

int64_t MetricsSnapshot::total_calls_received() const {
  int64_t total = 0;
  for (const auto& [k, v] : calls_received) total += v;
  return total;
}

// --- Metrics ------------------------------------------------------------------------------

struct Metrics::Function {
  Function(std::string name, size_t peers) : name(std::move(name)), sent(zeros(peers)), received(zeros(peers)) {}
  const std::string name;
  std::unique_ptr<std::atomic<int64_t>[]> sent, received;  // by peer rank
  LatencyHistogram latency;                                // caller's round trip
  LatencyHistogram handler;                                // callee's arrival to reply
};

Metrics::Metrics(std::string worker, int rank, std::vector<std::string> peers)
    : worker_(std::move(worker)),
      rank_(rank),
      peers_(std::move(peers)),
      bytes_sent_(zeros(peers_.size())),
      bytes_received_(zeros(peers_.size())),
      last_heard_ns_(zeros(peers_.size())) {}

Metrics::~Metrics() = default;

Metrics::Function* Metrics::function(const std::string& label) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = functions_.find(label);
  if (it != functions_.end()) return it->second.get();
  const std::string& name = functions_.size() < kMaxFunctions ? label : std::string("other");
  auto& slot = functions_[name];
  if (!slot) slot = std::make_unique<Function>(name, peers_.size());
  return slot.get();
}

void Metrics::call_sent(Function* f, int peer) {
  if (peer >= 0 && peer < static_cast<int>(peers_.size())) f->sent[peer].fetch_add(1, kRelaxed);
}

void Metrics::call_received(Function* f, int peer) {
  if (peer >= 0 && peer < static_cast<int>(peers_.size())) f->received[peer].fetch_add(1, kRelaxed);
}

void Metrics::reply_received(Function* f, std::chrono::nanoseconds round_trip) { f->latency.record(round_trip); }

void Metrics::request_served(Function* f, std::chrono::nanoseconds arrival_to_reply) {
  f->handler.record(arrival_to_reply);
}

void Metrics::error(bool sent, ErrorKind kind) {
  const int k = std::min(static_cast<int>(kind), kKinds - 1);
  (sent ? errors_sent_ : errors_received_)[k].fetch_add(1, kRelaxed);
}

void Metrics::bytes_sent(int peer, int64_t n) {
  if (peer >= 0 && peer < static_cast<int>(peers_.size())) bytes_sent_[peer].fetch_add(n, kRelaxed);
}

void Metrics::bytes_received(int peer, int64_t n) {
  if (peer < 0 || peer >= static_cast<int>(peers_.size())) return;
  bytes_received_[peer].fetch_add(n, kRelaxed);
  last_heard_ns_[peer].store(std::chrono::steady_clock::now().time_since_epoch().count(), kRelaxed);
}

int64_t Metrics::last_heard_ns(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(peers_.size())) return 0;
  return last_heard_ns_[peer].load(kRelaxed);
}

void Metrics::set_gauge_source(GaugeSource source) {
  std::lock_guard<std::mutex> lock(gauge_mu_);
  gauges_ = std::move(source);
}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot s;
  s.worker = worker_;
  s.rank = rank_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, f] : functions_) {
      for (size_t p = 0; p < peers_.size(); ++p) {
        if (int64_t n = f->sent[p].load(kRelaxed)) s.calls_sent[{name, peers_[p]}] = n;
        if (int64_t n = f->received[p].load(kRelaxed)) s.calls_received[{name, peers_[p]}] = n;
      }
      if (f->latency.count() > 0) s.latency[name] = summarize(f->latency);
      if (f->handler.count() > 0) s.handler_latency[name] = summarize(f->handler);
    }
  }
  for (int k = 0; k < kKinds; ++k) {
    const char* kind = error_kind_name(static_cast<ErrorKind>(k));
    if (int64_t n = errors_sent_[k].load(kRelaxed)) s.errors_sent[kind] = n;
    if (int64_t n = errors_received_[k].load(kRelaxed)) s.errors_received[kind] = n;
  }
  for (size_t p = 0; p < peers_.size(); ++p) {
    if (static_cast<int>(p) == rank_) continue;  // calls to oneself never touch the wire
    s.bytes_sent[peers_[p]] = bytes_sent_[p].load(kRelaxed);
    s.bytes_received[peers_[p]] = bytes_received_[p].load(kRelaxed);
    MetricsSnapshot::Peer peer;
    peer.name = peers_[p];
    peer.rank = static_cast<int>(p);
    if (const int64_t heard = last_heard_ns_[p].load(kRelaxed)) {
      const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
      peer.last_heard_seconds = std::max<int64_t>(0, now - heard) * 1e-9;
    }
    s.peers.push_back(std::move(peer));
  }
  std::lock_guard<std::mutex> lock(gauge_mu_);
  if (gauges_) gauges_(s);
  return s;
}

// --- labels and formats -------------------------------------------------------------------

std::string function_label(const std::string& what) {
  // A peer names its calls' functions: bounded, so it cannot make labels endless.
  constexpr size_t kMaxLength = 128;
  if (what.empty()) return "unknown";
  return what.size() <= kMaxLength ? what : what.substr(0, kMaxLength);
}

std::string to_prometheus_text(const MetricsSnapshot& s) {
  std::ostringstream out;
  const std::string worker = "worker=\"" + escape_label(s.worker) + "\"";
  auto header = [&](const char* name, const char* type, const char* help) {
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  };
  auto calls = [&](const char* name, const char* help, const std::map<std::pair<std::string, std::string>, int64_t>& m) {
    header(name, "counter", help);
    for (const auto& [key, n] : m) {
      out << name << '{' << worker << ",function=\"" << escape_label(key.first) << "\",peer=\""
          << escape_label(key.second) << "\"} " << n << '\n';
    }
  };
  calls("drpc_rpc_calls_sent_total", "Requests this worker sent, by function and peer.", s.calls_sent);
  calls("drpc_rpc_calls_received_total", "Requests this worker received, by function and peer.", s.calls_received);

  header("drpc_rpc_errors_total", "counter",
         "Failed calls by error kind: direction=sent for calls this worker made, received for requests it served.");
  for (const auto& [kind, n] : s.errors_sent) {
    out << "drpc_rpc_errors_total{" << worker << ",direction=\"sent\",kind=\"" << kind << "\"} " << n << '\n';
  }
  for (const auto& [kind, n] : s.errors_received) {
    out << "drpc_rpc_errors_total{" << worker << ",direction=\"received\",kind=\"" << kind << "\"} " << n << '\n';
  }

  auto bytes = [&](const char* name, const char* help, const std::map<std::string, int64_t>& m) {
    header(name, "counter", help);
    for (const auto& [peer, n] : m) {
      out << name << '{' << worker << ",peer=\"" << escape_label(peer) << "\"} " << n << '\n';
    }
  };
  bytes("drpc_rpc_bytes_sent_total", "Bytes this worker's agent sent (headers and tensors), by peer.", s.bytes_sent);
  bytes("drpc_rpc_bytes_received_total", "Bytes this worker's agent received, by peer.", s.bytes_received);

  header("drpc_rpc_in_flight", "gauge",
         "Calls in flight: direction=sent awaiting a reply, received being served.");
  out << "drpc_rpc_in_flight{" << worker << ",direction=\"sent\"} " << s.in_flight_sent << '\n';
  out << "drpc_rpc_in_flight{" << worker << ",direction=\"received\"} " << s.in_flight_received << '\n';
  header("drpc_rpc_handler_queue_length", "gauge", "Tasks waiting for a handler thread.");
  out << "drpc_rpc_handler_queue_length{" << worker << "} " << s.handler_queue << '\n';

  // Histograms with the same buckets on every worker: Prometheus adds them up across
  // workers (histogram_quantile over sum by (le)), which quantiles could not be.
  auto summary = [&](const char* name, const char* help, const std::map<std::string, LatencySummary>& m) {
    header(name, "histogram", help);
    const auto& bounds = latency_bucket_bounds();
    for (const auto& [fn, l] : m) {
      const std::string labels = worker + ",function=\"" + escape_label(fn) + "\"";
      for (size_t b = 0; b < bounds.size() && b < l.buckets.size(); ++b) {
        out << name << "_bucket{" << labels << ",le=\"" << number(bounds[b]) << "\"} " << l.buckets[b] << '\n';
      }
      out << name << "_bucket{" << labels << ",le=\"+Inf\"} " << l.count << '\n';
      out << name << "_sum{" << labels << "} " << number(l.sum_seconds) << '\n';
      out << name << "_count{" << labels << "} " << l.count << '\n';
    }
  };
  summary("drpc_rpc_latency_seconds", "Round trip of this worker's calls, by function.", s.latency);
  summary("drpc_rpc_handler_seconds", "From a request's arrival to its reply on this worker, by function.",
          s.handler_latency);

  auto gauge = [&](const char* name, const char* help, int64_t v) {
    header(name, "gauge", help);
    out << name << '{' << worker << "} " << v << '\n';
  };
  gauge("drpc_rref_owners", "RRefs this worker owns that some worker references.", s.rref_owners);
  gauge("drpc_rref_users", "User references to RRefs held on this worker.", s.rref_users);
  gauge("drpc_rref_pending_forks", "RRef forks their owner has not confirmed yet.", s.rref_pending_forks);
  gauge("drpc_autograd_contexts", "Live distributed autograd contexts on this worker.", s.autograd_contexts);

  header("drpc_peer_up", "gauge", "1 while this worker's connection to the peer is up, 0 once it failed or left.");
  for (const auto& p : s.peers) {
    out << "drpc_peer_up{" << worker << ",peer=\"" << escape_label(p.name) << "\"} " << (p.alive ? 1 : 0) << '\n';
  }
  header("drpc_build_info", "gauge", "Always 1; the labels name the versions this worker was built with.");
  out << "drpc_build_info{" << worker << ",version=\"" << kDrpcVersion << "\",torch=\"" << TORCH_VERSION
      << "\",grpc=\"" << GRPC_CPP_VERSION_STRING << "\",protobuf=\""
      << GOOGLE_PROTOBUF_VERSION / 1000000 << '.' << GOOGLE_PROTOBUF_VERSION / 1000 % 1000 << '.'
      << GOOGLE_PROTOBUF_VERSION % 1000 << "\"} 1\n";
  return out.str();
}

std::string summary_line(const MetricsSnapshot& s) {
  std::ostringstream out;
  out << "summary: sent " << s.total_calls_sent() << " calls (" << sum_values(s.errors_sent) << " failed), received "
      << s.total_calls_received() << " (" << sum_values(s.errors_received) << " failed); "
      << human_bytes(sum_values(s.bytes_sent)) << " out, " << human_bytes(sum_values(s.bytes_received)) << " in";
  // The three functions with the slowest tail.
  std::vector<std::pair<std::string, LatencySummary>> slowest(s.latency.begin(), s.latency.end());
  std::sort(slowest.begin(), slowest.end(), [](const auto& a, const auto& b) { return a.second.p99 > b.second.p99; });
  if (slowest.size() > 3) slowest.resize(3);
  for (size_t i = 0; i < slowest.size(); ++i) {
    const auto& [fn, l] = slowest[i];
    out << (i == 0 ? "; slowest: " : ", ") << fn << " x" << l.count << " p50 " << millis(l.p50) << " p99 "
        << millis(l.p99);
  }
  out << "; rrefs owned " << s.rref_owners << ", users " << s.rref_users << ", pending forks "
      << s.rref_pending_forks << "; autograd contexts " << s.autograd_contexts;
  return out.str();
}

}  // namespace drpc
