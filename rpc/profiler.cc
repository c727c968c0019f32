#include "rpc/profiler.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/utf8.h"

namespace drpc {
namespace {

// The profiled request this thread serves, and whose Tracer serves it (several workers
// may live in one process).
struct Serving {
  const Tracer* tracer = nullptr;
  std::shared_ptr<TraceCollector> collector;
};
thread_local Serving tls_serving;

thread_local int64_t tls_tid = 0;
thread_local std::string tls_thread_name;
thread_local bool tls_thread_named = false;  // explicitly, not the default

void json_string(std::ostream& out, const std::string& raw) {
  out << '"';
  for (unsigned char c : valid_utf8(raw)) {  // JSON is UTF-8; names from peers may not be
    switch (c) {
      case '"': out << "\\\""; break;
      case '\\': out << "\\\\"; break;
      case '\n': out << "\\n"; break;
      case '\r': out << "\\r"; break;
      case '\t': out << "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out << buf;
        } else {
          out << c;
        }
    }
  }
  out << '"';
}

std::string micros(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", ns / 1000.0);
  return buf;
}

}  // namespace

// --- TraceCollector -----------------------------------------------------------------------

void TraceCollector::add(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event));
}

void TraceCollector::add_all(std::vector<TraceEvent> events) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : events) events_.push_back(std::move(e));
}

std::vector<TraceEvent> TraceCollector::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(events_);
}

// --- Tracer -------------------------------------------------------------------------------

void Tracer::start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (profile_) throw Error(ErrorKind::kBadArgument, "a profile is already running on this worker");
  profile_ = std::make_shared<TraceCollector>();
  active_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<TraceEvent> Tracer::stop() {
  std::shared_ptr<TraceCollector> profile;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!profile_) return {};
    profile.swap(profile_);
    active_.fetch_sub(1, std::memory_order_relaxed);
  }
  return profile->take();
}

std::shared_ptr<TraceCollector> Tracer::collector_for_send() {
  if (tls_serving.tracer == this && tls_serving.collector) return tls_serving.collector;
  std::lock_guard<std::mutex> lock(mu_);
  return profile_;
}

std::shared_ptr<TraceCollector> Tracer::serving() const {
  return tls_serving.tracer == this ? tls_serving.collector : nullptr;
}

Tracer::Scope::Scope(Tracer* tracer, std::shared_ptr<TraceCollector> collector)
    : tracer_(tracer), engaged_(tracer && collector) {
  if (!engaged_) return;
  previous_tracer_ = tls_serving.tracer;
  previous_ = std::move(tls_serving.collector);
  tls_serving.tracer = tracer;
  tls_serving.collector = std::move(collector);
  tracer_->active_.fetch_add(1, std::memory_order_relaxed);
}

Tracer::Scope::~Scope() {
  if (!engaged_) return;
  tracer_->active_.fetch_sub(1, std::memory_order_relaxed);
  tls_serving.tracer = previous_tracer_;
  tls_serving.collector = std::move(previous_);
}

// --- threads and clocks -------------------------------------------------------------------

