// The agent over the in-memory process group: request/response matching, handlers,
// interceptors, deadlines, peer failure, join and shutdown, without sockets.

#include "rpc/process_group_agent.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <tuple>

#include "common/executor.h"
#include "process_group/in_memory_process_group.h"
#include "rpc/metrics.h"
#include "rpc/profiler.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
constexpr int32_t kEcho = 50;
constexpr int32_t kHold = 51;

struct Agents {
  explicit Agents(int n, AgentOptions options = {}) : groups(create_in_memory_process_groups(n)) {
    std::vector<WorkerInfo> workers;
    for (int r = 0; r < n; ++r) workers.push_back(WorkerInfo{"w" + std::to_string(r), r});
    for (int r = 0; r < n; ++r) executors.push_back(create_thread_executor("[w" + std::to_string(r) + "]"));
    for (int r = 0; r < n; ++r)
      agents.push_back(create_process_group_agent(*groups[r].messages, *executors[r], workers, options));
  }
  ~Agents() {
    for (auto& a : agents) a->shutdown(false);
  }
  RpcAgent& operator[](int r) { return *agents[r]; }
  std::vector<GroupEndpoints> groups;
  std::vector<std::unique_ptr<Executor>> executors;  // outlive the agents
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

// A handler whose replies wait until the test answers them all (late, after deadlines).
class HeldReplies {
 public:
  RpcAgent::Handler handler() {
    return [this](const WorkerInfo&, Message) {
      auto future = make_message_future();
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back(future);
      return future;
    };
  }
  void answer_all() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& f : held_) f->markCompleted(message_to_ivalue(Message{kHold, "late", {}}));
  }

 private:
  std::mutex mu_;
  std::vector<FuturePtr> held_;
};

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
    futures.push_back(agents[i % 2].send(agents[0].worker(1 - i % 2),
                                         Message{kEcho, "ab" + std::to_string(i), {at::full({1}, i)}},
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

// Extensions cross the wire untouched and a reply starts with its request's; what an
// interceptor refuses on arrival (a peer's malformed header) is answered with its error
// and never reaches the handler.
TEST(ProcessGroupAgent, ExtensionsTravelToTheReplyAndARefusedRequestIsAnsweredWithTheError) {
  constexpr int32_t kExtension = 250;
  Agents agents(2);
  std::atomic<int> served{0};
  std::string seen;  // written by the handler, read after its reply arrived
  agents[1].register_handler(kEcho, [&](const WorkerInfo&, Message request) {
    ++served;
    seen = request.extensions.count(kExtension) ? request.extensions.at(kExtension) : "(none)";
    auto future = make_message_future();
    Message reply{kEcho, "r", {}};
    reply.extensions[kExtension + 1] = "the handler's";
    future->markCompleted(message_to_ivalue(std::move(reply)));
    return future;
  });
  agents[1].add_interceptor(RpcAgent::Interceptor{nullptr, [&](const WorkerInfo&, Message& m) {
    auto it = m.extensions.find(kExtension);
    if (it != m.extensions.end() && it->second == "bad") {
      throw Error(ErrorKind::kProtocol, "malformed test header");
    }
  }});
  agents[0].start();
  agents[1].start();
  Message request{kEcho, "q", {}};
  request.extensions[kExtension] = std::string("o\0k", 3);
  auto ok = agents[0].send(agents[0].worker(1), std::move(request), milliseconds(5000), "ok");
  ok->wait();
  const Message reply = message_from_ivalue(ok->value());
  EXPECT_EQ(seen, std::string("o\0k", 3));
  EXPECT_EQ(reply.extensions, (Extensions{{kExtension, std::string("o\0k", 3)}, {kExtension + 1, "the handler's"}}));

  Message bad{kEcho, "q", {}};
  bad.extensions[kExtension] = "bad";
  Error e = error_of(agents[0].send(agents[0].worker(1), std::move(bad), milliseconds(5000), "bad"));
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_NE(std::string(e.what()).find("malformed test header"), std::string::npos) << e.what();
  EXPECT_EQ(served.load(), 1);
}

// A handler whose future holds something other than a Message answers with an Internal
// error naming what it held; the agent goes on serving.
TEST(ProcessGroupAgent, AReplyThatIsNotAMessageComesBackAsAnInternalError) {
  Agents agents(2);
  agents[1].register_handler(kHold, [](const WorkerInfo&, Message) {
    auto future = make_message_future();
    future->markCompleted(c10::IValue(int64_t{7}));
    return future;
  });
  agents[1].register_handler(kEcho, echo_handler());
  agents[0].start();
  agents[1].start();
  Error e = error_of(agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(5000), "bad"));
  EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  EXPECT_NE(std::string(e.what()).find("a reply future holds Int, not a drpc Message"), std::string::npos) << e.what();
  auto ok = agents[0].send(agents[0].worker(1), Message{kEcho, "ab", {}}, milliseconds(5000), "ok");
  ok->wait();
  ASSERT_FALSE(ok->hasError());
  EXPECT_EQ(message_from_ivalue(ok->value()).payload, "ba@w0");
}

TEST(ProcessGroupAgent, ErrorTextThatIsNotUtf8StillComesBack) {
  Agents agents(2);
  const std::string binary = "bad \xff\xfe bytes";
  agents[1].register_handler(kEcho, [binary](const WorkerInfo&, Message) -> FuturePtr {
    throw Error(ErrorKind::kBadArgument, binary);
  });
  agents[0].start();
  agents[1].start();
  const std::string what = "f\xc3";  // a call label cut inside a UTF-8 sequence
  Error e = error_of(agents[0].send(agents[0].worker(1), Message{kEcho, "", {}}, milliseconds(5000), what));
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument) << e.what();
  EXPECT_NE(std::string(e.what()).find(binary), std::string::npos) << e.what();
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
  HeldReplies held;
  agents[1].register_handler(kHold, held.handler());
  agents[0].start();
  agents[1].start();
  // Deadlines seconds apart, so a test thread descheduled on a busy machine still checks
  // `slow` before its deadline.
  auto slow = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(3000), "slow");
  auto fast = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(100), "fast");
  Error e = error_of(fast);
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_FALSE(slow->completed());  // the later deadline has not passed yet
  e = error_of(slow);
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_NE(std::string(e.what()).find("slow to w1 timed out after 3000 ms"), std::string::npos) << e.what();
  held.answer_all();  // the late replies are dropped by the caller
}

