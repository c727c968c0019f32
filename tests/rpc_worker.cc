// A worker process for rpc_multiprocess_test.
//   rpc_worker --rank=R --world_size=N --store_port=P --scenario=S
// Exits 0 when the scenario's checks pass; prints what failed otherwise.

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <unistd.h>
#include <thread>

#include "drpc.h"
#include "process_group/grpc_store.h"
#include "tests/rref_workload.h"

DEFINE_int32(rank, 0, "rank");
DEFINE_int32(world_size, 3, "world size");
DEFINE_int32(store_port, 0, "the test's store on 127.0.0.1");
DEFINE_string(scenario, "calls",
              "calls | peer_killed | rrefs | backward_killed | netns | long_job | shutdown_order");
DEFINE_string(master_addr, "127.0.0.1", "netns: where rank 0 serves the store");
DEFINE_string(listen, "127.0.0.1", "netns: this worker's address");
DEFINE_string(sync_dir, "", "netns: a directory shared with the test for ready/cut/done files");

using namespace drpc;
using std::chrono::milliseconds;

DRPC_REGISTER_FUNCTION("test.die", []() -> int64_t {
  raise(SIGKILL);
  return 0;
});
DRPC_REGISTER_FUNCTION("test.die_in_backward", [](at::Tensor x) {
  at::Tensor y = x * 3;
  y.register_hook([](at::Tensor g) -> at::Tensor {
    raise(SIGKILL);
    return g;
  });
  return y;
});
DRPC_REGISTER_FUNCTION("test.rank_plus", [](at::Tensor t) { return t + get_worker_info().id; });
// A value owned here that holds an RRef owned elsewhere, and a use of that inner RRef.
DRPC_REGISTER_FUNCTION("test.wrap", [](c10::IValue rref) {
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(rref);
  return c10::IValue(list);
});
DRPC_REGISTER_FUNCTION("test.unwrap_sum", [](c10::IValue list) {
  return RRef::from_ivalue(list.toListRef()[0]).to_here().toTensor().sum().item<double>();
});

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "worker" << FLAGS_rank << ": FAILED " << what << "\n";
    ++failures;
  }
}

std::string name(int r) { return "worker" + std::to_string(r); }

// Every worker calls every other (and itself) many times at once, then leaves gracefully
// while its last calls may still be in flight elsewhere.
void calls() {
  std::vector<FuturePtr> futures;
  std::vector<double> expected;
  for (int i = 0; i < 300; ++i) {
    const int to = i % FLAGS_world_size;
    futures.push_back(rpc_async(name(to), i % 2 ? "test.rank_plus" : "aten::add",
                                i % 2 ? std::vector<c10::IValue>{at::full({4}, double(i))}
                                      : std::vector<c10::IValue>{at::full({4}, double(i)), at::ones({4})}));
    expected.push_back(i % 2 ? i + to : i + 1);
  }
  auto values = wait_all(futures);
  for (size_t i = 0; i < values.size(); ++i) {
    check(at::equal(values[i].toTensor(), at::full({4}, expected[i])), "call " + std::to_string(i));
  }
  // A last burst that is still in flight when shutdown starts: graceful shutdown waits.
  auto last = rpc_async(name((FLAGS_rank + 1) % FLAGS_world_size), "aten::mul", {at::full({2}, 3.0), 2.0});
  shutdown(true);
  check(last->completed() && !last->hasError() && at::equal(last->value().toTensor(), at::full({2}, 6.0)),
        "the call in flight at shutdown");
}

// worker1 dies inside a call from worker0; worker0's pending calls to it fail within 2 s
// naming it, and worker0 and worker2 keep working.
void peer_killed() {
  if (FLAGS_rank != 0) {
    process_group().barrier()->wait();  // the job is up
    if (FLAGS_rank == 2) {
      // Wait for worker0's verdict, then leave.
      at::Tensor done = at::empty({1});
      process_group().recv({done}, 0, 99)->wait();
      shutdown(false);
    } else {
      // worker1: serve until killed.
      process_group().recv({at::empty({1})}, 0, 98)->wait();
    }
    return;
  }
  process_group().barrier()->wait();
  auto slow = rpc_async(name(1), "test.rank_plus", {at::ones({1})}, {}, milliseconds(60000));
  slow->wait();
  const auto start = std::chrono::steady_clock::now();
  auto dying = rpc_async(name(1), "test.die", {}, {}, milliseconds(60000));
  dying->wait();
  const auto took = std::chrono::steady_clock::now() - start;
  check(dying->hasError(), "a call to a killed worker failed");
  try {
    dying->value();
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kPeerUnavailable, std::string("kind PeerUnavailable: ") + e.what());
    check(std::string(e.what()).find("worker1") != std::string::npos, std::string("names worker1: ") + e.what());
  }
  check(took < milliseconds(2000), "failed within 2 s");
  try {
    rpc_sync(name(1), "aten::add", {at::ones({1}), at::ones({1})});
    check(false, "later calls to the dead worker fail");
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kPeerUnavailable, std::string("later call: ") + e.what());
  }
  check(at::equal(rpc_sync(name(2), "test.rank_plus", {at::ones({1})}).toTensor(), at::full({1}, 3.0)),
        "worker2 still serves");
  process_group().send({at::ones({1})}, 2, 99)->wait();
  shutdown(false);
}