ClockAlignment align_clocks(int64_t sent, int64_t arrival, int64_t reply, int64_t receipt) {
  ClockAlignment a;
  const int64_t network = std::max<int64_t>(0, (receipt - sent) - (reply - arrival));
  a.request_ns = network / 2;
  a.reply_ns = network - a.request_ns;
  a.offset = arrival - (sent + a.request_ns);
  return a;
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t current_thread_id() {
  if (tls_tid == 0) tls_tid = static_cast<int64_t>(syscall(SYS_gettid));
  return tls_tid;
}

const std::string& current_thread_name() {
  if (tls_thread_name.empty()) {
    const int64_t tid = current_thread_id();
    tls_thread_name = tid == static_cast<int64_t>(getpid()) ? "main" : "thread " + std::to_string(tid);
  }
  return tls_thread_name;
}

void set_current_thread_name(const std::string& name) {
  tls_thread_name = name;
  tls_thread_named = true;
}

void name_current_thread_if_unnamed(const std::string& name) {
  if (!tls_thread_named) set_current_thread_name(name);
}

// --- Chrome trace -------------------------------------------------------------------------

namespace {

// Where a span is drawn: its thread's row, or one of the extra rows of that thread.
struct Placement {
  int64_t tid;
  int lane;
};

constexpr int kMaxLanes = 16;

// The row (pid, synthetic tid) of lane `lane` > 0 of thread `tid`: above any real tid
// (Linux's are below 2^22), below 2^31.
int64_t lane_tid(int64_t tid, int lane) { return (int64_t{1} << 30) + ((tid & 0x3ffffff) << 4) + lane; }

// Splits one row's spans into lanes in which they nest properly: a span goes into its
// parent's lane when it fits inside the parent there, else into the first lane where
// nothing is open at its start, else a new one.
std::vector<int> assign_lanes(const std::vector<const TraceEvent*>& row) {
  std::vector<std::vector<const TraceEvent*>> open;  // per lane, the spans still open
  std::map<uint64_t, int> lane_of;
  std::vector<int> lanes;
  auto end = [](const TraceEvent* e) { return e->start_ns + e->duration_ns; };
  auto close_before = [&](int lane, int64_t t) {
    auto& stack = open[lane];
    while (!stack.empty() && end(stack.back()) <= t) stack.pop_back();
  };
  for (const TraceEvent* e : row) {
    int placed = -1;
    auto parent = e->parent ? lane_of.find(e->parent) : lane_of.end();
    if (parent != lane_of.end()) {
      close_before(parent->second, e->start_ns);
      const auto& stack = open[parent->second];
      if (!stack.empty() && stack.back()->id == e->parent && end(stack.back()) >= end(e)) placed = parent->second;
    }
    for (int lane = 0; placed < 0 && lane < static_cast<int>(open.size()); ++lane) {
      close_before(lane, e->start_ns);
      if (open[lane].empty()) placed = lane;
    }
    if (placed < 0) {
      if (static_cast<int>(open.size()) < kMaxLanes) {
        open.emplace_back();
        placed = static_cast<int>(open.size()) - 1;
      } else {
        placed = kMaxLanes - 1;  // so many at once: the last lane takes the overflow
      }
    }
    open[placed].push_back(e);
    if (e->id) lane_of[e->id] = placed;
    lanes.push_back(placed);
  }
  return lanes;
}

}  // namespace

std::string to_chrome_trace(const std::vector<TraceEvent>& events, const std::vector<std::string>& worker_names) {
  std::vector<const TraceEvent*> sorted;
  for (const auto& e : events) sorted.push_back(&e);
  // Parents before their children: earlier first, longer first, then in the order made.
  std::sort(sorted.begin(), sorted.end(), [](const TraceEvent* a, const TraceEvent* b) {
    if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns;
    if (a->duration_ns != b->duration_ns) return a->duration_ns > b->duration_ns;
    return a->id < b->id;
  });
  const int64_t origin = sorted.empty() ? 0 : sorted.front()->start_ns;

  std::map<std::pair<int, int64_t>, std::vector<const TraceEvent*>> rows;
  for (const auto* e : sorted) rows[{e->worker, e->tid}].push_back(e);
  std::map<const TraceEvent*, Placement> placement;
  std::map<std::pair<int, int64_t>, std::string> threads;  // (worker, row tid) -> name
  for (const auto& [key, row] : rows) {
    const std::vector<int> lanes = assign_lanes(row);
    for (size_t i = 0; i < row.size(); ++i) {
      const int64_t tid = lanes[i] == 0 ? key.second : lane_tid(key.second, lanes[i]);
      placement[row[i]] = Placement{tid, lanes[i]};
      threads.emplace(std::make_pair(key.first, tid), lanes[i] == 0 ? row[i]->thread
                                                                     : row[i]->thread + " (async " +
                                                                           std::to_string(lanes[i]) + ")");
    }
  }

  std::ostringstream out;
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto begin = [&] {
    if (!first) out << ",";
    first = false;
    out << "\n";
  };
  std::set<int> workers;
  for (const auto* e : sorted) workers.insert(e->worker);
  for (int w : workers) {
    const std::string name = w >= 0 && w < static_cast<int>(worker_names.size()) ? worker_names[w]
                                                                                  : "worker " + std::to_string(w);
    begin();
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << w + 1 << ",\"args\":{\"name\":";
    json_string(out, name);
    out << "}}";
    begin();
    out << "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" << w + 1 << ",\"args\":{\"sort_index\":" << w
        << "}}";
  }
  for (const auto& [key, name] : threads) {
    begin();
    out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << key.first + 1 << ",\"tid\":" << key.second
        << ",\"args\":{\"name\":";
    json_string(out, name);
    out << "}}";
  }
  for (const auto* e : sorted) {
    begin();
    out << "{\"ph\":\"X\",\"name\":";
    json_string(out, e->name);
    out << ",\"cat\":";
    json_string(out, e->category);
    out << ",\"pid\":" << e->worker + 1 << ",\"tid\":" << placement[e].tid << ",\"ts\":" << micros(e->start_ns - origin)
        << ",\"dur\":" << micros(e->duration_ns) << ",\"args\":{";
    for (size_t i = 0; i < e->args.size(); ++i) {
      if (i) out << ",";
      json_string(out, e->args[i].first);
      out << ":";
      json_string(out, e->args[i].second);
    }
    out << "}}";
  }
  // Flow arrows (Perfetto, chrome://tracing) from each call to its execution on the callee:
  // an execution whose parent is a span of another worker. "s" binds to the call's slice at
  // its start, "f" (bp "e") to the execution's slice at its start.
  std::map<uint64_t, const TraceEvent*> by_id;
  for (const auto* e : sorted) {
    if (e->id) by_id[e->id] = e;
  }
  for (const auto* e : sorted) {
    if (e->category != "execute" || !e->parent || !e->id) continue;
    auto caller = by_id.find(e->parent);
    if (caller == by_id.end() || caller->second->worker == e->worker) continue;
    const TraceEvent* c = caller->second;
    begin();
    out << "{\"ph\":\"s\",\"name\":\"rpc\",\"cat\":\"flow\",\"id\":" << e->id << ",\"pid\":" << c->worker + 1
        << ",\"tid\":" << placement[c].tid << ",\"ts\":" << micros(c->start_ns - origin) << "}";
    begin();
    out << "{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"rpc\",\"cat\":\"flow\",\"id\":" << e->id
        << ",\"pid\":" << e->worker + 1 << ",\"tid\":" << placement[e].tid << ",\"ts\":" << micros(e->start_ns - origin)
        << "}";
  }
  out << "\n]}\n";
  return out.str();
}

}  // namespace drpc
