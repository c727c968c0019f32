// Distributed autograd on two real agents over in-memory process groups, with time on a
// manual executor: the distributed backward, release, and the cleanup of contexts whose
// creator is gone or silent, tested deterministically beside the code.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>

#include "common/manual_executor.h"
#include "dist_autograd/dist_autograd.h"
#include "rpc/in_memory_agents.h"
#include "testing/errors.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
constexpr int32_t kTriple = 60;  // replies with 3 * each tensor
constexpr milliseconds kTtl{1000};

Message call(RpcAgent& from, int to, at::Tensor t) {
  auto reply = from.send(from.worker(to), Message{kTriple, "", {std::move(t)}}, milliseconds(10000), "triple");
  reply->wait();
  return message_from_ivalue(reply->value());
}

class ContainerTest : public ::testing::Test {
 protected:
  ContainerTest() : agents_(2) {
    for (int r = 0; r < 2; ++r) {
      containers_[r] = create_autograd_container(agents_[r], executors_[r], kTtl);
      agents_[r].register_handler(kTriple, [](const WorkerInfo&, Message request) {
        Message reply{kTriple, "", {}};
        for (const auto& t : request.tensors) reply.tensors.push_back(t * 3);
        auto future = make_message_future();
        future->markCompleted(message_to_ivalue(std::move(reply)));
        return future;
      });
    }
    // After the container's own: the agent tells its listeners in the order they came.
    agents_[1].add_peer_failure_listener([this](const WorkerInfo& peer, const Error&) {
      if (peer.id == 0 && !worker0_told_.exchange(true)) worker0_lost_.set_value();
    });
    agents_.start();
  }

  // A context created on worker0 that worker1 took part in.
  int64_t shared_context() {
    const int64_t id = containers_[0]->new_context();
    containers_[0]->set_current_context(id);
    call(agents_[0], 1, at::ones({2}).requires_grad_());
    containers_[0]->set_current_context(-1);
    EXPECT_TRUE(containers_[1]->has_context(id));
    return id;
  }

  ManualExecutor executors_[2];
  InMemoryAgents agents_;
  std::shared_ptr<AutogradContainer> containers_[2];
  std::atomic<bool> worker0_told_{false};
  std::promise<void> worker0_lost_;  // worker1's agent told its listeners
};

// The autograd header arrives as a peer's bytes: a malformed one is refused with an error
// naming it, the handler never runs, and the worker goes on serving.
TEST(Container, AMalformedAutogradHeaderFromAPeerIsAProtocolErrorNotACrash) {
  ManualExecutor executor;  // outlives the agents, as in the fixture
  InMemoryAgents agents(2);
  auto container = create_autograd_container(agents[1], executor, kTtl);
  std::atomic<int> served{0};
  agents[1].register_handler(kTriple, [&](const WorkerInfo&, Message) {
    ++served;
    auto future = make_message_future();
    future->markCompleted(message_to_ivalue(Message{kTriple, "", {}}));
    return future;
  });
  agents.start();
  for (const std::string& bytes : {std::string("\x08"), std::string("\x12\x05" "ab"), std::string("\xff\xff\xff")}) {
    Message request{kTriple, "", {at::ones({1})}};
    request.extensions[kAutogradExtension] = bytes;
    auto reply = agents[0].send(agents[0].worker(1), std::move(request), milliseconds(10000), "triple");
    reply->wait();
    ASSERT_TRUE(reply->hasError());
    const Error e = testing::expect_error([&] { reply->value(); });
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
    EXPECT_TRUE(testing::contains(e.what(), "malformed distributed autograd header")) << e.what();
  }
  EXPECT_EQ(served.load(), 0);
  EXPECT_EQ(container->num_contexts(), 0);
  auto fine = agents[0].send(agents[0].worker(1), Message{kTriple, "", {}}, milliseconds(10000), "triple");
  fine->wait();
  EXPECT_FALSE(fine->hasError());
  EXPECT_EQ(served.load(), 1);
}

TEST_F(ContainerTest, BackwardThroughAnotherWorkerLeavesTheGradientInTheContext) {
  const int64_t id = containers_[0]->new_context();
  containers_[0]->set_current_context(id);
  at::Tensor x = at::full({3}, 2.0).requires_grad_();
  at::Tensor y = call(agents_[0], 1, x * x).tensors.at(0);  // 3 x^2, computed on worker1
  containers_[0]->set_current_context(-1);
  ASSERT_TRUE(y.requires_grad());
  containers_[0]->backward(id, {y.sum()}, false);
  auto grads = containers_[0]->gradients(id);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_TRUE(at::allclose(grads.at(x), at::full({3}, 12.0)));  // d(3x^2)/dx = 6x
  EXPECT_FALSE(x.grad().defined());  // in the context, not in .grad
  FuturePtr released = containers_[0]->release(id);
  EXPECT_FALSE(containers_[0]->has_context(id));  // here at once
  released->wait();
  EXPECT_FALSE(released->hasError());
  EXPECT_FALSE(containers_[1]->has_context(id));  // everywhere once the future completes
}

TEST_F(ContainerTest, AContextUnusedForTheTtlIsReclaimedOnItsExecutorsClockOnlyWhereItIsForeign) {
  const int64_t id = shared_context();
  executors_[1].advance(kTtl - milliseconds(1));
  EXPECT_TRUE(containers_[1]->has_context(id));
  executors_[1].advance(kTtl / 4 + milliseconds(2));  // past the TTL, and a check ran since
  EXPECT_FALSE(containers_[1]->has_context(id));
  executors_[0].advance(kTtl * 10);
  EXPECT_TRUE(containers_[0]->has_context(id));  // the creator's own is its to release
  containers_[0]->release(id);
}

TEST_F(ContainerTest, UseKeepsAForeignContextAlive) {
  const int64_t id = shared_context();
  for (int i = 0; i < 5; ++i) {
    executors_[1].advance(kTtl * 3 / 4);
    containers_[0]->set_current_context(id);
    call(agents_[0], 1, at::ones({1}).requires_grad_());
    containers_[0]->set_current_context(-1);
  }
  EXPECT_TRUE(containers_[1]->has_context(id));  // 3.75 TTLs in all, never a whole one idle
  executors_[1].advance(kTtl * 2);
  EXPECT_FALSE(containers_[1]->has_context(id));
}

TEST_F(ContainerTest, ContextsOfAWorkerThatFailedAreReclaimedAtOnce) {
  const int64_t id = shared_context();
  const int64_t own = containers_[1]->new_context();
  agents_.groups[0].group->shutdown();  // worker0 vanishes without releasing
  ASSERT_EQ(worker0_lost_.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_FALSE(containers_[1]->has_context(id));  // at once: no time passed on its clock
  EXPECT_TRUE(containers_[1]->has_context(own));
}

TEST_F(ContainerTest, EachContainerHasItsOwnCurrentContextOnAThread) {
  const int64_t a = containers_[0]->new_context();
  const int64_t b = containers_[1]->new_context();
  containers_[0]->set_current_context(a);
  EXPECT_EQ(containers_[1]->current_context(), -1);
  containers_[1]->set_current_context(b);
  EXPECT_EQ(containers_[0]->current_context(), a);
  EXPECT_EQ(containers_[1]->current_context(), b);
  containers_[0]->set_current_context(-1);
  EXPECT_EQ(containers_[0]->current_context(), -1);
  EXPECT_EQ(containers_[1]->current_context(), b);
  containers_[1]->set_current_context(-1);
}

}  // namespace
}  // namespace drpc