// Every worker creates RRefs on the next one, shares them with the one after, and
// drops them; in the end no worker owns or references anything.
void rrefs() {
  testing::exchange_rrefs(FLAGS_rank, FLAGS_world_size, 20, 25, check);
  process_group().barrier()->wait();
  check(testing::every_worker_released(FLAGS_world_size, milliseconds(30000)), "every RRef released on every worker");
  shutdown(true);
}

// worker2 dies inside the distributed backward; worker0's backward fails naming it, and
// worker1 keeps serving.
void backward_killed() {
  if (FLAGS_rank != 0) {
    process_group().barrier()->wait();
    if (FLAGS_rank == 1) {
      process_group().recv({at::empty({1})}, 0, 97)->wait();  // until worker0 is done
      shutdown(false);
    } else {
      process_group().recv({at::empty({1})}, 0, 96)->wait();  // serves until killed
    }
    return;
  }
  process_group().barrier()->wait();
  at::Tensor x = at::ones({3}).set_requires_grad(true);
  {
    dist_autograd::Context ctx;
    at::Tensor h = rpc_sync(name(1), "test.rank_plus", {x}).toTensor();
    at::Tensor y = rpc_sync(name(2), "test.die_in_backward", {h}).toTensor();
    const auto start = std::chrono::steady_clock::now();
    try {
      dist_autograd::backward(ctx.id(), {y.sum()});
      check(false, "backward through a killed worker fails");
    } catch (const Error& e) {
      check(e.kind() == ErrorKind::kPeerUnavailable, std::string("kind: ") + e.what());
      check(std::string(e.what()).find("worker2") != std::string::npos, std::string("names worker2: ") + e.what());
    }
    check(std::chrono::steady_clock::now() - start < milliseconds(5000), "fails within 5 s");
  }
  check(at::equal(rpc_sync(name(1), "test.rank_plus", {at::ones({1})}).toTensor(), at::full({1}, 2.0)),
        "worker1 still serves");
  process_group().send({at::ones({1})}, 1, 97)->wait();
  shutdown(false);
}

// The job's timeouts (see main): the trainer works for several times both, calling the
// serving workers, which wait in shutdown all along and must not leave before it is done.
constexpr milliseconds kShortInitTimeout{4000};
constexpr milliseconds kShortRpcTimeout{1000};

void long_job() {
  if (FLAGS_rank != 0) {
    const auto start = std::chrono::steady_clock::now();
    shutdown(true);
    check(std::chrono::steady_clock::now() - start > 2 * kShortInitTimeout, "waited in shutdown for the trainer");
    return;
  }
  const auto until = std::chrono::steady_clock::now() + 3 * kShortInitTimeout;
  int calls = 0;
  at::Tensor x = at::rand({64, 64});
  while (std::chrono::steady_clock::now() < until) {
    x = at::tanh(at::matmul(x, x.t()) / 64);  // the trainer's own work
    for (int r = 1; r < FLAGS_world_size; ++r) {
      try {
        // Its own deadline: the short default must outlast the job in shutdown, not be hit
        // by a call that a loaded machine slows.
        x = rpc_sync(name(r), "aten::mul", {x, 1.0}, {}, milliseconds(30000)).toTensor();
        ++calls;
      } catch (const Error& e) {
        check(false, std::string("a call while the others wait in shutdown: ") + e.what());
        return;
      }
    }
  }
  check(calls > 0, "calls made");
  shutdown(true);
}