// The timer sleeps until the earliest deadline it knew of and is woken only for an earlier
// one: a later call's deadline, made after an earlier call was answered, still fires on
// time (neither before it nor much after).
TEST(ProcessGroupAgent, ALaterDeadlineFiresAfterAnEarlierCallWasAnswered) {
  Agents agents(2);
  HeldReplies held;
  agents[1].register_handler(kHold, held.handler());
  agents[1].register_handler(kEcho, echo_handler());
  agents[0].start();
  agents[1].start();
  for (int round = 0; round < 2; ++round) {
    // Generous for an echo on a busy machine, yet earlier than `later`'s: the timer sleeps on it.
    auto answered = agents[0].send(agents[0].worker(1), Message{kEcho, "x", {}}, milliseconds(1000), "answered");
    answered->wait();
    ASSERT_FALSE(answered->hasError());
    const auto start = std::chrono::steady_clock::now();
    auto later = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(2500), "later");
    EXPECT_EQ(error_of(later).kind(), ErrorKind::kTimeout);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, milliseconds(2500));
    EXPECT_LT(took, milliseconds(5500));
  }
  held.answer_all();
}

TEST(ProcessGroupAgent, APeerThatLeavesFailsItsPendingCalls) {
  Agents agents(3);
  agents[1].register_handler(kHold, [](const WorkerInfo&, Message) { return make_message_future(); });
  agents[2].register_handler(kEcho, echo_handler());
  for (int r = 0; r < 3; ++r) agents[r].start();
  auto pending = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(0), "forever");
  agents.groups[1].group->shutdown();
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

// A message that arrives while start() serves the held ones waits behind them: each
// peer's messages are served in the order it sent them.
TEST(ProcessGroupAgent, MessagesArrivingDuringStartUpDoNotOvertakeHeldOnes) {
  Agents agents(2);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> served;
  FuturePtr second;
  agents[1].register_handler(
      kEcho,
      [&](const WorkerInfo&, Message request) {
        if (request.payload == "first") {
          // Sent while the held "first" is being served; it must not be served before
          // "first" is done, so give it the chance to overtake, bounded.
          second = agents[0].send(agents[0].worker(1), Message{kEcho, "second", {}}, milliseconds(5000), "echo");
          std::unique_lock<std::mutex> lock(mu);
          cv.wait_for(lock, milliseconds(500), [&] { return !served.empty(); });
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          served.push_back(request.payload);
        }
        cv.notify_all();
        auto reply = make_message_future();
        reply->markCompleted(message_to_ivalue(Message{kEcho, request.payload, {}}));
        return reply;
      },
      RpcAgent::always_inline());  // served in arrival order, on the thread that dispatches it
  agents[0].start();
  auto first = agents[0].send(agents[0].worker(1), Message{kEcho, "first", {}}, milliseconds(5000), "echo");
  // A point-to-point tensor behind it on the same queue: once it is here, "first" is held.
  agents.groups[0].group->send({at::ones({1})}, 1, 7)->wait();
  agents.groups[1].group->recv({at::empty({1})}, 0, 7)->wait();
  agents[1].start();
  first->wait();
  second->wait();
  EXPECT_EQ(served, (std::vector<std::string>{"first", "second"}));
}

