// The RPC layer end to end with workers as threads of this process, each with its own
// real gRPC process group on loopback.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "drpc.h"
#include "rpc/profiler.h"
#include "process_group/in_memory_store.h"
#include "testing/errors.h"
#include "tests/job.h"

namespace drpc {
namespace {

using testing::Gate;
using testing::Job;

using testing::contains;
using testing::expect_error;

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Set by the test on its thread, read by handlers on the workers': atomic.
std::atomic<Gate*> g_gate{nullptr};

DRPC_REGISTER_FUNCTION("test.scale", [](at::Tensor t, double s) { return t * s; });
DRPC_REGISTER_FUNCTION("test.concat", [](std::string a, int64_t b) { return a + std::to_string(b); });
DRPC_REGISTER_FUNCTION("test.nothing", []() {});
DRPC_REGISTER_FUNCTION("test.repeat", [](int64_t n) { return std::string(static_cast<size_t>(n), 'x'); });
DRPC_REGISTER_FUNCTION("test.fail", [](std::string why) -> int64_t { throw std::runtime_error(why); });
DRPC_REGISTER_FUNCTION("test.whoami", []() { return current_runtime().get_worker_info().name; });
DRPC_REGISTER_FUNCTION("test.blocked_sum", [](at::Tensor t) {
  g_gate.load()->wait();
  return t.sum();
});
DRPC_REGISTER_FUNCTION("test.blocked", [](int64_t x) {
  g_gate.load()->wait();
  return x;
});
// A -> B -> C: each hop adds its rank and passes on to the next name in `route`.
DRPC_REGISTER_FUNCTION("test.relay", [](std::vector<std::string> route, at::Tensor t) -> at::Tensor {
  at::Tensor mine = t + current_runtime().get_worker_info().id;
  if (route.empty()) return mine;
  std::string next = route.front();
  route.erase(route.begin());
  return current_runtime().rpc_sync(next, "test.relay", {c10::List<std::string>(route), mine}).toTensor();
});
// The same nested call, but without holding a handler thread while it waits.
DRPC_REGISTER_ASYNC_FUNCTION("test.relay_async", [](std::string next, at::Tensor t) {
  return current_runtime()
      .rpc_async(next, "test.scale", {t, 10.0})
      ->then([](c10::ivalue::Future& f) { return c10::IValue(f.value().toTensor() + 1); }, c10::AnyType::get());
});

// Every case runs on both networks under the same Runtime: real gRPC, and the in-memory
// process group (which must then behave as gRPC does for everything above it).
class RpcTest : public testing::JobOnEveryNetwork<3> {};

TEST_P(RpcTest, WorkerInfos) {
  Job& job = *job_;
  EXPECT_EQ(job[1].get_worker_info().name, "worker1");
  EXPECT_EQ(job[0].get_worker_info("worker2").id, 2);
  ASSERT_EQ(job[0].get_worker_infos().size(), 3u);
  EXPECT_EQ(expect_error([&] { job[0].get_worker_info("nobody"); }).kind(), ErrorKind::kBadArgument);
}

TEST_P(RpcTest, BuiltinOperatorsWithOverloadsKwargsAndDefaults) {
  Job& job = *job_;
  at::Tensor a = at::tensor({1.0, 2.0}), b = at::tensor({10.0, 20.0});
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "aten::add", {a, b}).toTensor(), a + b));
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "aten::add", {a, 3.5}).toTensor(), a + 3.5));  // Scalar overload
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "aten::add", {a, b}, {{"alpha", 2}}).toTensor(), a + 2 * b));
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker2", "aten::mul", {a, b}).toTensor(), a * b));
  at::Tensor m = at::arange(6, at::kFloat).reshape({2, 3});
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker2", "aten::matmul", {m, m.t()}).toTensor(), at::matmul(m, m.t())));
  at::Tensor ones = job[0].rpc_sync("worker1", "aten::ones", {c10::List<int64_t>({2, 2})}).toTensor();
  EXPECT_TRUE(at::equal(ones, at::ones({2, 2})));  // dtype, layout, device from the schema's defaults
  at::Tensor ints = job[0].rpc_sync("worker1", "aten::ones", {c10::List<int64_t>({3})}, {{"dtype", int64_t(at::kLong)}})
                        .toTensor();
  EXPECT_EQ(ints.scalar_type(), at::kLong);
  // Several outputs come back as a tuple.
  auto sorted = job[0].rpc_sync("worker1", "aten::sort", {at::tensor({3.0, 1.0, 2.0})}).toTupleRef().elements();
  EXPECT_TRUE(at::equal(sorted[1].toTensor(), at::tensor({1, 2, 0}, at::kLong)));
}

