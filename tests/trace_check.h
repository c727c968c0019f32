#pragma once

// Checks a Chrome trace of the call chain worker0 -> worker1 "obs.chain" -> worker2
// "obs.leaf", parsed with protobuf's JSON parser (an independent one).

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace drpc {
namespace testing {

struct ChromeEvent {
  std::string name, cat;
  int pid = 0;
  int64_t tid = 0;
  double ts = 0, dur = 0;  // us
  std::map<std::string, std::string> args;
  double end() const { return ts + dur; }
};

// A flow arrow's end ("s" or "f").
struct FlowEnd {
  int pid = 0;
  int64_t tid = 0;
  double ts = 0;
  std::string bind;  // "bp"
};

struct ChromeTrace {
  std::vector<ChromeEvent> events;           // "X" events
  std::map<double, std::vector<std::pair<std::string, FlowEnd>>> flows;  // by id: ("s"|"f", end)
  std::map<int, std::string> process_names;  // pid -> worker
  std::map<std::pair<int, int64_t>, std::string> thread_names;
};

// Parses `json`; records a failure and returns what it could if it is not a trace.
inline ChromeTrace parse_chrome_trace(const std::string& json) {
  ChromeTrace trace;
  google::protobuf::Struct root;
  auto status = google::protobuf::util::JsonStringToMessage(json, &root);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json.substr(0, 2000);
  if (!status.ok() || !root.fields().count("traceEvents")) {
    ADD_FAILURE() << "not a Chrome trace";
    return trace;
  }
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    const int pid = static_cast<int>(f.at("pid").number_value());
    if (ph == "M") {
      const std::string kind = f.at("name").string_value();
      const auto& args = f.at("args").struct_value().fields();
      if (kind == "process_name") trace.process_names[pid] = args.at("name").string_value();
      if (kind == "thread_name") {
        trace.thread_names[{pid, static_cast<int64_t>(f.at("tid").number_value())}] = args.at("name").string_value();
      }
      continue;
    }
    if (ph == "s" || ph == "f") {
      FlowEnd end;
      end.pid = pid;
      end.tid = static_cast<int64_t>(f.at("tid").number_value());
      end.ts = f.at("ts").number_value();
      if (f.count("bp")) end.bind = f.at("bp").string_value();
      trace.flows[f.at("id").number_value()].emplace_back(ph, end);
      continue;
    }
    EXPECT_EQ(ph, "X");
    ChromeEvent e;
    e.name = f.at("name").string_value();
    e.cat = f.at("cat").string_value();
    e.pid = pid;
    e.tid = static_cast<int64_t>(f.at("tid").number_value());
    e.ts = f.at("ts").number_value();
    e.dur = f.at("dur").number_value();
    for (const auto& [k, a] : f.at("args").struct_value().fields()) e.args[k] = a.string_value();
    trace.events.push_back(e);
  }
  return trace;
}

// The chain's 12 spans: on worker0 the call and its send and network spans; on worker1 the
// queue, the execution and, inside it on the same thread, the nested call with its own
// send and network spans; on worker2 the queue and the execution. Each call's spans are
// back to back and add up to the call.
inline void check_chain_trace(const std::string& json) {
  const ChromeTrace trace = parse_chrome_trace(json);
  EXPECT_EQ(trace.process_names, (std::map<int, std::string>{{1, "worker0"}, {2, "worker1"}, {3, "worker2"}}));
  ASSERT_EQ(trace.events.size(), 12u) << json;
  for (const auto& e : trace.events) {
    EXPECT_TRUE(trace.thread_names.count({e.pid, e.tid})) << "no thread_name for " << e.name;
    EXPECT_GE(e.dur, 0) << e.name;
    EXPECT_GE(e.ts, 0) << e.name;
  }
  auto find = [&](int pid, const std::string& cat, const std::string& name, const std::string& direction = "") {
    const ChromeEvent* found = nullptr;
    for (const auto& e : trace.events) {
      if (e.pid != pid || e.cat != cat || e.name != name) continue;
      if (!direction.empty() && (!e.args.count("direction") || e.args.at("direction") != direction)) continue;
      EXPECT_EQ(found, nullptr) << "two " << cat << " " << name << " on pid " << pid;
      found = &e;
    }
    EXPECT_NE(found, nullptr) << "no " << cat << " " << name << " " << direction << " on pid " << pid;
    return found ? *found : ChromeEvent{};
  };
  const ChromeEvent call0 = find(1, "rpc", "obs.chain"), send0 = find(1, "send", "send"),
                    req0 = find(1, "network", "network", "request"), rep0 = find(1, "network", "network", "reply"),
                    queue1 = find(2, "queue", "queue"), exec1 = find(2, "execute", "obs.chain"),
                    call1 = find(2, "rpc", "obs.leaf"), send1 = find(2, "send", "send"),
                    req1 = find(2, "network", "network", "request"), rep1 = find(2, "network", "network", "reply"),
                    queue2 = find(3, "queue", "queue"), exec2 = find(3, "execute", "obs.leaf");
  EXPECT_EQ(call0.args.count("to") ? call0.args.at("to") : "", "worker1");
  EXPECT_EQ(call1.args.count("to") ? call1.args.at("to") : "", "worker2");
  EXPECT_EQ(exec2.args.count("from") ? exec2.args.at("from") : "", "worker1");
  constexpr double kEps = 1e-6;  // us; the trace keeps whole ns
  for (const auto& [c, s, rq, q, x, rp] : {std::make_tuple(call0, send0, req0, queue1, exec1, rep0),
                                           std::make_tuple(call1, send1, req1, queue2, exec2, rep1)}) {
    EXPECT_NEAR(s.ts, c.ts, kEps) << c.name;
    EXPECT_NEAR(rq.ts, s.end(), kEps) << c.name;
    EXPECT_NEAR(q.ts, rq.end(), kEps) << c.name;
    EXPECT_NEAR(x.ts, q.end(), kEps) << c.name;
    EXPECT_NEAR(rp.ts, x.end(), kEps) << c.name;
    EXPECT_NEAR(rp.end(), c.end(), kEps) << c.name;
    EXPECT_NEAR(s.dur + rq.dur + q.dur + x.dur + rp.dur, c.dur, 4 * kEps) << c.name;
    // The caller's spans share its thread's row.
    for (const auto* e : {&s, &rq, &rp}) EXPECT_EQ(e->tid, c.tid);
  }
  // Each call has a flow arrow to its execution on the callee: "s" on the call's row at its
  // start, then "f" bound to the execution's slice at its start; nothing else is linked.
  ASSERT_EQ(trace.flows.size(), 2u) << json;
  std::vector<std::pair<ChromeEvent, ChromeEvent>> linked;
  for (const auto& [id, ends] : trace.flows) {
    ASSERT_EQ(ends.size(), 2u) << "flow " << id;
    EXPECT_EQ(ends[0].first, "s");
    EXPECT_EQ(ends[1].first, "f");
    EXPECT_EQ(ends[1].second.bind, "e");
    for (const auto& [c, x] : {std::make_pair(call0, exec1), std::make_pair(call1, exec2)}) {
      if (ends[0].second.pid == c.pid && ends[0].second.tid == c.tid && std::fabs(ends[0].second.ts - c.ts) < kEps &&
          ends[1].second.pid == x.pid && ends[1].second.tid == x.tid && std::fabs(ends[1].second.ts - x.ts) < kEps) {
        linked.emplace_back(c, x);
      }
    }
  }
  EXPECT_EQ(linked.size(), 2u) << "the flows link call0 -> exec1 and call1 -> exec2: " << json;

  // The nested call runs inside worker1's execution, on its thread.
  EXPECT_GE(call1.ts, exec1.ts - kEps);
  EXPECT_LE(call1.end(), exec1.end() + kEps);
  EXPECT_EQ(call1.tid, exec1.tid);
  EXPECT_EQ(trace.thread_names.at({2, exec1.tid}).rfind("handler ", 0), 0u) << "worker1 runs it on a handler thread";
  EXPECT_EQ(queue2.tid, exec2.tid);
}

}  // namespace testing
}  // namespace drpc
