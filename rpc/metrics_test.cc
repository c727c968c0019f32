// The metrics registry, its Prometheus text, the tracer's switch, clock alignment and the
// Chrome trace writer, each on its own.

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "common/utf8.h"
#include "rpc/metrics.h"
#include "rpc/profiler.h"

namespace drpc {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

TEST(LatencyHistogram, BucketsTileTheLineAndQuantilesAreWithinABucket) {
  // Every value lands in the bucket whose bounds contain it.
  for (uint64_t v : {0ull, 1ull, 7ull, 8ull, 9ull, 15ull, 16ull, 1000ull, 123456789ull, 1ull << 40, ~0ull}) {
    const int b = LatencyHistogram::bucket(v);
    ASSERT_GE(b, 0);
    ASSERT_LT(b, LatencyHistogram::kBuckets);
    EXPECT_LE(LatencyHistogram::bucket_lower(b), v) << v;
    if (b + 1 < LatencyHistogram::kBuckets) {
      EXPECT_GT(LatencyHistogram::bucket_lower(b + 1), v) << v;
    }
  }
  LatencyHistogram h;
  EXPECT_EQ(h.quantile(0.5), 0);
  // 1..100 ms, one each: p50 is 50 ms, p90 90 ms, p99 99 ms, each within 6.25%.
  for (int i = 1; i <= 100; ++i) h.record(milliseconds(i));
  EXPECT_EQ(h.count(), 100);
  EXPECT_NEAR(h.sum_seconds(), 5.050, 1e-9);
  EXPECT_NEAR(h.quantile(0.5), 0.050, 0.050 * 0.0625);
  EXPECT_NEAR(h.quantile(0.9), 0.090, 0.090 * 0.0625);
  EXPECT_NEAR(h.quantile(0.99), 0.099, 0.099 * 0.0625);
  EXPECT_NEAR(h.quantile(1.0), 0.100, 0.100 * 0.0625);
}

TEST(LatencyHistogram, ConcurrentRecordsAreAllCounted) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) h.record(microseconds(100));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.count(), 40000);
  EXPECT_NEAR(h.quantile(0.5), 100e-6, 100e-6 * 0.0625);
}

TEST(Metrics, CountsByFunctionPeerAndKind) {
  Metrics m("w0", 0, {"w0", "w1", "w2"});
  auto* add = m.function("aten::add");
  EXPECT_EQ(m.function("aten::add"), add);  // one entry per label
  for (int i = 0; i < 3; ++i) m.call_sent(add, 1);
  m.call_sent(add, 2);
  m.call_received(m.function("my.fn"), 2);
  m.call_sent(add, 7);  // no such peer: ignored, not a crash
  m.error(true, ErrorKind::kTimeout);
  m.error(true, ErrorKind::kTimeout);
  m.error(false, ErrorKind::kRemote);
  m.bytes_sent(1, 100);
  m.bytes_received(2, 50);
  m.reply_received(add, milliseconds(2));
  m.set_gauge_source([](MetricsSnapshot& s) {
    s.in_flight_sent = 4;
    s.handler_queue = 2;
  });
  MetricsSnapshot s = m.snapshot();
  EXPECT_EQ(s.worker, "w0");
  EXPECT_EQ((s.calls_sent[{"aten::add", "w1"}]), 3);
  EXPECT_EQ((s.calls_sent[{"aten::add", "w2"}]), 1);
  EXPECT_EQ((s.calls_received[{"my.fn", "w2"}]), 1);
  EXPECT_EQ(s.total_calls_sent(), 4);
  EXPECT_EQ(s.errors_sent["Timeout"], 2);
  EXPECT_EQ(s.errors_received["Remote"], 1);
  EXPECT_EQ(s.bytes_sent["w1"], 100);
  EXPECT_EQ(s.bytes_received["w2"], 50);
  EXPECT_EQ(s.bytes_sent.count("w0"), 0u);  // never to oneself over the wire
  EXPECT_EQ(s.latency["aten::add"].count, 1);
  EXPECT_EQ(s.in_flight_sent, 4);
  EXPECT_EQ(s.handler_queue, 2);
  m.set_gauge_source(nullptr);
  EXPECT_EQ(m.snapshot().in_flight_sent, 0);
}

TEST(Metrics, FunctionNamesAreBounded) {
  Metrics m("w0", 0, {"w0", "w1"});
  for (size_t i = 0; i < Metrics::kMaxFunctions + 50; ++i) m.call_received(m.function("f" + std::to_string(i)), 1);
  MetricsSnapshot s = m.snapshot();
  EXPECT_EQ(s.calls_received.size(), Metrics::kMaxFunctions + 1);  // the first ones, and "other"
  EXPECT_EQ((s.calls_received[{"other", "w1"}]), 50);
}

