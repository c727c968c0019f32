// The agent over the in-memory process group: request/response matching, handlers,
// interceptors, deadlines, peer failure, join and shutdown, without sockets.

#include "rpc/process_group_agent.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "process_group/in_memory_process_group.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
constexpr int32_t kEcho = 50;
constexpr int32_t kHold = 51;

struct Agents {
  explicit Agents(int n, AgentOptions options = {}) : groups(create_in_memory_process_groups(n)) {
    std::vector<WorkerInfo> workers;
    for (int r = 0; r < n; ++r) workers.push_back(WorkerInfo{"w" + std::to_string(r), r});
    for (int r = 0; r < n; ++r) agents.push_back(create_process_group_agent(*groups[r], workers, options));
  }
  ~Agents() {
    for (auto& a : agents) a->shutdown(false);
  }
  RpcAgent& operator[](int r) { return *agents[r]; }
  std::vector<std::unique_ptr<ProcessGroup>> groups;
  std::vector<std::unique_ptr<RpcAgent>> agents;
};

// Echo: the reply is the request with its payload reversed and its tensors doubled.
RpcAgent::Handler echo_handler() {
  return [](const WorkerInfo& from, Message request) {
    Message reply{kEcho, std::string(request.payload.rbegin(), request.payload.rend()) + "@" + from.name, {}};
    for (auto& t : request.tensors) reply.tensors.push_back(t * 2);
    auto future = make_message_future();
    future->markCompleted(message_to_ivalue(std::move(reply)));
    return future;
  };
}

Error error_of(const FuturePtr& future) {
  future->wait();
  EXPECT_TRUE(future->hasError());
  try {
    future->value();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::kInternal, "no drpc::Error");
}

TEST(ProcessGroupAgent, RepliesMatchTheirRequests) {
  Agents agents(2);
  for (int r = 0; r < 2; ++r) {
    agents[r].register_handler(kEcho, echo_handler());
    agents[r].start();
  }
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 100; ++i) {
    futures.push_back(agents[i % 2].send(agents[0].worker(1 - i % 2), Message{kEcho, "ab" + std::to_string(i), {at::full({1}, i)}},
                                         milliseconds(5000), "echo"));
  }
  for (int i = 0; i < 100; ++i) {
    futures[i]->wait();
    const Message& reply = message_from_ivalue(futures[i]->value());
    std::string expected = "ab" + std::to_string(i);
    EXPECT_EQ(reply.payload, std::string(expected.rbegin(), expected.rend()) + "@w" + std::to_string(i % 2));
    EXPECT_EQ(reply.tensors.at(0).item<int64_t>(), 2 * i);
  }
}

TEST(ProcessGroupAgent, MessagesBeforeStartAreHeldAndSelfCallsWork) {
  Agents agents(2);
  agents[0].register_handler(kEcho, echo_handler());
  agents[0].start();
  auto future = agents[0].send(agents[0].worker("w1"), Message{kEcho, "x", {}}, milliseconds(5000), "echo");
  agents[1].register_handler(kEcho, echo_handler());
  agents[1].start();  // only now is the request served
  future->wait();
  EXPECT_EQ(message_from_ivalue(future->value()).payload, "x@w0");
  auto self = agents[0].send(agents[0].self(), Message{kEcho, "me", {}}, milliseconds(5000), "echo");
  self->wait();
  EXPECT_EQ(message_from_ivalue(self->value()).payload, "em@w0");
}