TEST_P(RpcTest, RegisteredFunctionsCheckTheirArguments) {
  Job& job = *job_;
  at::Tensor t = at::arange(4, at::kFloat);
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "test.scale", {t, 2.0}).toTensor(), t * 2));
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "test.scale", {t, int64_t{3}}).toTensor(), t * 3));
  EXPECT_EQ(job[0].rpc_sync("worker2", "test.concat", {std::string("n="), int64_t{5}}).toStringRef(), "n=5");
  EXPECT_TRUE(job[0].rpc_sync("worker2", "test.nothing").isNone());
  Error e = expect_error([&] { job[0].rpc_sync("worker1", "test.scale", {t}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "takes 2 arguments (Tensor, float), 1 given")) << e.what();
  e = expect_error([&] { job[0].rpc_sync("worker1", "test.scale", {std::string("x"), 2.0}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "argument 0 must be Tensor")) << e.what();
  e = expect_error([&] { job[0].rpc_sync("worker1", "aten::add", {std::string("x"), std::string("y"), t}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "no overload of aten::add")) << e.what();
}

// Tensors travel beside a message's header; other values travel in it, up to 16 MiB.
TEST_P(RpcTest, ValuesTooLargeForAHeaderFailTheirCallAtOnceAndTheLinkStays) {
  Job& job = *job_;
  const int64_t too_large = int64_t{17} << 20;
  Error e = expect_error([&] { job[0].rpc_sync("worker1", "test.concat", {std::string(too_large, 'x'), int64_t{1}}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "a frame's header is at most 16777216 bytes")) << e.what();
  // A reply too large to send fails its call with the reason, well before the deadline.
  const auto start = std::chrono::steady_clock::now();
  e = expect_error([&] { job[0].rpc_sync("worker1", "test.repeat", {too_large}, {}, std::chrono::seconds(60)); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument) << e.what();
  EXPECT_TRUE(contains(e.what(), "the reply cannot be sent")) << e.what();
  // Both ends keep working, with values just under the limit.
  EXPECT_EQ(job[0].rpc_sync("worker1", "test.repeat", {int64_t{15} << 20}).toStringRef().size(), size_t{15} << 20);
  EXPECT_EQ(job[1].rpc_sync("worker0", "test.concat", {std::string("n="), int64_t{2}}).toStringRef(), "n=2");
}

TEST_P(RpcTest, UnknownWorkerAndFunction) {
  Job& job = *job_;
  Error e = expect_error([&] { job[0].rpc_sync("worker9", "aten::add"); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "worker9")) << e.what();
  e = expect_error([&] { job[0].rpc_sync("worker1", "no.such.fn"); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "no.such.fn") && contains(e.what(), "worker1")) << e.what();
  e = expect_error([&] { job[0].rpc_sync("worker1", "aten::no_such_op"); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
}

TEST_P(RpcTest, RemoteExceptionsNameTheWorkerAndCarryTheMessage) {
  Job& job = *job_;
  Error e = expect_error([&] { job[0].rpc_sync("worker2", "test.fail", {std::string("the disk is full")}); });
  EXPECT_EQ(e.kind(), ErrorKind::kRemote);
  EXPECT_TRUE(contains(e.what(), "worker2") && contains(e.what(), "the disk is full")) << e.what();
  // A libtorch error inside an operator, too.
  e = expect_error([&] { job[0].rpc_sync("worker1", "aten::matmul", {at::ones({2, 3}), at::ones({2, 3})}); });
  EXPECT_EQ(e.kind(), ErrorKind::kRemote);
  EXPECT_TRUE(contains(e.what(), "worker1")) << e.what();
}

TEST_P(RpcTest, NestedCallsAcrossThreeWorkers) {
  Job& job = *job_;
  at::Tensor t = at::zeros({2});
  // worker0 -> worker1 -> worker2 -> worker0: adds 1, 2, 0.
  at::Tensor out =
      job[0].rpc_sync("worker1", "test.relay", {c10::List<std::string>({"worker2", "worker0"}), t}).toTensor();
  EXPECT_TRUE(at::equal(out, at::full({2}, 3.0)));
  EXPECT_EQ(job[1].rpc_sync("worker1", "test.whoami").toStringRef(), "worker1");  // a call to oneself
  EXPECT_EQ(job[0].rpc_sync("worker2", "test.whoami").toStringRef(), "worker2");
}

TEST_P(RpcTest, AsyncFunctionsAndThenChains) {
  Job& job = *job_;
  at::Tensor t = at::ones({3});
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "test.relay_async", {std::string("worker2"), t}).toTensor(),
                        at::full({3}, 11.0)));
  auto fut = job[0].rpc_async("worker2", "test.scale", {t, 2.0});
  auto chained = fut->then([](c10::ivalue::Future& f) { return c10::IValue(f.value().toTensor() * 5); },
                           c10::AnyType::get())
                     ->then([](c10::ivalue::Future& f) { return c10::IValue(f.value().toTensor().sum()); },
                            c10::AnyType::get());
  chained->wait();
  EXPECT_EQ(chained->value().toTensor().item<double>(), 30.0);
}

TEST_P(RpcTest, ThousandConcurrentCallsAllAnsweredCorrectly) {
  Job& job = *job_;
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 1000; ++i) {
    futures.push_back(job[i % 2].rpc_async(i % 3 == 0 ? "worker2" : "worker1", "aten::add",
                                           {at::full({2}, double(i)), at::full({2}, 1.0)}));
  }
  std::vector<FuturePtr> mine(futures.begin(), futures.end());
  auto values = wait_all(mine);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(at::equal(values[i].toTensor(), at::full({2}, double(i + 1)))) << "call " << i;
  }
}

TEST_P(RpcTest, TimeoutThatFiresAndOneThatDoesNot) {
  Job& job = *job_;
  Gate gate;
  g_gate = &gate;
  const auto start = Clock::now();
  Error e = expect_error([&] { job[0].rpc_sync("worker1", "test.blocked", {int64_t{1}}, {}, milliseconds(200)); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_TRUE(contains(e.what(), "worker1") && contains(e.what(), "test.blocked") && contains(e.what(), "200 ms"))
      << e.what();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  auto slow = job[0].rpc_async("worker1", "test.blocked", {int64_t{2}}, {}, milliseconds(30000));
  gate.wait_for_waiters(2);
  gate.release();
  slow->wait();
  EXPECT_EQ(slow->value().toInt(), 2);  // the late reply of the first call was dropped, not mixed in
  // Zero means no deadline.
  EXPECT_EQ(job[0].rpc_sync("worker1", "test.blocked", {int64_t{3}}, {}, milliseconds(0)).toInt(), 3);
  g_gate = nullptr;
}

TEST_P(RpcTest, TorchScriptModulesLoadedByName) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/double.pt";
  {
    torch::jit::Module m("Doubler");
    m.define(R"(
      def forward(self, x):
          return x * 2
      def add(self, x, y: int):
          return x + y
    )");
    m.save(path);
  }
  Options options;
  options.scripts = {{"doubler", path}};
  Job job(2, options, GetParam());
  at::Tensor t = at::arange(3, at::kFloat);
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "torchscript:doubler", {t}).toTensor(), t * 2));
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "torchscript:doubler:add", {t, int64_t{5}}).toTensor(), t + 5));
  EXPECT_TRUE(
      at::equal(job[0].rpc_sync("worker1", "torchscript:doubler:add", {t}, {{"y", int64_t{1}}}).toTensor(), t + 1));
  Error e = expect_error([&] { job[0].rpc_sync("worker1", "torchscript:other", {t}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  e = expect_error([&] { job[0].rpc_sync("worker1", "torchscript:doubler:nope", {t}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  job.shutdown(true);
}

// A `then` callback may make RPCs and wait on other futures: it runs on a callback thread,
// not on the network thread whose reply it would be waiting for. (The calls are held on a
// gate until their callbacks are attached: a callback attached to a future that already
// completed runs at once on the attaching thread.)
TEST_P(RpcTest, CallbacksMayMakeRpcsAndWaitOnFutures) {
  Job& job = *job_;
  Gate gate;
  g_gate = &gate;
  auto first = job[0].rpc_async("worker1", "test.blocked_sum", {at::ones({2})});
  RRef ones = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({2})});
  auto proxied = ones.rpc_async("test.blocked_sum");  // the function, with the value first
  gate.wait_for_waiters(2);
  std::string thread, proxy_thread;
  auto chained = first->then(
      [&](c10::ivalue::Future& done) {
        thread = current_thread_name();
        at::Tensor sum = done.value().toTensor();
        // A synchronous call and a wait on an asynchronous one, inside the callback.
        at::Tensor doubled = job[0].rpc_sync("worker1", "aten::mul", {sum, 2.0}, {}, milliseconds(10000)).toTensor();
        auto more = job[0].rpc_async("worker2", "aten::add", {doubled, 1.0}, {}, milliseconds(10000));
        more->wait();
        return c10::IValue(more->value().toTensor());
      },
      c10::AnyType::get());
  auto through_rref = proxied->then(
      [&](c10::ivalue::Future& done) {
        proxy_thread = current_thread_name();
        return c10::IValue(job[0].rpc_sync("worker2", "aten::mul", {done.value().toTensor(), 3.0}).toTensor());
      },
      c10::AnyType::get());
  gate.release();
  chained->wait();
  through_rref->wait();
  g_gate = nullptr;
  ASSERT_FALSE(chained->hasError()) << chained->tryRetrieveErrorMessage();
  EXPECT_EQ(chained->value().toTensor().item<double>(), 5.0);
  EXPECT_EQ(thread, "callback");
  ASSERT_FALSE(through_rref->hasError()) << through_rref->tryRetrieveErrorMessage();
  EXPECT_EQ(through_rref->value().toTensor().item<double>(), 6.0);
  EXPECT_EQ(proxy_thread, "callback");
  // Many callbacks that block at once do not hold each other up.
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 8; ++i) {
    futures.push_back(job[1].rpc_async("worker2", "aten::neg", {at::full({1}, double(i))})->then(
        [&job, i](c10::ivalue::Future& done) {
          return c10::IValue(job[1].rpc_sync("worker0", "aten::neg", {done.value().toTensor()}).toTensor());
        },
        c10::AnyType::get()));
  }
  auto values = wait_all(futures);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(values[i].toTensor().item<double>(), double(i));
}

TEST_P(RpcTest, WaitAllRaisesTheFirstErrorWithoutWaitingForTheRest) {
  Job& job = *job_;
  Gate gate;
  g_gate = &gate;
  auto blocked = job[0].rpc_async("worker1", "test.blocked", {int64_t{3}});
  auto failing = job[0].rpc_async("worker2", "test.fail", {std::string("early failure")});
  gate.wait_for_waiters(1);
  Error e = expect_error([&] { wait_all({blocked, failing}); });
  EXPECT_EQ(e.kind(), ErrorKind::kRemote);
  EXPECT_TRUE(contains(e.what(), "early failure")) << e.what();
  EXPECT_FALSE(blocked->completed());  // still running when wait_all returned
  gate.release();
  blocked->wait();
  EXPECT_EQ(blocked->value().toInt(), 3);
  g_gate = nullptr;
}

// As torch's _set_rpc_timeout: the default applies to calls made after it changes; calls
// already made keep the deadline they had.
TEST(RpcJob, TheDefaultTimeoutCanChangeAfterInit) {
  Job job(2);
  Gate gate;
  g_gate = &gate;
  EXPECT_EQ(job[0].rpc_timeout(), milliseconds(60000));
  auto before = job[0].rpc_async("worker1", "test.blocked", {int64_t{1}});  // 60 s
  job[0].set_rpc_timeout(milliseconds(150));
  EXPECT_EQ(job[0].rpc_timeout(), milliseconds(150));
  auto after = job[0].rpc_async("worker1", "test.blocked", {int64_t{2}});
  Error e = expect_error([&] {
    after->wait();
    after->value();
  });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_TRUE(contains(e.what(), "150 ms")) << e.what();
  EXPECT_FALSE(before->completed());  // its own 60 s deadline still runs
  EXPECT_EQ(expect_error([&] { job[0].remote("worker1", "test.blocked", {int64_t{4}}).to_here(); }).kind(),
            ErrorKind::kTimeout);
  EXPECT_EQ(expect_error([&] { job[0].set_rpc_timeout(milliseconds(-5)); }).kind(), ErrorKind::kBadArgument);
  job[0].set_rpc_timeout(milliseconds(0));  // none
  auto unbounded = job[0].rpc_async("worker1", "test.blocked", {int64_t{5}});
  gate.release();
  before->wait();
  unbounded->wait();
  EXPECT_EQ(before->value().toInt(), 1);
  EXPECT_EQ(unbounded->value().toInt(), 5);
  job.shutdown(true);
  g_gate = nullptr;
}

// The default runtime's objects may outlive drpc::shutdown(): destroying them afterwards
// finds the runtime stopped (kShutdown), not freed (AddressSanitizer saw a use after free).
TEST(DefaultRuntime, ObjectsMadeOnItMayOutliveShutdown) {
  auto store = create_in_memory_store();
  Options options;
  options.store = store.get();
  init_rpc("solo", 0, 1, options);
  RRef param = RRef::make_local(c10::IValue(at::ones({2}).set_requires_grad(true)));
  auto optimizer = std::make_unique<DistributedOptimizer>(optim::sgd(0.1), std::vector<RRef>{param});
  auto context = std::make_unique<dist_autograd::Context>();
  shutdown();
  context.reset();
  optimizer.reset();
  param = RRef();
  EXPECT_EQ(expect_error([&] { rpc_sync("solo", "aten::neg", {at::ones({1})}); }).kind(), ErrorKind::kShutdown);
}

TEST(RpcJob, ANegativeSharedMemoryArenaIsRefused) {
  auto store = create_in_memory_store();
  Options options;
  options.store = store.get();
  options.shm_arena_mb = -1;
  Error e = expect_error([&] { Runtime::create("solo", 0, 1, options); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "shm_arena_mb")) << e.what();
}

TEST(RpcJob, InvalidAndDuplicateNames) {
  auto store = create_in_memory_store();
  Options options;
  options.store = store.get();
  options.init_timeout = milliseconds(2000);
  EXPECT_EQ(expect_error([&] { Runtime::create("bad name!", 0, 1, options); }).kind(), ErrorKind::kBadArgument);
  EXPECT_EQ(expect_error([&] { Runtime::create(std::string(200, 'a'), 0, 1, options); }).kind(),
            ErrorKind::kBadArgument);
  std::unique_ptr<Runtime> other;
  std::thread t([&] {
    try {
      other = Runtime::create("twin", 1, 2, options);
    } catch (const Error&) {
    }
  });
  Error e = expect_error([&] { Runtime::create("twin", 0, 2, options); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "twin")) << e.what();
  t.join();
}

TEST(RpcJob, GracefulShutdownLetsCallsInFlightComplete) {
  Job job(2);
  Gate gate;
  g_gate = &gate;
  auto a = job[0].rpc_async("worker1", "test.blocked", {int64_t{7}});
  auto b = job[1].rpc_async("worker0", "test.blocked", {int64_t{8}});
  gate.wait_for_waiters(2);
  std::thread releaser([&] {
    gate.release();
  });
  job.shutdown(true);  // waits for both calls, then stops
  releaser.join();
  ASSERT_TRUE(a->completed() && b->completed());
  EXPECT_EQ(a->value().toInt(), 7);
  EXPECT_EQ(b->value().toInt(), 8);
  EXPECT_EQ(expect_error([&] { job[0].rpc_sync("worker1", "test.nothing"); }).kind(), ErrorKind::kShutdown);
  g_gate = nullptr;
}

TEST(RpcJob, UngracefulShutdownFailsPendingCalls) {
  Job job(2);
  Gate gate;
  g_gate = &gate;
  auto pending = job[0].rpc_async("worker1", "test.blocked", {int64_t{1}});
  gate.wait_for_waiters(1);
  job[0].shutdown(false);
  pending->wait();
  ASSERT_TRUE(pending->hasError());
  EXPECT_EQ(expect_error([&] { pending->value(); }).kind(), ErrorKind::kShutdown);
  gate.release();
  g_gate = nullptr;
}

TEST(RpcJob, BlockedHandlersDoNotDeadlockAsyncFunctions) {
  // One handler thread per worker: a synchronous nested call would hold it; the async
  // function frees it while the nested call is out.
  Options options;
  options.num_worker_threads = 1;
  Job job(2, options);
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 20; ++i) {
    futures.push_back(job[i % 2].rpc_async(i % 2 ? "worker0" : "worker1", "test.relay_async",
                                           {std::string(i % 2 ? "worker1" : "worker0"), at::ones({1})}));
  }
  for (auto& v : wait_all(futures)) EXPECT_EQ(v.toTensor().item<double>(), 11.0);
}

TEST(RpcJob, SmallBuiltinCallsAreAnsweredWhileEveryHandlerThreadIsBusy) {
  Options options;
  options.num_worker_threads = 1;
  Job job(2, options);
  Gate gate;
  g_gate = &gate;
  auto blocked = job[0].rpc_async("worker1", "test.blocked", {int64_t{7}});
  gate.wait_for_waiters(1);  // worker1's only handler thread is held
  // A builtin operator on small tensors is served on the thread that received it.
  const at::Tensor a = at::ones({4});
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "aten::add", {a, a}).toTensor(), a * 2));
  // Large tensors, a registered function and a factory (its output's size is an argument)
  // wait for a handler thread.
  const at::Tensor big = at::ones({1 << 15});  // 128 KiB
  auto large = job[0].rpc_async("worker1", "aten::add", {big, big});
  auto registered = job[0].rpc_async("worker1", "test.scale", {a, 2.0});
  auto factory = job[0].rpc_async("worker1", "aten::ones", {c10::List<int64_t>({2})});
  // This one arrives after them (frames to a peer keep their order) and is answered first.
  EXPECT_TRUE(at::equal(job[0].rpc_sync("worker1", "aten::mul", {a, a}).toTensor(), a));
  EXPECT_FALSE(large->completed());
  EXPECT_FALSE(registered->completed());
  EXPECT_FALSE(factory->completed());
  EXPECT_FALSE(blocked->completed());
  gate.release();
  blocked->wait();
  EXPECT_EQ(blocked->value().toInt(), 7);
  large->wait();
  EXPECT_TRUE(at::equal(large->value().toTensor(), big * 2));
  registered->wait();
  EXPECT_TRUE(at::equal(registered->value().toTensor(), a * 2));
  factory->wait();
  EXPECT_TRUE(at::equal(factory->value().toTensor(), at::ones({2})));
  g_gate = nullptr;
}

DRPC_ON_EVERY_NETWORK(RpcTest);

}  // namespace
}  // namespace drpc
