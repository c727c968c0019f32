// The RRef protocol's control channel on two real agents over in-memory process groups,
// with time on a manual executor: a lost delete is retried with exponential backoff, a
// retry never goes to a peer that is gone, retries end after control_attempts and at
// shutdown; controls queued together leave as one batch, applied item by item.
// Deterministic: no retry can fire before the test moves the clock.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/manual_executor.h"
#include "rpc/faulty_agent.h"
#include "rpc/in_memory_agents.h"
#include "rref/message_types.h"
#include "rref/proto/rref.pb.h"
#include "rref/rref_context.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class RRefControlTest : public ::testing::Test {
 protected:
  // worker0's agent drops its first `lost_deletes` user deletes (as lost on the way).
  void start(int lost_deletes, int attempts = 10) {
    Faults faults;
    faults.drop[kRRefUserDelete] = lost_deletes;
    agents_.agents[0] = create_faulty_agent(std::move(agents_.agents[0]), faults);
    RRefOptions options;
    options.control_attempts = attempts;
    for (int r = 0; r < 2; ++r) {
      auto run = [](const std::string&, std::vector<c10::IValue> args, Kwargs, const Extensions&) {
        auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
        future->markCompleted(c10::IValue(args.at(0).toTensor() * 2));
        return future;
      };
      auto apply = [](const c10::IValue&, const std::string&, std::vector<c10::IValue>, Kwargs,
                      const Extensions&) -> FuturePtr { throw Error(ErrorKind::kBadArgument, "no methods here"); };
      contexts_[r] = create_rref_context(agents_[r], executors_[r], run, apply, options);
    }
    // Counts the deletes that really leave worker0 (a dropped one never reaches its agent).
    agents_[0].add_interceptor(RpcAgent::Interceptor{
        [this](const WorkerInfo&, Message& m) {
          if (m.type == kRRefUserDelete) ++deletes_sent_;
          if (m.type == kRRefControlBatch) ++batches_sent_;
        },
        nullptr});
    agents_[0].add_peer_failure_listener([this](const WorkerInfo& peer, const Error&) {
      if (peer.id == 1 && !worker1_told_.exchange(true)) worker1_lost_.set_value();
    });
    agents_.start();
  }

  // An RRef owned by worker1, used on worker0 and then dropped there: its delete is queued.
  void use_and_drop_a_remote_value() {
    RRef rref = contexts_[0]->remote(agents_[0].worker(1), "double", {at::ones({2})}, {}, milliseconds(10000));
    EXPECT_TRUE(at::equal(rref.to_here().toTensor(), at::full({2}, 2.0)));
    contexts_[0]->confirmations({rref.to_ivalue()})->wait();
    EXPECT_EQ(contexts_[1]->counts().owners, 1);
  }

  ~RRefControlTest() override {
    for (auto& c : contexts_) {
      if (c) c->shutdown();
    }
  }

  ManualExecutor executors_[2];
  InMemoryAgents agents_{2};
  std::shared_ptr<RRefContext> contexts_[2];
  std::atomic<int> deletes_sent_{0};
  std::atomic<int> batches_sent_{0};
  std::atomic<bool> worker1_told_{false};
  std::promise<void> worker1_lost_;  // worker0's agent told its listeners that worker1 is gone
};

TEST_F(RRefControlTest, ALostDeleteIsRetriedWithExponentialBackoffOnTheExecutorsClock) {
  start(/*lost_deletes=*/2);
  use_and_drop_a_remote_value();
  executors_[0].run_pending();  // the first attempt: lost
  EXPECT_EQ(deletes_sent_.load(), 0);
  EXPECT_EQ(executors_[0].advance(milliseconds(39)), 0);  // the first retry waits 40 ms
  EXPECT_EQ(executors_[0].advance(milliseconds(1)), 1);   // lost again
  EXPECT_EQ(executors_[0].advance(milliseconds(79)), 0);  // the second waits 80 ms
  EXPECT_EQ(deletes_sent_.load(), 0);
  EXPECT_EQ(executors_[0].advance(milliseconds(1)), 1);
  EXPECT_EQ(deletes_sent_.load(), 1);
  contexts_[0]->release_all(seconds(10));  // returns once the owner acknowledged it
  EXPECT_EQ(contexts_[1]->counts().owners, 0);
  EXPECT_EQ(executors_[0].timers(), 0u);
}

