// Distributed autograd against local autograd, numerically: the same computation run in
// one process and split across workers (threads of this process over real gRPC) must
// give the same gradients.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "drpc.h"
#include "testing/errors.h"
#include "tests/job.h"

namespace drpc {
namespace {

using testing::Job;

DRPC_REGISTER_FUNCTION("ag.affine", [](at::Tensor x, double a) { return x * a + x.sin(); });
// Applies affine(x, 2) here, then hands on along `route`.
DRPC_REGISTER_FUNCTION("ag.relay", [](std::vector<std::string> route, at::Tensor x) -> at::Tensor {
  at::Tensor y = x * 2 + x.sin();
  if (route.empty()) return y;
  std::string next = route.front();
  route.erase(route.begin());
  return current_runtime().rpc_sync(next, "ag.relay", {c10::List<std::string>(route), y}).toTensor();
});

// A layer whose weight lives on its owner: y = tanh(w * x).
DRPC_REGISTER_FUNCTION("ag.layer", [](at::Tensor w, at::Tensor x) { return (w * x).tanh(); });
DRPC_REGISTER_FUNCTION("ag.make_weight", [](int64_t seed) {
  return RRef::make_local(at::randn({4}, at::detail::createCPUGenerator(seed)).set_requires_grad(true)).to_ivalue();
});
// An RRef to the one weight of `seed` on this process's owner: every caller's RRef
// refers to the same tensor (the runtimes of a test job share the process).
DRPC_REGISTER_FUNCTION("ag.shared_weight", [](int64_t seed) {
  static std::mutex mu;
  static auto* weights = new std::map<int64_t, at::Tensor>();  // never freed: outlives libtorch's teardown
  std::lock_guard<std::mutex> lock(mu);
  auto& w = (*weights)[seed];
  if (!w.defined()) w = at::randn({4}, at::detail::createCPUGenerator(seed)).set_requires_grad(true);
  return RRef::make_local(w).to_ivalue();
});
DRPC_REGISTER_FUNCTION("ag.throw_in_backward", [](at::Tensor x) {
  // Differentiable forward whose backward raises: a hook on the result's gradient.
  at::Tensor y = x * 3;
  y.register_hook([](at::Tensor) -> at::Tensor { throw std::runtime_error("backward exploded"); });
  return y;
});

// Fetches an RRef's value here (an RPC of its own) and applies affine(value, a).
DRPC_REGISTER_FUNCTION("ag.fetch_affine", [](c10::IValue rref, double a) {
  at::Tensor v = RRef::from_ivalue(rref).to_here().toTensor();
  return v * a + v.sin();
});
// For RRef method calls on a weight: relays w * x along `route`.
DRPC_REGISTER_FUNCTION("ag.weighted_relay", [](at::Tensor w, std::vector<std::string> route, at::Tensor x) {
  at::Tensor y = w * x;
  if (route.empty()) return y;
  std::string next = route.front();
  route.erase(route.begin());
  return current_runtime().rpc_sync(next, "ag.relay", {c10::List<std::string>(route), y}).toTensor();
});

at::Tensor local_affine(const at::Tensor& x, double a) { return x * a + x.sin(); }
// What ag.relay computes over a route of `hops - 1` workers.
at::Tensor local_relay(at::Tensor x, int hops) {
  for (int i = 0; i < hops; ++i) x = x * 2 + x.sin();
  return x;
}

at::Tensor leaf(int64_t seed) {
  return at::randn({5}, at::detail::createCPUGenerator(seed)).set_requires_grad(true);
}

at::Tensor grad_of(const c10::Dict<at::Tensor, at::Tensor>& grads, const at::Tensor& t) {
  auto it = grads.find(t);
  return it == grads.end() ? at::Tensor() : it->value();
}

// Whether `held` turns false on every worker of `job` within 30 s. A context's creator
// releases it without waiting for the others, so they let go of it a moment later.
bool released_everywhere(Job& job, const std::function<bool(Runtime&)>& held) {
  return testing::eventually(
      [&] {
        for (int r = 0; r < job.size(); ++r) {
          if (held(job[r])) return false;
        }
        return true;
      },
      std::chrono::seconds(30));
}

class DistAutogradTest : public testing::JobOnEveryNetwork<3> {
 protected:
  // Every test leaves no context behind on any worker.
  void TearDown() override {
    released_everywhere(*job_, [](Runtime& w) { return w.autograd().num_contexts() > 0; });
    for (int r = 0; r < job_->size(); ++r) {
      EXPECT_EQ((*job_)[r].autograd().num_contexts(), 0) << "worker" << r;
    }
  }
};

TEST_P(DistAutogradTest, ChainAcrossTwoWorkersMatchesLocal) {
  Job& job = *job_;
  at::Tensor x = leaf(1);
  at::Tensor local_grad;
  {
    at::Tensor x2 = x.detach().clone().set_requires_grad(true);
    local_affine(local_affine(x2, 3.0), 0.5).pow(2).sum().backward();
    local_grad = x2.grad();
  }
  dist_autograd::Context ctx(job[0]);
  at::Tensor y = job[0].rpc_sync("worker1", "ag.affine", {x, 3.0}).toTensor();
  EXPECT_TRUE(y.requires_grad());
  at::Tensor loss = local_affine(y, 0.5).pow(2).sum();
  job[0].autograd().backward(ctx.id(), {loss}, false);
  auto grads = job[0].autograd().gradients(ctx.id());
  ASSERT_TRUE(grad_of(grads, x).defined());
  EXPECT_TRUE(at::allclose(grad_of(grads, x), local_grad, 1e-5, 1e-6));
  EXPECT_FALSE(x.grad().defined());  // gradients go to the context, not to .grad
}

TEST_P(DistAutogradTest, ThreeHopCycleMatchesLocal) {
  Job& job = *job_;
  at::Tensor x = leaf(2);
  at::Tensor x2 = x.detach().clone().set_requires_grad(true);
  at::Tensor l = x2;
  for (int i = 0; i < 3; ++i) l = l * 2 + l.sin();
  l.sum().backward();
  dist_autograd::Context ctx(job[0]);
  // worker0 -> worker1 -> worker2 -> worker0 (back to this worker, inside the call)
  at::Tensor y =
      job[0].rpc_sync("worker1", "ag.relay", {c10::List<std::string>({"worker2", "worker0"}), x}).toTensor();
  job[0].autograd().backward(ctx.id(), {y.sum()}, false);
  EXPECT_TRUE(at::allclose(grad_of(job[0].autograd().gradients(ctx.id()), x), x2.grad(), 1e-5, 1e-6));
}

TEST_P(DistAutogradTest, DiamondAndATensorSentTwice) {
  Job& job = *job_;
  at::Tensor x = leaf(3);
  at::Tensor x2 = x.detach().clone().set_requires_grad(true);
  (local_affine(x2, 2.0) * local_affine(x2, -1.0) + local_affine(x2, 4.0)).sum().backward();
  dist_autograd::Context ctx(job[0]);
  at::Tensor a = job[0].rpc_sync("worker1", "ag.affine", {x, 2.0}).toTensor();
  at::Tensor b = job[0].rpc_sync("worker2", "ag.affine", {x, -1.0}).toTensor();
  at::Tensor c = job[0].rpc_sync("worker1", "ag.affine", {x, 4.0}).toTensor();  // x to worker1 again
  job[0].autograd().backward(ctx.id(), {(a * b + c).sum()}, false);
  EXPECT_TRUE(at::allclose(grad_of(job[0].autograd().gradients(ctx.id()), x), x2.grad(), 1e-5, 1e-6));
}

TEST_P(DistAutogradTest, RetainGraphAllowsASecondBackwardThatAccumulates) {
  Job& job = *job_;
  at::Tensor x = leaf(4);
  dist_autograd::Context ctx(job[0]);
  at::Tensor loss = job[0].rpc_sync("worker2", "ag.affine", {x, 3.0}).toTensor().sum();
  job[0].autograd().backward(ctx.id(), {loss}, true);
  at::Tensor once = grad_of(job[0].autograd().gradients(ctx.id()), x).clone();
  job[0].autograd().backward(ctx.id(), {loss}, false);
  EXPECT_TRUE(at::allclose(grad_of(job[0].autograd().gradients(ctx.id()), x), once * 2, 1e-5, 1e-6));
}

TEST_P(DistAutogradTest, ConcurrentContextsDoNotMix) {
  Job& job = *job_;
  at::Tensor x = leaf(5);
  dist_autograd::Context outer(job[0]);
  const int64_t first = outer.id();
  at::Tensor y1 = job[0].rpc_sync("worker1", "ag.affine", {x, 1.0}).toTensor();
  std::thread([&] {  // a thread has one context at a time: the second lives on another
    dist_autograd::Context inner(job[0]);
    at::Tensor y2 = job[0].rpc_sync("worker1", "ag.affine", {x, 5.0}).toTensor();
    job[0].autograd().backward(inner.id(), {y2.sum()}, false);
    at::Tensor expected = (5.0 + x.detach().cos());
    EXPECT_TRUE(at::allclose(grad_of(job[0].autograd().gradients(inner.id()), x), expected, 1e-5, 1e-6));
  }).join();
  job[0].autograd().backward(first, {y1.sum()}, false);
  EXPECT_TRUE(at::allclose(grad_of(job[0].autograd().gradients(first), x), 1.0 + x.detach().cos(), 1e-5, 1e-6));
}

TEST_P(DistAutogradTest, ContextsAreReleasedEverywhere) {
  Job& job = *job_;
  int64_t id;
  {
    dist_autograd::Context ctx(job[0]);
    id = ctx.id();
    EXPECT_EQ(id >> 48, 0);  // the creator's id in the high bits
    at::Tensor y = job[0].rpc_sync("worker1", "ag.relay", {c10::List<std::string>({"worker2"}), leaf(6)}).toTensor();
    job[0].autograd().backward(id, {y.sum()}, false);
    EXPECT_TRUE(job[1].autograd().has_context(id));
    EXPECT_TRUE(job[2].autograd().has_context(id));  // reached through worker1
  }
  EXPECT_FALSE(job[0].autograd().has_context(id));  // the creator's at once
  EXPECT_TRUE(released_everywhere(job, [id](Runtime& w) { return w.autograd().has_context(id); }));
  // An explicit release's future completes once every worker, worker2 through worker1, let go.
  {
    dist_autograd::Context ctx(job[0]);
    id = ctx.id();
    at::Tensor y = job[0].rpc_sync("worker1", "ag.relay", {c10::List<std::string>({"worker2"}), leaf(6)}).toTensor();
    job[0].autograd().backward(id, {y.sum()}, false);
    FuturePtr released = job[0].autograd().release(id);
    released->wait();
    EXPECT_FALSE(released->hasError());
    for (int r = 0; r < 3; ++r) EXPECT_FALSE(job[r].autograd().has_context(id)) << "worker" << r;
  }
}

TEST_P(DistAutogradTest, BadRootsAndRemoteBackwardErrors) {
  Job& job = *job_;
  dist_autograd::Context ctx(job[0]);
  at::Tensor y = job[0].rpc_sync("worker1", "ag.affine", {leaf(7), 1.0}).toTensor();
  Error e = testing::expect_error([&] { job[0].autograd().backward(ctx.id(), {y}, false); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(testing::contains(e.what(), "scalar")) << e.what();
  e = testing::expect_error([&] { job[0].autograd().backward(ctx.id() + 99, {y.sum()}, false); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
}

TEST_P(DistAutogradTest, ASecondContextOnTheSameThreadIsRefused) {
  Job& job = *job_;
  dist_autograd::Context outer(job[0]);
  Error e = testing::expect_error([&] { dist_autograd::Context inner(job[0]); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(testing::contains(e.what(), "already has an autograd context")) << e.what();
  // The refused context was never made, and the outer one is still the thread's.
  EXPECT_EQ(job[0].autograd().num_contexts(), 1);
  EXPECT_EQ(job[0].autograd().current_context(), outer.id());
}

TEST_P(DistAutogradTest, BackwardWithoutRootsOrFromALeafIsRefused) {
  Job& job = *job_;
  dist_autograd::Context ctx(job[0]);
  Error e = testing::expect_error([&] { job[0].autograd().backward(ctx.id(), {}, false); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(testing::contains(e.what(), "no roots")) << e.what();
  at::Tensor scalar_leaf = at::ones({}).set_requires_grad(true);
  e = testing::expect_error([&] { job[0].autograd().backward(ctx.id(), {scalar_leaf}, false); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(testing::contains(e.what(), "leaf")) << e.what();
  EXPECT_TRUE(job[0].autograd().gradients(ctx.id()).empty());
}

// A call to the calling worker itself skips the network; it must still be recorded.
TEST_P(DistAutogradTest, CallsAndRemotesToOneselfAreRecorded) {
  Job& job = *job_;
  at::Tensor x = leaf(50);
  at::Tensor xl = x.detach().clone().set_requires_grad(true);
  (local_affine(xl, 3.0) * local_affine(xl, -2.0) + local_affine(xl, 0.5) + local_relay(xl, 2)).sum().backward();
  dist_autograd::Context ctx(job[0]);
  at::Tensor a = job[0].rpc_sync("worker0", "ag.affine", {x, 3.0}).toTensor();
  FuturePtr fb = job[0].rpc_async("worker0", "ag.affine", {x, -2.0});
  fb->wait();
  at::Tensor b = fb->value().toTensor();
  at::Tensor c = job[0].remote("worker0", "ag.affine", {x, 0.5}).to_here().toTensor();
  // Nested: worker0 serves a relay that calls worker0 again.
  at::Tensor d = job[0].rpc_sync("worker0", "ag.relay", {c10::List<std::string>({"worker0"}), x}).toTensor();
  EXPECT_TRUE(a.requires_grad());
  EXPECT_TRUE(b.requires_grad());
  EXPECT_TRUE(c.requires_grad());
  EXPECT_TRUE(d.requires_grad());
  job[0].autograd().backward(ctx.id(), {(a * b + c + d).sum()}, false);
  at::Tensor g = grad_of(job[0].autograd().gradients(ctx.id()), x);
  ASSERT_TRUE(g.defined());
  EXPECT_TRUE(at::allclose(g, xl.grad(), 1e-5, 1e-6));
}

TEST_P(DistAutogradTest, ToHereOfARemoteBuiltinGivesBothInputsTheirGradients) {
  Job& job = *job_;
  at::Tensor x = leaf(51), w = leaf(52);
  dist_autograd::Context ctx(job[0]);
  RRef r = job[0].remote("worker1", "aten::mul", {x, w});
  at::Tensor y = r.to_here().toTensor();
  ASSERT_TRUE(y.requires_grad());
  job[0].autograd().backward(ctx.id(), {y.sum()}, false);
  auto grads = job[0].autograd().gradients(ctx.id());
  ASSERT_TRUE(grad_of(grads, x).defined());
  ASSERT_TRUE(grad_of(grads, w).defined());
  EXPECT_TRUE(at::allclose(grad_of(grads, x), w.detach(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(grad_of(grads, w), x.detach(), 1e-5, 1e-6));
}

// worker0 -> worker1 -> worker2 -> worker1: the function's own calls, two deep, belong to
// the caller's context however the first call was made.
TEST_P(DistAutogradTest, NestedCallsTwoDeepMatchLocalForRpcSyncRpcAsyncAndRemote) {
  Job& job = *job_;
  const c10::List<std::string> route({"worker2", "worker1"});
  for (const std::string how : {"rpc_sync", "rpc_async", "remote"}) {
    at::Tensor x = leaf(53);
    at::Tensor xl = x.detach().clone().set_requires_grad(true);
    local_relay(xl, 3).pow(2).sum().backward();
    dist_autograd::Context ctx(job[0]);
    at::Tensor y;
    if (how == "rpc_sync") {
      y = job[0].rpc_sync("worker1", "ag.relay", {route, x}).toTensor();
    } else if (how == "rpc_async") {
      FuturePtr f = job[0].rpc_async("worker1", "ag.relay", {route, x});
      f->wait();
      y = f->value().toTensor();
    } else {
      y = job[0].remote("worker1", "ag.relay", {route, x}).to_here().toTensor();
    }
    ASSERT_TRUE(y.requires_grad()) << how;
    job[0].autograd().backward(ctx.id(), {y.pow(2).sum()}, false);
    at::Tensor g = grad_of(job[0].autograd().gradients(ctx.id()), x);
    ASSERT_TRUE(g.defined()) << how;
    EXPECT_TRUE(at::allclose(g, xl.grad(), 1e-5, 1e-6)) << how;
  }
}

// worker0 has worker2 create a value (which calls worker1), then worker1 fetches it from
// worker2 and computes on it: every hop is in worker0's context.
TEST_P(DistAutogradTest, AnRRefOwnedByAThirdWorkerMatchesLocal) {
  Job& job = *job_;
  at::Tensor x = leaf(54);
  at::Tensor xl = x.detach().clone().set_requires_grad(true);
  local_affine(local_relay(xl, 2), 3.0).sum().backward();
  dist_autograd::Context ctx(job[0]);
  RRef r = job[0].remote("worker2", "ag.relay", {c10::List<std::string>({"worker1"}), x});
  at::Tensor y = job[0].rpc_sync("worker1", "ag.fetch_affine", {r.to_ivalue(), 3.0}).toTensor();
  ASSERT_TRUE(y.requires_grad());
  job[0].autograd().backward(ctx.id(), {y.sum()}, false);
  at::Tensor g = grad_of(job[0].autograd().gradients(ctx.id()), x);
  ASSERT_TRUE(g.defined());
  EXPECT_TRUE(at::allclose(g, xl.grad(), 1e-5, 1e-6));
}

// Methods called on an RRef (rpc_sync and remote on its owner) run inside the caller's
// context too: the owner's weight and the caller's input both get their gradients.
TEST_P(DistAutogradTest, RRefMethodCallsWithNestedCallsMatchLocal) {
  Job& job = *job_;
  RRef rw = RRef::from_ivalue(job[0].rpc_sync("worker1", "ag.make_weight", {int64_t{55}}));
  at::Tensor w_value = rw.to_here().toTensor();
  const c10::List<std::string> route({"worker2"});
  for (const std::string how : {"rpc_sync", "remote"}) {
    at::Tensor x = at::randn({4}, at::detail::createCPUGenerator(56)).set_requires_grad(true);
    at::Tensor wl = w_value.clone().set_requires_grad(true);
    at::Tensor xl = x.detach().clone().set_requires_grad(true);
    local_relay(wl * xl, 1).sum().backward();
    dist_autograd::Context ctx(job[0]);
    at::Tensor y = how == "rpc_sync" ? rw.rpc_sync("ag.weighted_relay", {route, x}).toTensor()
                                     : rw.remote("ag.weighted_relay", {route, x}).to_here().toTensor();
    ASSERT_TRUE(y.requires_grad()) << how;
    job[0].autograd().backward(ctx.id(), {y.sum()}, false);
    at::Tensor gx = grad_of(job[0].autograd().gradients(ctx.id()), x);
    ASSERT_TRUE(gx.defined()) << how;
    EXPECT_TRUE(at::allclose(gx, xl.grad(), 1e-5, 1e-6)) << how;
    auto owner_grads = job[1].autograd().gradients(ctx.id());
    ASSERT_EQ(owner_grads.size(), 1u) << how;
    EXPECT_TRUE(at::allclose(owner_grads.begin()->value(), wl.grad(), 1e-5, 1e-6)) << how;
  }
}

TEST_P(DistAutogradTest, DistributedOptimizerMatchesLocalTrainingFor20Steps) {
  Job& job = *job_;
  for (const auto& spec : {optim::sgd(0.1, 0.9), optim::adam(0.05)}) {
    // The same two-layer model trained locally...
    at::Tensor w1 = at::randn({4}, at::detail::createCPUGenerator(11)).set_requires_grad(true);
    at::Tensor w2 = at::randn({4}, at::detail::createCPUGenerator(12)).set_requires_grad(true);
    at::Tensor x = at::linspace(-1, 1, 4), target = at::full({4}, 0.3);
    std::unique_ptr<torch::optim::Optimizer> local;
    if (spec.kind == "sgd") {
      local = std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{w1, w2},
                                                  torch::optim::SGDOptions(spec.lr).momentum(spec.momentum));
    } else {
      local = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{w1, w2}, torch::optim::AdamOptions(spec.lr));
    }
    for (int step = 0; step < 20; ++step) {
      local->zero_grad();
      ((w2 * (w1 * x).tanh()).tanh() - target).pow(2).sum().backward();
      local->step();
    }
    // ...and split: the weights on worker1 and worker2 behind RRefs, the data on worker0.
    RRef r1 = RRef::from_ivalue(job[0].rpc_sync("worker1", "ag.make_weight", {int64_t{11}}));
    RRef r2 = RRef::from_ivalue(job[0].rpc_sync("worker2", "ag.make_weight", {int64_t{12}}));
    DistributedOptimizer opt(job[0], spec, {r1, r2});
    for (int step = 0; step < 20; ++step) {
      dist_autograd::Context ctx(job[0]);
      at::Tensor h = r1.rpc_sync("ag.layer", {x}).toTensor();
      at::Tensor y = r2.rpc_sync("ag.layer", {h}).toTensor();
      job[0].autograd().backward(ctx.id(), {(y - target).pow(2).sum()}, false);
      opt.step(ctx.id());
    }
    EXPECT_TRUE(at::allclose(r1.to_here().toTensor(), w1.detach(), 1e-5, 1e-5)) << spec.kind;
    EXPECT_TRUE(at::allclose(r2.to_here().toTensor(), w2.detach(), 1e-5, 1e-5)) << spec.kind;
  }
}

TEST_P(DistAutogradTest, OwnerSideGraphWithParameterAndReceivedInput) {
  // On worker2 the graph holds both a leaf (its weight) and a received tensor: each must
  // get its own gradient.
  Job& job = *job_;
  at::Tensor w = at::randn({4}, at::detail::createCPUGenerator(21)).set_requires_grad(true);
  at::Tensor x = at::randn({4}, at::detail::createCPUGenerator(22)).set_requires_grad(true);
  at::Tensor x2 = x.detach().clone().set_requires_grad(true);
  (w * x2).tanh().pow(2).sum().backward();
  RRef rw = RRef::from_ivalue(job[0].rpc_sync("worker2", "ag.make_weight", {int64_t{21}}));
  dist_autograd::Context ctx(job[0]);
  at::Tensor y = rw.rpc_sync("ag.layer", {x}).toTensor();
  job[0].autograd().backward(ctx.id(), {y.pow(2).sum()}, false);
  EXPECT_TRUE(at::allclose(grad_of(job[0].autograd().gradients(ctx.id()), x), x2.grad(), 1e-5, 1e-6));
  auto owner_grads = job[2].autograd().gradients(ctx.id());
  ASSERT_EQ(owner_grads.size(), 1u);
  EXPECT_TRUE(at::allclose(owner_grads.begin()->value(), w.grad(), 1e-5, 1e-6));
}

TEST_P(DistAutogradTest, TwoConcurrentContextsOnOneParameterServer) {
  Job& job = *job_;
  // Each trainer's RRef belongs to its own worker; both refer to one tensor on worker2.
  std::vector<RRef> w;
  for (int t = 0; t < 2; ++t) w.push_back(RRef::from_ivalue(job[t].rpc_sync("worker2", "ag.shared_weight", {int64_t{40}})));
  at::Tensor w_value = w[0].to_here().toTensor();
  ASSERT_TRUE(at::equal(w[1].to_here().toTensor(), w_value));
  std::vector<at::Tensor> inputs = {at::full({4}, 0.5), at::full({4}, -2.0)};
  std::vector<at::Tensor> owner_grads(2);
  std::vector<std::thread> trainers;
  for (int t = 0; t < 2; ++t) {
    trainers.emplace_back([&, t] {
      dist_autograd::Context ctx(job[t]);  // trainers on worker0 and worker1 at once
      for (int i = 0; i < 5; ++i) {
        at::Tensor y = w[t].rpc_sync("ag.layer", {inputs[t]}).toTensor();
        job[t].autograd().backward(ctx.id(), {y.sum()}, false);
      }
      owner_grads[t] = job[2].autograd().gradients(ctx.id()).begin()->value().clone();
    });
  }
  for (auto& t : trainers) t.join();
  for (int t = 0; t < 2; ++t) {
    at::Tensor wl = w_value.clone().set_requires_grad(true);
    (wl * inputs[t]).tanh().sum().backward();
    EXPECT_TRUE(at::allclose(owner_grads[t], wl.grad() * 5, 1e-5, 1e-6)) << "context " << t;
  }
}

TEST_P(DistAutogradTest, DestroyedDistributedOptimizersLeaveNothingOnTheOwners) {
  Job& job = *job_;
  RRef r1 = RRef::from_ivalue(job[0].rpc_sync("worker1", "ag.make_weight", {int64_t{31}}));
  // A creation that fails on one owner (its parameter is no tensor) takes back the
  // optimizers the other owners made.
  RRef not_a_tensor = job[0].remote("worker2", "aten::add", {int64_t{1}, int64_t{2}});
  Error e = testing::expect_error([&] { DistributedOptimizer opt(job[0], optim::sgd(0.1), {r1, not_a_tensor}); });
  EXPECT_TRUE(testing::contains(e.what(), "worker2")) << e.what();
  for (int i = 0; i < 3; ++i) {
    DistributedOptimizer opt(job[0], optim::sgd(0.1), {r1});
    dist_autograd::Context ctx(job[0]);
    at::Tensor y = r1.rpc_sync("ag.layer", {at::ones({4})}).toTensor();
    job[0].autograd().backward(ctx.id(), {y.sum()}, false);
    opt.step(ctx.id());
  }
  // Every DistributedOptimizer of this suite is gone: no owner still hosts an optimizer.
  for (int w = 0; w < job.size(); ++w) {
    for (int64_t id = 0; id < 50; ++id) {
      EXPECT_FALSE(job[0].rpc_sync("worker" + std::to_string(w), "drpc.optim.release", {id}).toBool())
          << "optimizer " << id << " still on worker" << w;
    }
  }
}

// Every worker trains through the others with as many concurrent contexts as it has
// handler threads: a backward pass must not hold a handler thread while the rest of its
// chain works, or the passes wait on one another until they time out.
TEST_P(DistAutogradTest, ConcurrentBackwardPassesOnEveryWorkerDoNotStarveTheHandlers) {
  Job& job = *job_;
  constexpr int kPerWorker = 4;  // Job's handler threads per worker
  std::vector<std::thread> trainers;
  std::vector<std::string> failures(job.size() * kPerWorker);
  for (int w = 0; w < job.size(); ++w) {
    for (int t = 0; t < kPerWorker; ++t) {
      trainers.emplace_back([&, w, t] {
        try {
          const std::string a = "worker" + std::to_string((w + 1) % job.size());
          const std::string b = "worker" + std::to_string((w + 2) % job.size());
          for (int i = 0; i < 5; ++i) {
            at::Tensor x = leaf(100 * w + 10 * t + i);
            dist_autograd::Context ctx(job[w]);
            at::Tensor h = job[w].rpc_sync(a, "ag.affine", {x, 2.0}).toTensor();
            at::Tensor y = job[w].rpc_sync(b, "ag.affine", {h, 3.0}).toTensor();
            job[w].autograd().backward(ctx.id(), {y.sum()}, false);
            at::Tensor xl = x.detach().clone().set_requires_grad(true);
            local_affine(local_affine(xl, 2.0), 3.0).sum().backward();
            if (!at::allclose(grad_of(job[w].autograd().gradients(ctx.id()), x), xl.grad(), 1e-5, 1e-6)) {
              throw std::runtime_error("wrong gradient");
            }
          }
        } catch (const std::exception& e) {
          failures[w * kPerWorker + t] = e.what();
        }
      });
    }
  }
  for (auto& t : trainers) t.join();
  for (size_t i = 0; i < failures.size(); ++i) EXPECT_EQ(failures[i], "") << "trainer " << i;
}

TEST_P(DistAutogradTest, AnExceptionInARemoteBackwardFailsBackwardNamingTheWorker) {
  Job& job = *job_;
  dist_autograd::Context ctx(job[0]);
  at::Tensor y = job[0].rpc_sync("worker2", "ag.throw_in_backward", {leaf(8)}).toTensor();
  Error e = testing::expect_error([&] { job[0].autograd().backward(ctx.id(), {y.sum()}, false); });
  EXPECT_TRUE(testing::contains(e.what(), "worker2")) << e.what();
  EXPECT_TRUE(testing::contains(e.what(), "backward exploded")) << e.what();
}

TEST(DistAutogradOrphans, ContextsWhoseCreatorNeverReleasesAreReclaimed) {
  Options options;
  // Long enough that worker1 still has the context when the call's reply is back, on a busy
  // machine under ASan too.
  options.autograd_context_ttl = std::chrono::seconds(2);
  Job job(2, options);
  const int64_t id = job[0].autograd().new_context();  // never released by its creator
  job[0].autograd().set_current_context(id);
  job[0].rpc_sync("worker1", "ag.affine", {leaf(30), 1.0});
  job[0].autograd().set_current_context(-1);
  EXPECT_TRUE(job[1].autograd().has_context(id));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (job[1].autograd().has_context(id) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(job[1].autograd().has_context(id));
  EXPECT_TRUE(job[0].autograd().has_context(id));  // the creator's own context is its to release
  job[0].autograd().release(id);
}

DRPC_ON_EVERY_NETWORK(DistAutogradTest);

}  // namespace
}  // namespace drpc