TEST(Metrics, HistogramBucketsAreCumulativeAndPlacedWithinTheirWidth) {
  LatencyHistogram h;
  for (int i = 1; i <= 100; ++i) h.record(std::chrono::microseconds(100 * i));  // 0.1 .. 10 ms
  const std::vector<double> bounds = {0.0005, 0.001, 0.005, 0.01, 1};
  const std::vector<int64_t> c = h.cumulative(bounds);
  ASSERT_EQ(c.size(), bounds.size() + 1);
  // Exactly 5, 10, 50, 100, 100 are at most 0.5, 1, 5, 10 ms, 1 s; a bound may land within
  // its fine bucket (6.25%): off by the values within that distance of it.
  EXPECT_NEAR(c[0], 5, 1);
  EXPECT_NEAR(c[1], 10, 1);
  EXPECT_NEAR(c[2], 50, 4);
  EXPECT_NEAR(c[3], 100, 7);
  EXPECT_EQ(c[4], 100);
  EXPECT_EQ(c[5], 100);
  for (size_t i = 1; i < c.size(); ++i) EXPECT_LE(c[i - 1], c[i]);
  EXPECT_EQ(LatencyHistogram().cumulative(bounds), std::vector<int64_t>(bounds.size() + 1, 0));
}

TEST(Metrics, LabelsAreTheFunctionBounded) {
  EXPECT_EQ(function_label("aten::add"), "aten::add");
  EXPECT_EQ(function_label("to_here of RRef"), "to_here of RRef");
  EXPECT_EQ(function_label("torchscript:model:forward"), "torchscript:model:forward");
  EXPECT_EQ(function_label(""), "unknown");
  EXPECT_EQ(function_label(std::string(1000, 'x')).size(), 128u);
}

