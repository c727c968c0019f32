// The serving side of the agent without a network: a handler's reply carries its type and
// the request's extensions (its own win), every failure (no handler, a throwing handler, a
// refused request, a result that is not a Message) becomes an error reply of the right
// kind, inline types run on the arriving thread and the rest on the handler threads, and
// a stopped pool refuses requests.

#include "rpc/request_server.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/error_wire.h"

namespace drpc {
namespace {

struct Delivered {
  int source;
  int64_t id;
  rpc::Envelope envelope;
  Message reply;
  std::thread::id thread;
};

// A server for worker 0 of {a, b} whose replies are kept for the test to wait on.
class RequestServerTest : public ::testing::Test {
 protected:
  RequestServerTest()
      : server_({{"a", 0}, {"b", 1}}, 0, [](int, const HandlerPool::Task& serve) { serve(); },
                [this](int source, rpc::Envelope envelope, Message reply) {
                  std::lock_guard<std::mutex> lock(mu_);
                  const int64_t id = envelope.id();
                  delivered_.push_back({source, id, std::move(envelope), std::move(reply), std::this_thread::get_id()});
                  cv_.notify_all();
                }) {}
  ~RequestServerTest() override {
    server_.pool().stop();
    server_.pool().join();
  }

  Delivered next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !delivered_.empty(); });
    Delivered d = std::move(delivered_.front());
    delivered_.erase(delivered_.begin());
    return d;
  }

  RequestServer::Request request(int32_t type, Extensions extensions = {}, std::exception_ptr refused = nullptr) {
    Message m{type, "payload", {}, std::move(extensions)};
    return server_.receive(1, 42, "f", false, std::move(m), std::move(refused), steady_now_ns());
  }

  RequestServer server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Delivered> delivered_;
};

TEST_F(RequestServerTest, TheReplyCarriesItsTypeAndTheRequestsExtensionsItDoesNotSet) {
  server_.register_handler(
      7,
      [](const WorkerInfo& from, Message m) {
        EXPECT_EQ(from.name, "b");
        EXPECT_EQ(m.payload, "payload");
        auto future = make_message_future();
        future->markCompleted(message_to_ivalue(Message{8, "answer", {}, {{300, "reply's own"}}}));
        return future;
      },
      nullptr);
  server_.pool().start(1);
  ASSERT_TRUE(server_.serve(request(7, {{300, "request's"}, {301, "context"}})));
  Delivered d = next();
  EXPECT_EQ(d.source, 1);
  EXPECT_EQ(d.id, 42);
  EXPECT_TRUE(d.envelope.is_response());
  EXPECT_EQ(d.envelope.id(), 42);
  EXPECT_EQ(d.envelope.error_kind(), 0);
  EXPECT_EQ(d.envelope.type(), 8);
  EXPECT_EQ(d.reply.payload, "answer");
  EXPECT_EQ(d.reply.extensions, (Extensions{{300, "reply's own"}, {301, "context"}}));
}

TEST_F(RequestServerTest, FailuresBecomeErrorRepliesOfTheirKind) {
  bool refused_ran = false;
  server_.register_handler(1, [](const WorkerInfo&, Message) -> FuturePtr { throw std::runtime_error("boom"); },
                           nullptr);
  server_.register_handler(2, [&](const WorkerInfo&, Message) {
    refused_ran = true;
    return make_message_future();
  }, nullptr);
  server_.register_handler(3, [](const WorkerInfo&, Message) {
    auto future = make_message_future();
    future->markCompleted(c10::IValue(int64_t{5}));
    return future;
  }, nullptr);
  server_.pool().start(1);

  server_.serve(request(9));
  Delivered d = next();
  EXPECT_EQ(from_wire(d.envelope.error_kind()), ErrorKind::kBadArgument);
  EXPECT_EQ(d.envelope.error(), "a has no handler for message type 9");

  server_.serve(request(1));
  d = next();
  EXPECT_EQ(from_wire(d.envelope.error_kind()), ErrorKind::kRemote);
  EXPECT_EQ(d.envelope.error(), "boom");

  server_.serve(request(2, {}, std::make_exception_ptr(Error(ErrorKind::kProtocol, "bad extension 250"))));
  d = next();
  EXPECT_FALSE(refused_ran);
  EXPECT_EQ(from_wire(d.envelope.error_kind()), ErrorKind::kProtocol);
  EXPECT_EQ(d.envelope.error(), "bad extension 250");

  server_.serve(request(3));
  d = next();
  EXPECT_EQ(from_wire(d.envelope.error_kind()), ErrorKind::kInternal);
  EXPECT_NE(d.envelope.error().find("not a drpc Message"), std::string::npos) << d.envelope.error();
}

TEST_F(RequestServerTest, InlineTypesRunOnTheArrivingThreadOthersOnTheHandlerThreads) {
  auto echo = [](const WorkerInfo&, Message m) {
    auto future = make_message_future();
    future->markCompleted(message_to_ivalue(std::move(m)));
    return future;
  };
  server_.register_handler(1, echo, RpcAgent::always_inline());
  server_.register_handler(2, echo, nullptr);
  // Type 3: inline for the requests its policy picks (here by label and payload).
  std::vector<std::string> asked;
  server_.register_handler(3, echo, [&](const std::string& what, const Message& m) {
    asked.push_back(what);
    return m.payload == "payload";
  });
  server_.pool().start(1);
  server_.serve(request(1));
  EXPECT_EQ(next().thread, std::this_thread::get_id());
  server_.serve(request(2));
  EXPECT_NE(next().thread, std::this_thread::get_id());
  server_.serve(request(3));
  EXPECT_EQ(next().thread, std::this_thread::get_id());
  RequestServer::Request other = request(3);
  other.message.payload = "large";
  server_.serve(std::move(other));
  Delivered d = next();
  EXPECT_NE(d.thread, std::this_thread::get_id());
  EXPECT_EQ(d.reply.payload, "large");
  EXPECT_EQ(asked, (std::vector<std::string>{"f", "f"}));
}

TEST_F(RequestServerTest, AStoppedPoolRefusesRequests) {
  server_.register_handler(2, [](const WorkerInfo&, Message) { return make_message_future(); }, nullptr);
  server_.pool().start(1);
  server_.pool().stop();
  EXPECT_FALSE(server_.serve(request(2)));
}

}  // namespace
}  // namespace drpc