TEST(ProcessGroupAgent, HandlerErrorsAndUnknownTypesComeBackWithTheirKind) {
  Agents agents(2);
  agents[1].register_handler(kEcho, [](const WorkerInfo&, Message) -> FuturePtr {
    throw Error(ErrorKind::kBadArgument, "wrong thing");
  });
  agents[0].start();
  agents[1].start();
  Error e = error_of(agents[0].send(agents[0].worker(1), Message{kEcho, "", {}}, milliseconds(5000), "f"));
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_NE(std::string(e.what()).find("wrong thing"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("w1"), std::string::npos) << e.what();
  e = error_of(agents[0].send(agents[0].worker(1), Message{77, "", {}}, milliseconds(5000), "g"));
  EXPECT_NE(std::string(e.what()).find("no handler for message type 77"), std::string::npos) << e.what();
  EXPECT_THROW(agents[0].worker("nobody"), Error);
}

TEST(ProcessGroupAgent, InterceptorsSeeAndRewriteEveryMessage) {
  Agents agents(2);
  std::atomic<int> sent{0}, received{0};
  for (int r = 0; r < 2; ++r) {
    agents[r].register_handler(kEcho, echo_handler());
    agents[r].add_interceptor(RpcAgent::Interceptor{
        [&](const WorkerInfo&, Message& m) {
          ++sent;
          m.payload += "+";
        },
        [&](const WorkerInfo&, Message&) { ++received; }});
    agents[r].start();
  }
  auto future = agents[0].send(agents[0].worker(1), Message{kEcho, "q", {}}, milliseconds(5000), "echo");
  future->wait();
  EXPECT_EQ(message_from_ivalue(future->value()).payload, "+q@w0+");  // request and reply both rewritten
  EXPECT_EQ(sent.load(), 2);
  EXPECT_EQ(received.load(), 2);
}

TEST(ProcessGroupAgent, DeadlinesFireInOrderAndLateRepliesAreDropped) {
  Agents agents(2);
  std::vector<FuturePtr> held;
  std::mutex mu;
  agents[1].register_handler(kHold, [&](const WorkerInfo&, Message) {
    auto future = make_message_future();
    std::lock_guard<std::mutex> lock(mu);
    held.push_back(future);
    return future;  // completed by the test, later
  });
  agents[0].start();
  agents[1].start();
  auto slow = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(400), "slow");
  auto fast = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(100), "fast");
  Error e = error_of(fast);
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_FALSE(slow->completed());  // the later deadline has not passed yet
  e = error_of(slow);
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_NE(std::string(e.what()).find("slow to w1 timed out after 400 ms"), std::string::npos) << e.what();
  std::lock_guard<std::mutex> lock(mu);
  for (auto& f : held) f->markCompleted(message_to_ivalue(Message{kHold, "late", {}}));  // dropped by the caller
}

TEST(ProcessGroupAgent, APeerThatLeavesFailsItsPendingCalls) {
  Agents agents(3);
  agents[1].register_handler(kHold, [](const WorkerInfo&, Message) { return make_message_future(); });
  agents[2].register_handler(kEcho, echo_handler());
  for (int r = 0; r < 3; ++r) agents[r].start();
  auto pending = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(0), "forever");
  agents.groups[1]->shutdown();
  Error e = error_of(pending);
  EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable);
  EXPECT_NE(std::string(e.what()).find("w1"), std::string::npos) << e.what();
  auto alive = agents[0].send(agents[0].worker(2), Message{kEcho, "ok", {}}, milliseconds(5000), "echo");
  alive->wait();
  EXPECT_FALSE(alive->hasError());
}

TEST(ProcessGroupAgent, JoinWaitsForCallsAnywhereInTheJob) {
  Agents agents(2);
  FuturePtr held_reply;
  std::mutex mu;
  std::condition_variable cv;
  agents[1].register_handler(kHold, [&](const WorkerInfo&, Message) {
    std::lock_guard<std::mutex> lock(mu);
    held_reply = make_message_future();
    cv.notify_all();
    return held_reply;
  });
  agents[0].start();
  agents[1].start();
  auto call = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(0), "held");
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return held_reply != nullptr; });
  }
  std::atomic<int> joined{0};
  std::thread j0([&] { agents[0].join(); ++joined; });
  std::thread j1([&] { agents[1].join(); ++joined; });
  EXPECT_EQ(joined.load(), 0);  // both wait: a call is outstanding on worker 1
  held_reply->markCompleted(message_to_ivalue(Message{kHold, "done", {}}));
  j0.join();
  j1.join();
  EXPECT_EQ(joined.load(), 2);
  EXPECT_TRUE(call->completed() && !call->hasError());
}

TEST(ProcessGroupAgent, ShutdownFailsPendingCallsAndLaterSends) {
  Agents agents(2);
  agents[1].register_handler(kHold, [](const WorkerInfo&, Message) { return make_message_future(); });
  agents[0].start();
  agents[1].start();
  auto pending = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(0), "held");
  agents[0].shutdown(false);
  agents[0].shutdown(false);  // idempotent
  EXPECT_EQ(error_of(pending).kind(), ErrorKind::kShutdown);
  try {
    agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(0), "after");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kShutdown);
  }
}

}  // namespace
}  // namespace drpc