// A join waits for every worker however long it takes, but not for one that is gone,
// even when the gone one led the join.
TEST(ProcessGroupAgent, JoinDoesNotWaitForGoneWorkersEvenTheLeader) {
  Agents agents(3);
  for (int r = 0; r < 3; ++r) agents[r].start();
  std::atomic<int> joined{0};
  std::thread j1([&] { agents[1].join(); ++joined; });
  std::thread j2([&] { agents[2].join(); ++joined; });
  // Still waiting for worker 0, the leader; while they wait they serve.
  agents[1].register_handler(kEcho, echo_handler());
  EXPECT_EQ(joined.load(), 0);
  agents.groups[0].group->shutdown();  // worker 0 leaves without joining
  j1.join();
  j2.join();
  EXPECT_EQ(joined.load(), 2);
}

TEST(ProcessGroupAgent, JoinCanBeBoundedAndServesMeanwhile) {
  Agents agents(2);
  for (int r = 0; r < 2; ++r) agents[r].register_handler(kEcho, echo_handler());
  for (int r = 0; r < 2; ++r) agents[r].start();
  std::atomic<bool> timed_out{false};
  std::thread j0([&] {
    try {
      agents[0].join(milliseconds(300));
    } catch (const Error& e) {
      timed_out = e.kind() == ErrorKind::kTimeout && std::string(e.what()).find("join") != std::string::npos;
    }
  });
  // Worker 0 answers while it waits in join.
  for (int i = 0; i < 10; ++i) {
    auto f = agents[1].send(agents[1].worker(0), Message{kEcho, "x", {}}, milliseconds(5000), "echo");
    f->wait();
    EXPECT_FALSE(f->hasError());
  }
  j0.join();
  EXPECT_TRUE(timed_out.load());
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

// Requests held by a handler until the test completes them.
struct Held {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<FuturePtr> replies;
  RpcAgent::Handler handler() {
    return [this](const WorkerInfo&, Message) {
      auto future = make_message_future();
      std::lock_guard<std::mutex> lock(mu);
      replies.push_back(future);
      cv.notify_all();
      return future;
    };
  }
  void wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return replies.size() >= n; });
  }
};

