// Metrics and the profiler through the public API, with every worker a full Runtime on
// its own real gRPC port (workers as threads of this process).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "drpc.h"
#include "testing/errors.h"
#include "tests/job.h"
#include "tests/trace_check.h"

namespace drpc {
namespace {

using testing::Job;
using Calls = std::map<std::pair<std::string, std::string>, int64_t>;
using Kinds = std::map<std::string, int64_t>;

DRPC_REGISTER_FUNCTION("obs.fail", []() -> int64_t { throw std::runtime_error("obs.fail always fails"); });
// get_metrics() inside a served function is the serving worker's.
DRPC_REGISTER_FUNCTION("obs.my_calls_received", []() { return get_metrics().total_calls_received(); });
DRPC_REGISTER_FUNCTION("obs.leaf", [](at::Tensor x) { return x * 2; });
DRPC_REGISTER_FUNCTION("obs.chain", [](at::Tensor x) { return rpc_sync("worker2", "obs.leaf", {x}).toTensor() + 1; });

TEST(Observability, MetricsCountAKnownSequenceOfCallsOnEveryWorker) {
  Job job(3);
  const at::Tensor x = at::ones({8});
  for (int i = 0; i < 4; ++i) job[0].rpc_sync("worker1", "aten::add", {x, x});
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(testing::expect_error([&] { job[0].rpc_sync("worker2", "obs.fail"); }).kind(), ErrorKind::kRemote);
  }
  EXPECT_EQ(testing::expect_error([&] { job[0].rpc_sync("worker1", "no.such.fn"); }).kind(), ErrorKind::kBadArgument);
  EXPECT_EQ(job[0].rpc_sync("worker2", "obs.my_calls_received").toInt(), 3);  // 2 obs.fail and this one

  const MetricsSnapshot m0 = job[0].metrics(), m1 = job[1].metrics(), m2 = job[2].metrics();
  EXPECT_EQ(m0.worker, "worker0");
  EXPECT_EQ(m2.rank, 2);
  EXPECT_EQ(m0.calls_sent, (Calls{{{"aten::add", "worker1"}, 4},
                                  {{"no.such.fn", "worker1"}, 1},
                                  {{"obs.fail", "worker2"}, 2},
                                  {{"obs.my_calls_received", "worker2"}, 1}}));
  EXPECT_EQ(m0.calls_received, Calls{});
  EXPECT_EQ(m1.calls_received, (Calls{{{"aten::add", "worker0"}, 4}, {{"no.such.fn", "worker0"}, 1}}));
  EXPECT_EQ(m2.calls_received, (Calls{{{"obs.fail", "worker0"}, 2}, {{"obs.my_calls_received", "worker0"}, 1}}));
  EXPECT_EQ(m1.calls_sent, Calls{});
  EXPECT_EQ(m0.errors_sent, (Kinds{{"BadArgument", 1}, {"Remote", 2}}));
  EXPECT_EQ(m1.errors_received, (Kinds{{"BadArgument", 1}}));
  EXPECT_EQ(m2.errors_received, (Kinds{{"Remote", 2}}));
  EXPECT_EQ(m0.latency.at("aten::add").count, 4);
  EXPECT_EQ(m1.handler_latency.at("aten::add").count, 4);
  EXPECT_LE(m0.latency.at("aten::add").p50, m0.latency.at("aten::add").p99);
  // Bytes: what worker0 sent worker1 is what worker1 received, with 4 x 2 tensors of 32 bytes.
  EXPECT_EQ(m0.bytes_sent.at("worker1"), m1.bytes_received.at("worker0"));
  EXPECT_EQ(m1.bytes_sent.at("worker0"), m0.bytes_received.at("worker1"));
  EXPECT_GT(m0.bytes_sent.at("worker1"), 8 * 32);
  EXPECT_EQ(m1.bytes_sent.at("worker2"), 0);
  EXPECT_EQ(m0.in_flight_sent, 0);  // (the callee may still be finishing its side)

  // RRefs: worker1 owns a value worker0 references.
  RRef r = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({2})});
  EXPECT_TRUE(at::equal(r.to_here().toTensor(), at::ones({2})));
  EXPECT_EQ(job[1].metrics().rref_owners, 1);
  EXPECT_EQ(job[0].metrics().rref_users, 1);
  EXPECT_EQ(job[0].metrics().calls_sent.count({"to_here of RRef", "worker1"}), 1u);  // ids left out of labels
  // Autograd: a context lives on the workers it touched until it is released.
  {
    dist_autograd::Context ctx(job[0]);
    EXPECT_EQ(job[0].metrics().autograd_contexts, 1);
    job[0].rpc_sync("worker2", "obs.leaf", {at::ones({2}).set_requires_grad(true)});
    EXPECT_EQ(job[2].metrics().autograd_contexts, 1);
    EXPECT_EQ(job[1].metrics().autograd_contexts, 0);
    job[0].autograd().release(ctx.id())->wait();  // the scope's end would not wait for worker2
  }
  EXPECT_EQ(job[0].metrics().autograd_contexts, 0);
  EXPECT_EQ(job[2].metrics().autograd_contexts, 0);
  const std::string text = to_prometheus_text(job[1].metrics());
  EXPECT_TRUE(testing::contains(
      text, "drpc_rpc_calls_received_total{worker=\"worker1\",function=\"aten::add\",peer=\"worker0\"} 4\n"))
      << text;
  EXPECT_TRUE(testing::contains(text, "drpc_rref_owners{worker=\"worker1\"} 1\n")) << text;
}

TEST(Observability, ProfilerTracesACallChainAcrossThreeWorkers) {
  Job job(3);
  job[0].rpc_sync("worker1", "obs.chain", {at::ones({4})});  // warm up, not recorded
  std::string json;
  {
    Profiler profiler(job[0]);
    EXPECT_EQ(testing::expect_error([&] { Profiler second(job[0]); }).kind(), ErrorKind::kBadArgument);
    EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "obs.chain", {at::ones({4})}).toTensor(), at::full({4}, 3.0)));
    json = profiler.chrome_trace();
    EXPECT_EQ(profiler.events().size(), 12u);
    // After it stopped: nothing more is recorded.
    job[0].rpc_sync("worker1", "obs.chain", {at::ones({4})});
    EXPECT_EQ(profiler.events().size(), 12u);
    const Error e = testing::expect_error([&] { profiler.write_chrome_trace("/nonexistent-dir/trace.json"); });
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    EXPECT_TRUE(testing::contains(e.what(), "/nonexistent-dir/trace.json")) << e.what();
  }
  testing::check_chain_trace(json);
  Profiler again(job[0]);  // the first one is gone: a new one may start
  EXPECT_TRUE(again.events().empty());
}

}  // namespace
}  // namespace drpc
