// The ProcessGroup conformance suite with ranks as threads over real gRPC on loopback,
// for world sizes 1 to 4, on each data plane (gRPC only, and UCX links between the ranks),
// with the default algorithms and with every allreduce forced through the chunked ring; then
// which link each pair chose, and the error cases.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "testing/errors.h"
#include "process_group/grpc_process_group.h"
#include "process_group/testing/conformance.h"
#include "process_group/testing/thread_group.h"

namespace drpc {
namespace {

using testing::contains;
using testing::expect_error;

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using testing::ThreadGroup;

GrpcProcessGroupOptions group_options(bool ring, const std::string& data_plane) {
  GrpcProcessGroupOptions options;
  options.data_plane = data_plane;
  if (ring) {
    options.ring_threshold_bytes = 0;  // every allreduce takes the ring...
    // ...in many odd-sized chunks; on UCX, chunks large enough to travel as bodies of their
    // own and land in place (the last of a segment often smaller, in the message's head).
    options.chunk_bytes = data_plane == "ucx" ? 100003 : 1000;
  }
  return options;
}

struct Param {
  int world_size;
  bool ring;
  std::string data_plane;
  std::string case_name;
};

// One group per (world size, variant, data plane), kept for all the cases that use it.
ThreadGroup& shared_group(int world_size, bool ring, const std::string& data_plane) {
  static std::map<std::tuple<int, bool, std::string>, ThreadGroup> groups;
  auto key = std::make_tuple(world_size, ring, data_plane);
  auto it = groups.find(key);
  if (it == groups.end()) {
    it = groups.emplace(key, testing::make_thread_group(world_size, group_options(ring, data_plane))).first;
    // The suite must run over the link it names: every pair chose it before start-up returned.
    for (auto& rank : it->second.ranks) {
      for (int peer = 0; peer < world_size; ++peer) {
        // On this host, UCX links move large tensors through shared memory.
        const std::string expected = peer == rank.group->rank() ? "self" : data_plane == "ucx" ? "ucx+shm" : data_plane;
        EXPECT_EQ(rank.group->link_to(peer), expected) << "rank " << rank.group->rank() << " to " << peer;
      }
    }
  }
  return it->second;
}

class Conformance : public ::testing::TestWithParam<Param> {};

TEST_P(Conformance, Case) {
  const Param& p = GetParam();
  ThreadGroup& group = shared_group(p.world_size, p.ring, p.data_plane);
  for (const auto& c : testing::conformance_cases(/*large_bytes=*/1 << 20)) {
    if (c.name != p.case_name) continue;
    for (const auto& failure : testing::run_on_ranks(group, c.run)) ADD_FAILURE() << failure;
    return;
  }
  FAIL() << "no case " << p.case_name;
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (const std::string plane : {"grpc", "ucx"}) {
    for (bool ring : {false, true}) {
      for (int world = 1; world <= 4; ++world) {
        for (const auto& c : testing::conformance_cases()) {
          if (world >= c.min_world_size) out.push_back({world, ring, plane, c.name});
        }
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(ThreadRanks, Conformance, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.data_plane + "_" + std::string(info.param.ring ? "ring_" : "") +
                                  "world" + std::to_string(info.param.world_size) + "_" + info.param.case_name;
                         });

// --- the data plane's choice ------------------------------------------------------------

// Ranks 0..n-1 join one group, rank r with data_plane planes[r]; returns each rank's
// link_to() of every rank.
std::vector<std::vector<std::string>> links_chosen(const std::vector<std::string>& planes,
                                                   int64_t shm_arena_bytes = int64_t{512} << 20) {
  auto store = create_in_memory_store();
  const int n = static_cast<int>(planes.size());
  std::vector<GroupEndpoints> ranks(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        GrpcProcessGroupOptions options;
        options.data_plane = planes[r];
        options.shm_arena_bytes = shm_arena_bytes;
        ranks[r] = create_grpc_group_endpoints(*store, r, n, options);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::vector<std::string>> links(n);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    if (!ranks[r].group) continue;
    for (int peer = 0; peer < n; ++peer) links[r].push_back(ranks[r].group->link_to(peer));
    // Frames flow both ways on whatever was chosen.
  }
  for (int r = 0; r < n; ++r) {
    if (!ranks[r].group) continue;
    threads[r] = std::thread([&, r] {
      at::Tensor t = at::full({1000}, static_cast<float>(r + 1));
      ranks[r].group->allreduce(t, ReduceOp::kSum)->wait();
      if (!t.equal(at::full({1000}, static_cast<float>(n * (n + 1) / 2)))) errors[r] = "wrong allreduce sum";
      ranks[r].group->barrier()->wait();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (auto& rank : ranks) {
    if (rank.group) rank.group->shutdown();
  }
  return links;
}

TEST(DataPlane, AutoLinksRanksOnThisHostOverUcx) {
  const auto links = links_chosen({"auto", "auto", "auto"});
  ASSERT_EQ(links.size(), 3u);
  EXPECT_EQ(links[0], (std::vector<std::string>{"self", "ucx+shm", "ucx+shm"}));
  EXPECT_EQ(links[2], (std::vector<std::string>{"ucx+shm", "ucx+shm", "self"}));
}

TEST(DataPlane, WithoutAnArenaLargeTensorsStayOnUcxMessages) {
  const auto links = links_chosen({"auto", "auto"}, /*shm_arena_bytes=*/0);
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0], (std::vector<std::string>{"self", "ucx"}));
  EXPECT_EQ(links[1], (std::vector<std::string>{"ucx", "self"}));
}

TEST(DataPlane, APairStaysOnGrpcWhenEitherSideAsksForIt) {
  const auto links = links_chosen({"grpc", "auto", "ucx"});
  ASSERT_EQ(links.size(), 3u);
  EXPECT_EQ(links[0], (std::vector<std::string>{"self", "grpc", "grpc"}));
  EXPECT_EQ(links[1], (std::vector<std::string>{"grpc", "self", "ucx+shm"}));
  EXPECT_EQ(links[2], (std::vector<std::string>{"grpc", "ucx+shm", "self"}));
}

TEST(DataPlane, APairWhoseUcxLinkCannotOpenStaysOnGrpcAndWorks) {
  // Rank 0 asks for UCX but may use only UCX's TCP transport (UCX_TLS); rank 1 ("auto") offers
  // only shared memory. Neither can reach the other over UCX: both directions stay on gRPC,
  // and the allreduce in links_chosen still runs.
  setenv("UCX_TLS", "tcp", 1);
  const auto links = links_chosen({"ucx", "auto"});
  unsetenv("UCX_TLS");
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0], (std::vector<std::string>{"self", "grpc"}));
  EXPECT_EQ(links[1], (std::vector<std::string>{"grpc", "self"}));
}

TEST(DataPlane, UnknownNameIsRefused) {
  auto store = create_in_memory_store();
  GrpcProcessGroupOptions options;
  options.data_plane = "infiniband";
  Error e = expect_error([&] { create_grpc_process_group(*store, 0, 1, options); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "infiniband")) << e.what();
}

TEST(DataPlane, LinkToRejectsRanksOutOfRange) {
  auto group = testing::make_thread_group(1);
  Error e = expect_error([&] { group.ranks[0].group->link_to(1); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
}

// --- errors ----------------------------------------------------------------------------

TEST(ProcessGroupErrors, RankOutOfRange) {
  auto store = create_in_memory_store();
  Error e = expect_error([&] { create_grpc_process_group(*store, 3, 3, {}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "rank 3")) << e.what();
  e = expect_error([&] { create_grpc_process_group(*store, -1, 3, {}); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
}

TEST(ProcessGroupErrors, PeersThatNeverComeTimeOutAtStartUp) {
  auto store = create_in_memory_store();
  GrpcProcessGroupOptions options;
  options.timeout = milliseconds(300);
  const auto start = Clock::now();
  Error e = expect_error([&] { create_grpc_process_group(*store, 0, 2, options); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));

  // connect_timeout, when set, is start-up's deadline instead.
  options.timeout = milliseconds(60000);
  options.connect_timeout = milliseconds(300);
  auto fresh_store = create_in_memory_store();  // rank 0 joined the first one already
  const auto again = Clock::now();
  e = expect_error([&] { create_grpc_process_group(*fresh_store, 0, 2, options); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
  EXPECT_LT(Clock::now() - again, milliseconds(5000));
}

// Ranks 0..n-1 run `fn`; each must throw an Error of `kind` whose message has `part`.
void expect_error_on_every_rank(ThreadGroup& group, ErrorKind kind, const std::string& part,
                                const std::function<void(ProcessGroup&)>& fn) {
  auto failures = testing::run_on_ranks(group, [&](ProcessGroup& g) {
    try {
      fn(g);
    } catch (const Error& e) {
      if (e.kind() != kind || !contains(e.what(), part)) {
        throw std::runtime_error(std::string("wrong error: ") + e.what());
      }
      return;
    }
    throw std::runtime_error("no error");
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(ProcessGroupErrors, ShapeMismatchIsReportedOnEveryRank) {
  for (bool ring : {false, true}) {
    ThreadGroup group = testing::make_thread_group(3, ring ? group_options(/*ring=*/true, "auto") : GrpcProcessGroupOptions{});
    const auto start = Clock::now();
    expect_error_on_every_rank(group, ErrorKind::kMismatch, "Float[", [](ProcessGroup& g) {
      at::Tensor t = at::ones({g.rank() == 2 ? 5000 : 4000});
      g.allreduce(t, ReduceOp::kSum)->wait();
    });
    EXPECT_LT(Clock::now() - start, milliseconds(10000)) << "waited for the timeout instead of aborting";
    // The group stays usable after a detected mismatch.
    auto failures = testing::run_on_ranks(group, [](ProcessGroup& g) {
      at::Tensor t = at::ones({10});
      g.allreduce(t, ReduceOp::kSum)->wait();
      if (!t.eq(3).all().item<bool>()) throw std::runtime_error("wrong sum after a mismatch");
    });
    for (const auto& f : failures) ADD_FAILURE() << f;
  }
}

TEST(ProcessGroupErrors, DtypeAndOperationMismatches) {
  ThreadGroup group = testing::make_thread_group(2);
  expect_error_on_every_rank(group, ErrorKind::kMismatch, "Double[3]", [](ProcessGroup& g) {
    at::Tensor t = at::ones({3}, g.rank() == 0 ? at::kFloat : at::kDouble);
    g.allreduce(t, ReduceOp::kSum)->wait();
  });
  expect_error_on_every_rank(group, ErrorKind::kMismatch, "MAX", [](ProcessGroup& g) {
    at::Tensor t = at::ones({3});
    g.allreduce(t, g.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax)->wait();
  });
  expect_error_on_every_rank(group, ErrorKind::kMismatch, "broadcast", [](ProcessGroup& g) {
    at::Tensor t = at::ones({3});
    (g.rank() == 0 ? g.broadcast(t, 0) : g.allreduce(t, ReduceOp::kSum))->wait();
  });
}

TEST(ProcessGroupErrors, CollectiveTimesOutAndTheLateRankLearnsWhy) {
  GrpcProcessGroupOptions options;
  options.timeout = milliseconds(300);
  options.connect_timeout = milliseconds(30000);  // the ranks' start-up is not what times out here
  ThreadGroup group = testing::make_thread_group(2, options);
  at::Tensor t = at::ones({4});
  const auto start = Clock::now();
  Error e = expect_error([&] { group.ranks[0].group->allreduce(t, ReduceOp::kSum)->wait(); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_TRUE(contains(e.what(), "300 ms") && contains(e.what(), "rank 1")) << e.what();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  // Rank 1 arrives late: it fails at once with rank 0's reason instead of waiting. (The
  // p2p message travels behind rank 0's abort on the same stream: once it is here, so is
  // the abort. Without it the late rank could still combine rank 0's data, sent earlier.)
  group.ranks[0].group->send({at::ones({1})}, 1, 77)->wait();
  group.ranks[1].group->recv({at::empty({1})}, 0, 77)->wait(milliseconds(5000));
  e = expect_error([&] { group.ranks[1].group->allreduce(t, ReduceOp::kSum)->wait(); });
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_TRUE(contains(e.what(), "rank 0")) << e.what();
}

TEST(ProcessGroupErrors, PeerThatLeavesMidCollectiveFailsTheOthers) {
  GrpcProcessGroupOptions options;
  options.timeout = milliseconds(30000);
  ThreadGroup group = testing::make_thread_group(3, options);
  std::vector<at::Tensor> tensors = {at::ones({1 << 16}), at::ones({1 << 16})};
  auto w0 = group.ranks[0].group->allreduce(tensors[0], ReduceOp::kSum);
  auto w1 = group.ranks[1].group->allreduce(tensors[1], ReduceOp::kSum);
  const auto start = Clock::now();
  group.ranks[2].group->shutdown();
  for (auto& w : {w0, w1}) {
    Error e = expect_error([&] { w->wait(milliseconds(10000)); });
    EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
    EXPECT_TRUE(contains(e.what(), "rank 2")) << e.what();
  }
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  // Point-to-point with the gone rank fails too; with the live one it still works.
  Error e = expect_error([&] { group.ranks[0].group->recv({at::empty({1})}, 2, 1)->wait(milliseconds(5000)); });
  EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable);
  group.ranks[1].group->send({at::full({1}, 7.0)}, 0, 3)->wait();
  at::Tensor got = at::empty({1});
  group.ranks[0].group->recv({got}, 1, 3)->wait(milliseconds(5000));
  EXPECT_EQ(got.item<double>(), 7.0);
}

TEST(ProcessGroupErrors, BadArgumentsAreRejected) {
  ThreadGroup group = testing::make_thread_group(2);
  ProcessGroup& g = *group.ranks[0].group;
  EXPECT_EQ(expect_error([&] { g.allreduce(at::ones({2}, at::kBool), ReduceOp::kAvg); }).kind(),
            ErrorKind::kBadArgument);
  EXPECT_EQ(expect_error([&] { g.send({at::ones({1})}, 0, 1); }).kind(), ErrorKind::kBadArgument);
  EXPECT_EQ(expect_error([&] { g.send({at::ones({1})}, 5, 1); }).kind(), ErrorKind::kBadArgument);
  EXPECT_EQ(expect_error([&] { g.broadcast(at::ones({1}), 2); }).kind(), ErrorKind::kBadArgument);
  EXPECT_EQ(expect_error([&] { g.allreduce(at::Tensor(), ReduceOp::kSum); }).kind(), ErrorKind::kBadArgument);
  // A receive whose preallocated tensor does not match what arrives.
  group.ranks[1].group->send({at::ones({3})}, 0, 9)->wait();
  Error e = expect_error([&] { g.recv({at::empty({4})}, 1, 9)->wait(milliseconds(5000)); });
  EXPECT_EQ(e.kind(), ErrorKind::kMismatch);
  EXPECT_TRUE(contains(e.what(), "Float[4]") && contains(e.what(), "Float[3]")) << e.what();
}

TEST(ProcessGroupErrors, EverythingFailsAfterShutdown) {
  ThreadGroup group = testing::make_thread_group(2);
  ProcessGroup& g = *group.ranks[0].group;
  auto pending = g.recv_any(5);
  g.shutdown();
  g.shutdown();  // idempotent
  EXPECT_EQ(expect_error([&] { pending->wait(milliseconds(5000)); }).kind(), ErrorKind::kShutdown);
  EXPECT_EQ(expect_error([&] { g.allreduce(at::ones({1}), ReduceOp::kSum)->wait(); }).kind(),
            ErrorKind::kShutdown);
  EXPECT_EQ(expect_error([&] {
              group.ranks[0].messages->send_message(1, PgMessage{"x", {}});
            }).kind(),
            ErrorKind::kShutdown);
}

TEST(ProcessGroupBarrier, NoRankLeavesBeforeAllArrive) {
  ThreadGroup group = testing::make_thread_group(4);
  std::atomic<int> arrived{0};
  auto failures = testing::run_on_ranks(group, [&](ProcessGroup& g) {
    for (int round = 1; round <= 5; ++round) {
      if (g.rank() == round % 4) std::this_thread::sleep_for(milliseconds(20));  // a straggler
      arrived.fetch_add(1);
      g.barrier()->wait();
      if (arrived.load() < 4 * round) throw std::runtime_error("left the barrier early");
      g.barrier()->wait();  // keeps the next round's increments out of this round's check
    }
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace drpc