TEST(ProcessGroupAgent, MetricsCountAKnownSequenceOfCallsExactly) {
  Agents agents(2);
  Metrics m0("w0", 0, {"w0", "w1"}), m1("w1", 1, {"w0", "w1"});
  agents[0].set_instruments(&m0, nullptr);
  agents[1].set_instruments(&m1, nullptr);
  Held held;
  agents[0].register_handler(kEcho, echo_handler());
  agents[1].register_handler(kEcho, echo_handler());
  agents[1].register_handler(kHold, held.handler());
  agents[0].start();
  agents[1].start();
  // 5 echoes to w1 (a 16-byte tensor each), 3 to itself, 1 of a type w1 has no handler
  // for, 1 that times out, 1 held open while the gauges are read.
  for (int i = 0; i < 5; ++i) {
    auto f = agents[0].send(agents[0].worker(1), Message{kEcho, "abc", {at::ones({4})}}, milliseconds(5000), "echo");
    f->wait();
    ASSERT_FALSE(f->hasError());
  }
  for (int i = 0; i < 3; ++i) {
    agents[0].send(agents[0].self(), Message{kEcho, "x", {}}, milliseconds(5000), "echo")->wait();
  }
  EXPECT_EQ(error_of(agents[0].send(agents[0].worker(1), Message{77, "", {}}, milliseconds(5000), "g")).kind(),
            ErrorKind::kBadArgument);
  // A call's detail (which RRef) is in its error's text, never in the metrics' labels.
  const Error slow = error_of(
      agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(50), CallName{"slow", "on RRef 0:9"}));
  EXPECT_EQ(slow.kind(), ErrorKind::kTimeout);
  EXPECT_NE(std::string(slow.what()).find("slow on RRef 0:9"), std::string::npos) << slow.what();
  held.wait_for(1);
  auto open = agents[0].send(agents[0].worker(1), Message{kHold, "", {}}, milliseconds(0),
                             CallName{"to_here of RRef", "0:17"});
  held.wait_for(2);

  MetricsSnapshot s0 = m0.snapshot(), s1 = m1.snapshot();
  using Calls = std::map<std::pair<std::string, std::string>, int64_t>;
  EXPECT_EQ(s0.calls_sent, (Calls{{{"echo", "w0"}, 3}, {{"echo", "w1"}, 5}, {{"g", "w1"}, 1}, {{"slow", "w1"}, 1},
                                  {{"to_here of RRef", "w1"}, 1}}));
  EXPECT_EQ(s0.calls_received, (Calls{{{"echo", "w0"}, 3}}));
  EXPECT_EQ(s1.calls_sent, Calls{});
  EXPECT_EQ(s1.calls_received, (Calls{{{"echo", "w0"}, 5}, {{"g", "w0"}, 1}, {{"slow", "w0"}, 1},
                                      {{"to_here of RRef", "w0"}, 1}}));
  using Kinds = std::map<std::string, int64_t>;
  EXPECT_EQ(s0.errors_sent, (Kinds{{"BadArgument", 1}, {"Timeout", 1}}));
  EXPECT_EQ(s0.errors_received, Kinds{});
  EXPECT_EQ(s1.errors_received, (Kinds{{"BadArgument", 1}}));
  // Replies, error replies included, have a round trip; the timed-out call has none.
  EXPECT_EQ(s0.latency["echo"].count, 8);
  EXPECT_EQ(s0.latency["g"].count, 1);
  EXPECT_EQ(s0.latency.count("slow"), 0u);
  EXPECT_GT(s0.latency["echo"].p50, 0);
  EXPECT_LE(s0.latency["echo"].p50, s0.latency["echo"].p99);
  EXPECT_EQ(s1.handler_latency["echo"].count, 5);
  EXPECT_EQ(s0.handler_latency["echo"].count, 3);
  // What one sent, the other received; the tensors are in it.
  EXPECT_EQ(s0.bytes_sent["w1"], s1.bytes_received["w0"]);
  EXPECT_EQ(s1.bytes_sent["w0"], s0.bytes_received["w1"]);
  EXPECT_GT(s0.bytes_sent["w1"], 5 * 16);
  EXPECT_GT(s1.bytes_sent["w0"], 5 * 16);
  // The open call is in flight on both sides.
  EXPECT_EQ(s0.in_flight_sent, 1);
  EXPECT_EQ(s1.in_flight_received, 2);  // the timed-out one is still being served too
  EXPECT_EQ(s1.handler_queue, 0);
  {
    std::lock_guard<std::mutex> lock(held.mu);
    for (auto& f : held.replies) f->markCompleted(message_to_ivalue(Message{kHold, "", {}}));
  }
  open->wait();
  // w1 counts a request as served once its reply is sent, which may be after the caller
  // has it; a job-wide join returns only when every worker has served everything.
  std::thread join0([&] { agents[0].join(); });
  agents[1].join();
  join0.join();
  s0 = m0.snapshot();
  s1 = m1.snapshot();
  EXPECT_EQ(s0.in_flight_sent, 0);
  EXPECT_EQ(s1.in_flight_received, 0);
  EXPECT_EQ(s0.latency["to_here of RRef"].count, 1);
  EXPECT_EQ(s1.handler_latency["slow"].count, 1);
}