TEST(Metrics, PrometheusTextHasEveryFamilyAndEscapesLabels) {
  Metrics m("w\"0", 0, {"w\"0", "w1"});
  m.call_sent(m.function("a\\b"), 1);
  m.reply_received(m.function("a\\b"), milliseconds(3));
  m.error(true, ErrorKind::kPeerUnavailable);
  MetricsSnapshot s = m.snapshot();
  s.rref_owners = 3;
  s.autograd_contexts = 2;
  const std::string text = to_prometheus_text(s);
  for (const char* line : {
           "# TYPE drpc_rpc_calls_sent_total counter\n",
           "drpc_rpc_calls_sent_total{worker=\"w\\\"0\",function=\"a\\\\b\",peer=\"w1\"} 1\n",
           "drpc_rpc_errors_total{worker=\"w\\\"0\",direction=\"sent\",kind=\"PeerUnavailable\"} 1\n",
           "drpc_rpc_bytes_sent_total{worker=\"w\\\"0\",peer=\"w1\"} 0\n",
           "drpc_rpc_in_flight{worker=\"w\\\"0\",direction=\"sent\"} 0\n",
           "drpc_rpc_handler_queue_length{worker=\"w\\\"0\"} 0\n",
           "# TYPE drpc_rpc_latency_seconds histogram\n",
           "drpc_rpc_latency_seconds_bucket{worker=\"w\\\"0\",function=\"a\\\\b\",le=\"0.0025\"} 0\n",
           "drpc_rpc_latency_seconds_bucket{worker=\"w\\\"0\",function=\"a\\\\b\",le=\"0.005\"} 1\n",
           "drpc_rpc_latency_seconds_bucket{worker=\"w\\\"0\",function=\"a\\\\b\",le=\"+Inf\"} 1\n",
           "drpc_rpc_latency_seconds_count{worker=\"w\\\"0\",function=\"a\\\\b\"} 1\n",
           "drpc_peer_up{worker=\"w\\\"0\",peer=\"w1\"} 1\n",
           "# TYPE drpc_build_info gauge\n",
           "drpc_rref_owners{worker=\"w\\\"0\"} 3\n",
           "drpc_autograd_contexts{worker=\"w\\\"0\"} 2\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << "missing: " << line << "in:\n" << text;
  }
  // Every sample line is "name{labels} value" with a number that parses.
  size_t samples = 0;
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    ASSERT_NE(end, std::string::npos) << "the text ends with a newline";
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    ++samples;
    const size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    size_t used = 0;
    std::stod(line.substr(space + 1), &used);
    EXPECT_EQ(used, line.size() - space - 1) << line;
  }
  EXPECT_GT(samples, 10u);
  const std::string summary = summary_line(s);
  EXPECT_NE(summary.find("sent 1 calls (1 failed)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("a\\b x1"), std::string::npos) << summary;
}

TEST(Metrics, NamesThatAreNotUtf8BecomeValidUtf8InTheText) {
  EXPECT_EQ(valid_utf8("ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "ok \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(valid_utf8("a\xff" "b"), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(valid_utf8("\xc3"), "\xef\xbf\xbd");          // cut short
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
  EXPECT_EQ(valid_utf8("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong
  Metrics m("w0", 0, {"w0", "w1"});
  m.call_received(m.function("f\xff"), 1);
  const std::string text = to_prometheus_text(m.snapshot());
  EXPECT_NE(text.find("function=\"f\xef\xbf\xbd\""), std::string::npos) << text;
  EXPECT_EQ(text.find('\xff'), std::string::npos);
}

TEST(Tracer, ActiveOnlyWhileProfilingOrServingAProfiledRequest) {
  Tracer tracer;
  EXPECT_FALSE(tracer.active());
  EXPECT_EQ(tracer.collector_for_send(), nullptr);
  tracer.start();
  EXPECT_TRUE(tracer.active());
  EXPECT_THROW(tracer.start(), Error);
  auto profile = tracer.collector_for_send();
  ASSERT_NE(profile, nullptr);
  profile->add(TraceEvent{"x", "rpc", 0, 1, "main", 10, 5, {}});
  {
    auto request = std::make_shared<TraceCollector>();
    Tracer::Scope scope(&tracer, request);
    EXPECT_EQ(tracer.collector_for_send(), request);  // this thread serves a profiled request
    EXPECT_EQ(tracer.serving(), request);
    std::thread([&] { EXPECT_EQ(tracer.collector_for_send(), profile); }).join();  // others: the profile
    Tracer other;
    EXPECT_EQ(other.serving(), nullptr);  // another worker in this process is not serving it
  }
  EXPECT_EQ(tracer.serving(), nullptr);
  auto events = tracer.stop();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "x");
  EXPECT_FALSE(tracer.active());
  EXPECT_TRUE(tracer.stop().empty());
  {
    auto request = std::make_shared<TraceCollector>();
    Tracer::Scope scope(&tracer, request);
    EXPECT_TRUE(tracer.active());  // serving a profiled request for someone else's profile
  }
  EXPECT_FALSE(tracer.active());
}

TEST(Tracer, ClockAlignmentSplitsTheNetworkEvenlyAndAddsUp) {
  // The callee's clock is 1,000,000 ns ahead; 300 ns each way; 500 ns on the callee.
  const int64_t sent = 1000, arrival = 1000 + 300 + 1000000, reply = arrival + 500, receipt = 1000 + 300 + 500 + 300;
  ClockAlignment a = align_clocks(sent, arrival, reply, receipt);
  EXPECT_EQ(a.offset, 1000000);
  EXPECT_EQ(a.request_ns, 300);
  EXPECT_EQ(a.reply_ns, 300);
  // Odd totals: the halves still add up.
  a = align_clocks(0, 50, 60, 11);
  EXPECT_EQ(a.request_ns + (60 - 50) + a.reply_ns, 11);
  EXPECT_EQ(50 - a.offset, a.request_ns);
  // A callee interval longer than the round trip (a drifting clock): no negative network.
  a = align_clocks(0, 0, 100, 50);
  EXPECT_EQ(a.request_ns, 0);
  EXPECT_EQ(a.reply_ns, 0);
}

TEST(ChromeTrace, IsJsonWithProcessesThreadsAndCompleteEvents) {
  std::vector<TraceEvent> events = {
      {"f\"n", "rpc", 0, 11, "main", 5000, 3000, {{"to", "w\n1"}}, 1, 0},
      {"send", "send", 0, 11, "main", 5000, 100, {}, 2, 1},  // part of the call
      {"f\"n", "execute", 1, 22, "handler 0", 5500, 2000, {}, 3, 0},
  };
  events.push_back(TraceEvent{"not utf-8 \xff", "queue", 1, 22, "handler 0", 5600, 100, {}, 4, 3});
  const std::string json = to_chrome_trace(events, {"w0", "w1"});
  google::protobuf::Struct root;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &root).ok()) << json;
  const auto& list = root.fields().at("traceEvents").list_value().values();
  int complete = 0, process_names = 0, thread_names = 0;
  for (const auto& v : list) {
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    if (ph == "X") {
      ++complete;
      if (f.at("cat").string_value() == "rpc") {
        EXPECT_EQ(f.at("name").string_value(), "f\"n");
        EXPECT_EQ(f.at("pid").number_value(), 1);  // rank 0
        EXPECT_EQ(f.at("tid").number_value(), 11);
        EXPECT_EQ(f.at("ts").number_value(), 0);  // the earliest event
        EXPECT_EQ(f.at("dur").number_value(), 3);  // us
        EXPECT_EQ(f.at("args").struct_value().fields().at("to").string_value(), "w\n1");
      }
      if (f.at("cat").string_value() == "execute") {
        EXPECT_EQ(f.at("ts").number_value(), 0.5);
      }
    } else if (ph == "M" && f.at("name").string_value() == "process_name") {
      ++process_names;
      const double pid = f.at("pid").number_value();
      EXPECT_EQ(f.at("args").struct_value().fields().at("name").string_value(), pid == 1 ? "w0" : "w1");
    } else if (ph == "M" && f.at("name").string_value() == "thread_name") {
      ++thread_names;
    }
  }
  EXPECT_EQ(complete, 4);
  EXPECT_EQ(process_names, 2);
  EXPECT_EQ(thread_names, 2);
}

TEST(ChromeTrace, AFlowArrowLinksEachCallToItsExecutionOnAnotherWorker) {
  const std::vector<TraceEvent> events = {
      {"f", "rpc", 0, 11, "main", 1000, 5000, {}, 1, 0},
      {"f", "execute", 1, 22, "handler 0", 2000, 1000, {}, 2, 1},   // called by span 1
      {"g", "execute", 1, 22, "handler 0", 4000, 500, {}, 3, 0},    // no caller known
      {"h", "execute", 0, 11, "main", 1500, 100, {}, 4, 1},         // same worker: no arrow
  };
  google::protobuf::Struct root;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(to_chrome_trace(events, {"w0", "w1"}), &root).ok());
  std::vector<std::string> flows;
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    const std::string ph = f.at("ph").string_value();
    if (ph != "s" && ph != "f") continue;
    EXPECT_EQ(f.at("id").number_value(), 2);
    flows.push_back(ph + " pid " + std::to_string(static_cast<int>(f.at("pid").number_value())) + " tid " +
                    std::to_string(static_cast<int>(f.at("tid").number_value())) + " ts " +
                    std::to_string(f.at("ts").number_value()) + (f.count("bp") ? " bp " + f.at("bp").string_value() : ""));
  }
  EXPECT_EQ(flows, (std::vector<std::string>{"s pid 1 tid 11 ts 0.000000", "f pid 2 tid 22 ts 1.000000 bp e"}));
}

TEST(ChromeTrace, CallsInFlightTogetherGetRowsOfTheirOwnWithTheirParts) {
  auto span = [](const char* name, int64_t start, int64_t dur, uint64_t id, uint64_t parent) {
    TraceEvent e{name, "rpc", 0, 7, "main", start, dur, {}};
    e.id = id;
    e.parent = parent;
    return e;
  };
  // a and b overlap on thread 7 (two rpc_async calls); c starts after a ended.
  const std::vector<TraceEvent> events = {span("a", 0, 100, 1, 0),     span("a.send", 0, 10, 2, 1),
                                          span("b", 5, 195, 3, 0),     span("b.send", 5, 15, 4, 3),
                                          span("b.net", 20, 50, 5, 3), span("c", 150, 10, 6, 0)};
  google::protobuf::Struct root;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(to_chrome_trace(events, {"w0"}), &root).ok());
  std::map<std::string, double> tid;
  std::map<double, std::string> thread_names;
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() == "X") tid[f.at("name").string_value()] = f.at("tid").number_value();
    if (f.at("name").string_value() == "thread_name") {
      thread_names[f.at("tid").number_value()] = f.at("args").struct_value().fields().at("name").string_value();
    }
  }
  EXPECT_EQ(tid["a"], 7);
  EXPECT_EQ(tid["a.send"], 7);
  EXPECT_EQ(tid["c"], 7);
  EXPECT_NE(tid["b"], 7);
  EXPECT_EQ(tid["b.send"], tid["b"]);
  EXPECT_EQ(tid["b.net"], tid["b"]);
  EXPECT_EQ(thread_names[7], "main");
  EXPECT_EQ(thread_names[tid["b"]], "main (async 1)");
}

}  // namespace
}  // namespace drpc