TEST_F(RRefControlTest, RetriesEndAfterControlAttemptsAndTheOwnerReportsTheLeak) {
  start(/*lost_deletes=*/100, /*attempts=*/3);
  use_and_drop_a_remote_value();
  executors_[0].run_pending();
  EXPECT_EQ(executors_[0].advance(seconds(60)), 2);  // attempts 2 and 3, then it gives up
  EXPECT_EQ(executors_[0].timers(), 0u);
  EXPECT_EQ(deletes_sent_.load(), 0);
  contexts_[0]->release_all(seconds(10));  // nothing left in flight: at once
  EXPECT_EQ(contexts_[1]->counts().owners, 1);
  ASSERT_EQ(contexts_[1]->leaks().size(), 1u);
}

TEST_F(RRefControlTest, RetriesToAPeerThatIsGoneAreWithdrawn) {
  start(/*lost_deletes=*/100);
  use_and_drop_a_remote_value();
  executors_[0].run_pending();
  ASSERT_EQ(executors_[0].timers(), 1u);  // the first retry waits
  agents_.groups[1].group->shutdown();           // the owner goes
  ASSERT_EQ(worker1_lost_.get_future().wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(executors_[0].advance(seconds(60)), 1);  // its timer finds nothing to send
  EXPECT_EQ(executors_[0].timers(), 0u);
  contexts_[0]->release_all(seconds(10));  // and nothing is left in flight
  EXPECT_EQ(deletes_sent_.load(), 0);
}

TEST_F(RRefControlTest, ShutdownStopsRetrying) {
  start(/*lost_deletes=*/1);
  use_and_drop_a_remote_value();
  executors_[0].run_pending();
  contexts_[0]->shutdown();
  executors_[0].advance(seconds(60));
  EXPECT_EQ(deletes_sent_.load(), 0);
  EXPECT_EQ(contexts_[1]->counts().owners, 1);
}

TEST_F(RRefControlTest, DeletesQueuedTogetherLeaveAsOneBatch) {
  start(/*lost_deletes=*/0);
  {
    std::vector<RRef> rrefs;
    for (int i = 0; i < 5; ++i) {
      rrefs.push_back(contexts_[0]->remote(agents_[0].worker(1), "double", {at::ones({2})}, {}, milliseconds(10000)));
      rrefs.back().to_here();
      contexts_[0]->confirmations({rrefs.back().to_ivalue()})->wait();
    }
    EXPECT_EQ(contexts_[1]->counts().owners, 5);
  }  // five deletes queued; none has left (the strand runs on the manual executor)
  executors_[0].run_pending();
  contexts_[0]->release_all(seconds(10));
  EXPECT_EQ(batches_sent_.load(), 1);
  EXPECT_EQ(deletes_sent_.load(), 0);
  EXPECT_EQ(contexts_[1]->counts().owners, 0);
}

// One batch in flight per peer: what is queued meanwhile waits for its answer, then leaves
// together as the next batch.
TEST_F(RRefControlTest, ControlsQueuedWhileABatchIsInFlightLeaveOnceItIsAnswered) {
  std::promise<void> let_go;
  std::shared_future<void> held = let_go.get_future().share();
  std::atomic<int> batches_received{0};
  // worker1 holds worker0's first batch until the test lets it go.
  agents_[1].add_interceptor(RpcAgent::Interceptor{nullptr, [&](const WorkerInfo&, Message& m) {
                                                     if (m.type == kRRefControlBatch && batches_received++ == 0) {
                                                       held.wait();
                                                     }
                                                   }});
  start(/*lost_deletes=*/0);
  std::vector<RRef> first, second;
  for (int i = 0; i < 6; ++i) {
    RRef rref = contexts_[0]->remote(agents_[0].worker(1), "double", {at::ones({2})}, {}, milliseconds(10000));
    rref.to_here();
    contexts_[0]->confirmations({rref.to_ivalue()})->wait();
    (i < 3 ? first : second).push_back(std::move(rref));
  }
  first.clear();
  executors_[0].run_pending();  // the first three leave as one batch, and are held
  second.clear();
  executors_[0].run_pending();  // the peer is busy: these wait
  EXPECT_EQ(batches_sent_.load(), 1);
  EXPECT_EQ(deletes_sent_.load(), 0);

  let_go.set_value();
  while (batches_sent_.load() < 2) {  // the first answer hands the next batch to the executor
    executors_[0].wait_for_work();
    executors_[0].run_pending();
  }
  contexts_[0]->release_all(seconds(10));
  EXPECT_EQ(batches_sent_.load(), 2);
  EXPECT_EQ(deletes_sent_.load(), 0);
  EXPECT_EQ(batches_received.load(), 2);
  EXPECT_EQ(contexts_[1]->counts().owners, 0);
}

// An item the owner cannot apply gets its own error; the items after it are still applied.
TEST_F(RRefControlTest, ABatchHasAnOutcomePerItem) {
  start(/*lost_deletes=*/0);
  rref::ControlBatch batch;
  batch.add_items()->set_type(999);
  auto* accept = batch.add_items();
  accept->set_type(kRRefChildAccept);  // of a fork nobody made: nothing to do, no error
  accept->mutable_control()->mutable_fork()->set_worker(0);
  accept->mutable_control()->mutable_fork()->set_local(12345);
  auto reply = agents_[0].send(agents_[0].worker(1), Message{kRRefControlBatch, batch.SerializeAsString(), {}},
                               seconds(10), "test batch");
  reply->wait();
  ASSERT_FALSE(reply->hasError()) << reply->tryRetrieveErrorMessage();
  rref::ControlOutcomes outcomes;
  ASSERT_TRUE(outcomes.ParseFromString(message_from_ivalue(reply->value()).payload));
  ASSERT_EQ(outcomes.outcomes_size(), 2);
  EXPECT_EQ(outcomes.outcomes(0).error_kind(), wire::PROTOCOL);
  EXPECT_NE(outcomes.outcomes(0).error().find("unknown type 999"), std::string::npos) << outcomes.outcomes(0).error();
  EXPECT_EQ(outcomes.outcomes(1).error_kind(), wire::ERROR_KIND_NONE) << outcomes.outcomes(1).error();

  // More items than a sender ever puts in one batch: refused unread.
  rref::ControlBatch oversized;
  for (int i = 0; i <= kMaxControlBatch; ++i) oversized.add_items()->set_type(kRRefChildAccept);
  auto refused = agents_[0].send(agents_[0].worker(1), Message{kRRefControlBatch, oversized.SerializeAsString(), {}},
                                 seconds(10), "test batch");
  refused->wait();
  ASSERT_TRUE(refused->hasError());
  EXPECT_NE(refused->tryRetrieveErrorMessage().find("batch of 513 items (at most 512)"), std::string::npos)
      << refused->tryRetrieveErrorMessage();

  auto malformed = agents_[0].send(agents_[0].worker(1), Message{kRRefControlBatch, std::string("\xff\xff", 2), {}},
                                   seconds(10), "test batch");
  malformed->wait();
  ASSERT_TRUE(malformed->hasError());
  EXPECT_NE(malformed->tryRetrieveErrorMessage().find("malformed RRef control batch"), std::string::npos)
      << malformed->tryRetrieveErrorMessage();
}

}  // namespace
}  // namespace drpc
