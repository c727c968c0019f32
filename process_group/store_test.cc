#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/error.h"
#include "testing/errors.h"
#include "process_group/grpc_store.h"
#include "process_group/in_memory_store.h"
#include "process_group/prefix_store.h"

namespace drpc {
namespace {

using testing::contains;
using testing::expect_error;

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// The behaviour every Store shares, run against each implementation.
class StoreConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "in_memory") {
      owned_ = create_in_memory_store();
      store_ = owned_.get();
    } else if (GetParam() == "grpc") {
      server_ = start_store_server("127.0.0.1", 0);
      owned_ = connect_store("127.0.0.1", server_->port(), milliseconds(5000));
      store_ = owned_.get();
    } else {
      base_ = create_in_memory_store();
      owned_ = create_prefix_store("group1", *base_);
      store_ = owned_.get();
    }
  }

  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<Store> base_;
  std::unique_ptr<Store> owned_;
  Store* store_ = nullptr;
};

TEST_P(StoreConformance, SetGetAndOverwrite) {
  store_->set("a", "1");
  EXPECT_EQ(store_->get("a", milliseconds(100)), "1");
  store_->set("a", std::string("x\0y", 3));
  EXPECT_EQ(store_->get("a", milliseconds(100)), std::string("x\0y", 3));
}

TEST_P(StoreConformance, GetWaitsForALaterSet) {
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    store_->set("late", "here");
  });
  EXPECT_EQ(store_->get("late", milliseconds(10000)), "here");
  setter.join();
}

TEST_P(StoreConformance, GetTimesOutNamingTheKey) {
  const auto start = Clock::now();
  Error e = expect_error([&] { store_->get("never", milliseconds(150)); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  EXPECT_GE(Clock::now() - start, milliseconds(140));
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

TEST_P(StoreConformance, AddCountsAndRejectsNonIntegers) {
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -2), 3);
  EXPECT_EQ(store_->get("n", milliseconds(10)), "3");
  store_->set("text", "abc");
  EXPECT_EQ(expect_error([&] { store_->add("text", 1); }).kind(), ErrorKind::kBadArgument);
}

TEST_P(StoreConformance, ConcurrentAddsAreAtomic) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) store_->add("counter", 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->add("counter", 0), 200);
}

TEST_P(StoreConformance, CompareSet) {
  EXPECT_EQ(store_->compare_set("k", "", "first"), "first");    // missing counts as ""
  EXPECT_EQ(store_->compare_set("k", "wrong", "second"), "first");
  EXPECT_EQ(store_->compare_set("k", "first", "second"), "second");
  EXPECT_EQ(store_->compare_set("absent", "x", "y"), "");
}

TEST_P(StoreConformance, DeleteAndCount) {
  const int64_t before = store_->num_keys();
  store_->set("d1", "v");
  store_->set("d2", "v");
  EXPECT_EQ(store_->num_keys(), before + 2);
  EXPECT_TRUE(store_->delete_key("d1"));
  EXPECT_FALSE(store_->delete_key("d1"));
  EXPECT_EQ(store_->num_keys(), before + 1);
  EXPECT_EQ(expect_error([&] { store_->get("d1", milliseconds(10)); }).kind(), ErrorKind::kTimeout);
}

TEST_P(StoreConformance, WaitForSeveralKeys) {
  store_->set("w1", "v");
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(30));
    store_->set("w2", "v");
  });
  store_->wait({"w1", "w2"}, milliseconds(10000));
  setter.join();
  Error e = expect_error([&] { store_->wait({"w1", "w3"}, milliseconds(50)); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_NE(std::string(e.what()).find("w3"), std::string::npos) << e.what();
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreConformance,
                         ::testing::Values("in_memory", "grpc", "prefix"),
                         [](const auto& info) { return info.param; });

TEST(PrefixStore, GroupsDoNotCollide) {
  auto base = create_in_memory_store();
  auto a = create_prefix_store("a", *base);
  auto b = create_prefix_store("b", *base);
  a->set("k", "from a");
  b->set("k", "from b");
  EXPECT_EQ(a->get("k", milliseconds(10)), "from a");
  EXPECT_EQ(b->get("k", milliseconds(10)), "from b");
  EXPECT_EQ(base->get("a/k", milliseconds(10)), "from a");
}

TEST(GrpcStore, UnreachableAtStartUpNamesTheAddress) {
  // A port that was free a moment ago: start a server, note its port, stop it.
  int port;
  {
    auto server = start_store_server("127.0.0.1", 0);
    port = server->port();
  }
  const auto start = Clock::now();
  Error e = expect_error([&] { connect_store("127.0.0.1", port, milliseconds(300)); });
  EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable);
  EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << e.what();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

TEST(GrpcStore, ServerShutdownWakesWaitersAndLaterCallsFail) {
  auto server = start_store_server("127.0.0.1", 0);
  auto client = connect_store("127.0.0.1", server->port(), milliseconds(5000));
  std::thread waiter([&] {
    Error e = expect_error([&] { client->get("never", milliseconds(30000)); });
    EXPECT_TRUE(e.kind() == ErrorKind::kShutdown || e.kind() == ErrorKind::kPeerUnavailable) << e.what();
  });
  std::this_thread::sleep_for(milliseconds(100));
  const auto start = Clock::now();
  server->shutdown();
  waiter.join();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  Error e = expect_error([&] { client->set("x", "y"); });
  EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
}

TEST(InMemoryStore, CloseWakesWaiters) {
  auto store = create_in_memory_store();
  std::thread waiter([&] {
    EXPECT_EQ(expect_error([&] { store->get("never", milliseconds(30000)); }).kind(), ErrorKind::kShutdown);
  });
  std::this_thread::sleep_for(milliseconds(50));
  store->close();
  waiter.join();
}

}  // namespace
}  // namespace drpc