// worker1 owns a list holding an RRef owned by worker2, and enters shutdown at once;
// worker0, which dropped its own reference to the inner RRef, keeps using the list
// afterwards: nothing may be deleted until every worker has reached shutdown.
void shutdown_order() {
  if (FLAGS_rank != 0) {
    if (FLAGS_rank == 1) current_runtime().store().set("worker1_in_shutdown", "1");
    shutdown(true);
    return;
  }
  RRef list;
  {
    RRef inner = remote(name(2), "aten::ones", {c10::List<int64_t>({3})});
    list = remote(name(1), "test.wrap", {inner.to_ivalue()});
    check(list.rpc_sync("test.unwrap_sum").toDouble() == 3.0, "the inner RRef's value through the list");
  }
  current_runtime().store().get("worker1_in_shutdown", milliseconds(30000));
  // Once worker1 is in shutdown, an early delete of its references would free the inner
  // value on worker2 within milliseconds; give it time to go wrong, bounded.
  const auto until = std::chrono::steady_clock::now() + milliseconds(1500);
  bool alive = true;
  while (alive && std::chrono::steady_clock::now() < until) {
    alive = rpc_sync(name(2), "test.rref_counts").toIntVector()[0] == 1;  // worker2 still owns it
  }
  check(alive, "worker2 keeps the value while worker1 waits in shutdown");
  try {
    check(list.rpc_sync("test.unwrap_sum").toDouble() == 3.0, "the list is still usable");
  } catch (const Error& e) {
    check(false, std::string("using the list after worker1 entered shutdown: ") + e.what());
  }
  list = RRef();
  shutdown(true);
}

bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

void touch(const std::string& path) { std::fclose(std::fopen(path.c_str(), "w")); }

// Waits (bounded) for the test to create `path`.
bool wait_for_file(const std::string& path, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!file_exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

// Each worker in its own network namespace: calls work across them; once the test cuts
// worker2's link, a call to it fails with a clear error within its timeout while
// worker1 keeps answering.
void netns() {
  const std::string dir = FLAGS_sync_dir;
  if (FLAGS_rank != 0) {
    check(wait_for_file(dir + "/done", milliseconds(120000)), "worker0 finished");
    shutdown(false);
    return;
  }
  for (int r = 1; r < 3; ++r) {
    check(at::equal(rpc_sync(name(r), "test.rank_plus", {at::ones({2})}).toTensor(), at::full({2}, 1.0 + r)),
          "a call across namespaces to " + name(r));
  }
  touch(dir + "/ready");
  check(wait_for_file(dir + "/cut", milliseconds(60000)), "the test cut worker2's link");
  const auto start = std::chrono::steady_clock::now();
  try {
    rpc_sync(name(2), "test.rank_plus", {at::ones({2})}, {}, milliseconds(3000));
    check(false, "a call over a cut link fails");
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kTimeout || e.kind() == ErrorKind::kPeerUnavailable, std::string("kind: ") + e.what());
    check(std::string(e.what()).find("worker2") != std::string::npos, std::string("names worker2: ") + e.what());
    std::cerr << "worker0 got: " << e.what() << "\n";
  }
  check(std::chrono::steady_clock::now() - start < milliseconds(6000), "within the timeout");
  check(at::equal(rpc_sync(name(1), "test.rank_plus", {at::ones({2})}).toTensor(), at::full({2}, 2.0)),
        "worker1 still answers");
  touch(dir + "/done");
  shutdown(false);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  try {
    Options options;
    options.master_port = FLAGS_store_port;
    options.host_store = false;
    if (FLAGS_scenario == "netns") {  // rank 0 serves the store at its own address
      options.master_addr = FLAGS_master_addr;
      options.listen_host = FLAGS_listen;
      options.host_store = true;
    }
    options.init_timeout = milliseconds(30000);
    if (FLAGS_scenario == "long_job") {
      options.init_timeout = kShortInitTimeout;
      options.rpc_timeout = kShortRpcTimeout;
      // The short init timeout is for the job's life, not for how far apart a loaded machine
      // starts the processes: they meet in the test's store first.
      auto meeting = connect_store("127.0.0.1", FLAGS_store_port, milliseconds(30000));
      meeting->set("long_job/started/" + std::to_string(FLAGS_rank), "1");
      std::vector<std::string> everyone;
      for (int r = 0; r < FLAGS_world_size; ++r) everyone.push_back("long_job/started/" + std::to_string(r));
      meeting->wait(everyone, milliseconds(60000));
    }
    init_rpc(name(FLAGS_rank), FLAGS_rank, FLAGS_world_size, options);
    if (FLAGS_scenario == "peer_killed") {
      peer_killed();
    } else if (FLAGS_scenario == "netns") {
      netns();
    } else if (FLAGS_scenario == "backward_killed") {
      backward_killed();
    } else if (FLAGS_scenario == "rrefs") {
      rrefs();
    } else if (FLAGS_scenario == "long_job") {
      long_job();
    } else if (FLAGS_scenario == "shutdown_order") {
      shutdown_order();
    } else {
      calls();
    }
  } catch (const std::exception& e) {
    std::cerr << "worker" << FLAGS_rank << ": " << e.what() << "\n";
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