TEST(ProcessGroupAgent, AProfiledCallChainComesBackWithEveryWorkersSpansOnTheCallersClock) {
  constexpr int32_t kChain = 52;
  Agents agents(3);
  std::vector<std::unique_ptr<Tracer>> tracers;
  for (int r = 0; r < 3; ++r) {
    tracers.push_back(std::make_unique<Tracer>());
    agents[r].set_instruments(nullptr, tracers[r].get());
  }
  // w1 serves "chain" by calling w2's echo from its handler thread.
  RpcAgent* a1 = &agents[1];
  agents[1].register_handler(kChain, [a1](const WorkerInfo&, Message request) {
    auto inner = a1->send(a1->worker(2), Message{kEcho, request.payload, {}}, milliseconds(5000), "echo");
    return inner->then([](c10::ivalue::Future& f) { return f.value(); }, c10::AnyType::get());
  });
  agents[2].register_handler(kEcho, echo_handler());
  for (int r = 0; r < 3; ++r) agents[r].start();

  tracers[0]->start();
  auto f = agents[0].send(agents[0].worker(1), Message{kChain, "ab", {}}, milliseconds(5000), "chain");
  f->wait();
  ASSERT_FALSE(f->hasError());
  std::vector<TraceEvent> events = tracers[0]->stop();

  // Find each span by (worker, category, name, direction).
  auto find = [&](int worker, const std::string& cat, const std::string& name, const std::string& direction = "") {
    const TraceEvent* found = nullptr;
    for (const auto& e : events) {
      if (e.worker != worker || e.category != cat || e.name != name) continue;
      bool dir_ok = direction.empty();
      for (const auto& [k, v] : e.args) dir_ok = dir_ok || (k == "direction" && v == direction);
      if (!dir_ok) continue;
      EXPECT_EQ(found, nullptr) << "two " << cat << " " << name << " on " << worker;
      found = &e;
    }
    EXPECT_NE(found, nullptr) << "no " << cat << " " << name << " " << direction << " on worker " << worker;
    return found ? *found : TraceEvent{};
  };
  ASSERT_EQ(events.size(), 12u);  // 4 on w0, 6 on w1, 2 on w2
  const TraceEvent call = find(0, "rpc", "chain"), send = find(0, "send", "send"),
                   req = find(0, "network", "network", "request"), rep = find(0, "network", "network", "reply"),
                   queue1 = find(1, "queue", "queue"), exec1 = find(1, "execute", "chain"),
                   call1 = find(1, "rpc", "echo"), send1 = find(1, "send", "send"),
                   req1 = find(1, "network", "network", "request"), rep1 = find(1, "network", "network", "reply"),
                   queue2 = find(2, "queue", "queue"), exec2 = find(2, "execute", "echo");
  auto end = [](const TraceEvent& e) { return e.start_ns + e.duration_ns; };
  // Each call is its send, request transit, queue, execution and reply transit, back to back.
  for (const auto& [c, s, rq, q, x, rp] : {std::make_tuple(call, send, req, queue1, exec1, rep),
                                           std::make_tuple(call1, send1, req1, queue2, exec2, rep1)}) {
    EXPECT_EQ(s.start_ns, c.start_ns);
    EXPECT_EQ(rq.start_ns, end(s));
    EXPECT_EQ(q.start_ns, end(rq));
    EXPECT_EQ(x.start_ns, end(q));
    EXPECT_EQ(rp.start_ns, end(x));
    EXPECT_EQ(end(rp), end(c));
    EXPECT_EQ(s.duration_ns + rq.duration_ns + q.duration_ns + x.duration_ns + rp.duration_ns, c.duration_ns);
    for (const auto* e : {&s, &rq, &q, &x, &rp}) EXPECT_GE(e->duration_ns, 0) << e->category;
  }
  // The nested call runs inside w1's execution of "chain", on the same thread.
  EXPECT_GE(call1.start_ns, exec1.start_ns);
  EXPECT_LE(end(call1), end(exec1));
  EXPECT_EQ(call1.tid, exec1.tid);
  EXPECT_EQ(exec1.thread.rfind("handler ", 0), 0u) << exec1.thread;
  EXPECT_NE(exec1.tid, call.tid);

  // A name that is not UTF-8 travels in the spans too (as bytes: a proto3 string would
  // make the reply unparseable and the call time out).
  tracers[0]->start();
  auto odd = agents[0].send(agents[0].worker(2), Message{kEcho, "x", {}}, milliseconds(5000), "echo\xff");
  odd->wait();
  EXPECT_FALSE(odd->hasError());
  bool executed = false;
  for (const auto& e : tracers[0]->stop()) executed = executed || (e.category == "execute" && e.name == "echo\xff");
  EXPECT_TRUE(executed);

  // Not profiling: nothing is recorded, nothing asks callees to.
  EXPECT_FALSE(tracers[0]->active());
  agents[0].send(agents[0].worker(1), Message{kChain, "cd", {}}, milliseconds(5000), "chain")->wait();
  EXPECT_TRUE(tracers[0]->stop().empty());
}

}  // namespace
}  // namespace drpc
