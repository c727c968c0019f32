// A worker process for chaos_test: real workers on real ports, with faults made real too
// (SIGKILL, SIGSTOP, a master that dies, control messages lost and reordered).
//   chaos_worker --rank=R --world_size=N --store_port=P --scenario=S
// Exits 0 when the scenario's checks pass; prints what failed otherwise.

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iostream>
#include <thread>

#include "drpc.h"
#include "process_group/grpc_store.h"
#include "rpc/faulty_agent.h"
#include "rpc/process_group_agent.h"
#include "rref/rref_context.h"
#include "tests/rref_workload.h"

DEFINE_int32(rank, 0, "rank");
DEFINE_int32(world_size, 3, "world size");
DEFINE_int32(store_port, 0, "the test's store on 127.0.0.1");
DEFINE_string(scenario, "", "callee_killed | stopped | master_killed | rref_faults | owner_killed");

using namespace drpc;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The callee of callee_killed dies in the middle of its 400th call.
DRPC_REGISTER_FUNCTION("chaos.count_then_die", [](at::Tensor t) {
  static std::atomic<int> calls{0};
  if (calls.fetch_add(1) + 1 == 400) raise(SIGKILL);
  return t + 1;
});
DRPC_REGISTER_FUNCTION("test.die_now", []() -> int64_t {
  raise(SIGKILL);
  return 0;
});
DRPC_REGISTER_FUNCTION("chaos.getpid", []() -> int64_t { return getpid(); });
// Stops the whole process: alive (its sockets stay open) but silent.
DRPC_REGISTER_FUNCTION("chaos.stop", []() -> int64_t {
  raise(SIGSTOP);
  return 0;
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

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The error a completed future holds ("" if none).
std::string error_of(const FuturePtr& f, ErrorKind* kind) {
  if (!f->hasError()) return "";
  try {
    std::rethrow_exception(f->exception_ptr());
  } catch (const Error& e) {
    *kind = e.kind();
    return e.what();
  } catch (const std::exception& e) {
    *kind = ErrorKind::kInternal;
    return e.what();
  }
}

// Both survivors call each other, then wait for each other before leaving.
void survivors_finish(int other) {
  for (int i = 0; i < 50; ++i) {
    at::Tensor r = rpc_sync(name(other), "aten::add", {at::full({3}, double(i)), at::ones({3})}).toTensor();
    check(at::equal(r, at::full({3}, i + 1.0)), "survivor call " + std::to_string(i) + " to " + name(other));
  }
  process_group().send({at::ones({1})}, other, 90)->wait();
  process_group().recv({at::empty({1})}, other, 90)->wait();
  shutdown(false);
}

// worker1 is SIGKILLed in the middle of a stream of calls from worker0 and worker2: every
// call still pending fails within 2 s naming worker1, and the two keep serving each other.
void callee_killed() {
  process_group().barrier()->wait();
  if (FLAGS_rank == 1) {
    process_group().recv({at::empty({1})}, 0, 98)->wait();  // serves until killed
    return;
  }
  std::deque<FuturePtr> window;
  Clock::time_point last_ok = Clock::now();
  int ok = 0;
  std::string first_error;
  ErrorKind kind = ErrorKind::kInternal;
  while (first_error.empty()) {
    while (window.size() < 8) {
      window.push_back(
          rpc_async(name(1), "chaos.count_then_die", {at::full({2}, double(ok))}, {}, milliseconds(60000)));
    }
    FuturePtr f = window.front();
    window.pop_front();
    f->wait();
    first_error = error_of(f, &kind);
    if (first_error.empty()) {
      last_ok = Clock::now();
      ++ok;
    }
  }
  // The rest were in flight: answered before the kill (worker1 serves on several
  // threads, so later calls may have been) or failed naming worker1.
  for (auto& f : window) {
    f->wait();
    ErrorKind k = ErrorKind::kInternal;
    const std::string e = error_of(f, &k);
    if (e.empty()) {
      last_ok = Clock::now();
      ++ok;
      continue;
    }
    check(k == ErrorKind::kPeerUnavailable && contains(e, "worker1"), "a pending call fails naming worker1: " + e);
  }
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - last_ok);
  std::cerr << "worker" << FLAGS_rank << ": " << ok << " calls answered; every pending call failed "
            << took.count() << " ms after the last answer: " << first_error << "\n";
  check(ok > 0, "some calls were answered before the kill");
  check(kind == ErrorKind::kPeerUnavailable, "kind PeerUnavailable: " + first_error);
  check(contains(first_error, "worker1"), "names worker1: " + first_error);
  check(took < milliseconds(2000), "pending calls failed within 2 s (took " + std::to_string(took.count()) + " ms)");
  survivors_finish(FLAGS_rank == 0 ? 2 : 0);
}

// The stopped scenario's heartbeat timing, stretched where a sanitizer pauses processes:
// ThreadSanitizer symbolizes on each process's first report (suppressed ones too), which
// with libtorch's ~300 shared libraries stalls its network threads for seconds. .bazelrc
// sets DRPC_TEST_TIME_SCALE for --config=tsan and --config=asan.
int time_scale() {
  const char* scale = std::getenv("DRPC_TEST_TIME_SCALE");
  return scale ? std::max(1, std::atoi(scale)) : 1;
}

char process_state(int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm;
  char state = '?';
  stat >> pid_field >> comm >> state;
  return state;
}

// worker1 stops (SIGSTOP) inside a call: its connections stay open but it says nothing.
// The heartbeat declares it failed: the call fails long before its 60 s deadline.
void stopped() {
  process_group().barrier()->wait();
  if (FLAGS_rank == 1) {
    process_group().recv({at::empty({1})}, 0, 98)->wait();  // until killed
    return;
  }
  if (FLAGS_rank == 2) {
    process_group().recv({at::empty({1})}, 0, 99)->wait();
    shutdown(false);
    return;
  }
  // Before getpid: worker1 was heard from at its reply at the latest, so the heartbeat
  // window runs from after `start`, however late this thread wakes.
  const auto start = Clock::now();
  const int64_t pid = rpc_sync(name(1), "chaos.getpid").toInt();
  FuturePtr call = rpc_async(name(1), "chaos.stop", {}, {}, milliseconds(60000));
  call->wait();
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  ErrorKind kind = ErrorKind::kInternal;
  const std::string error = error_of(call, &kind);
  std::cerr << "worker0: the call to the stopped worker failed after " << took.count() << " ms: " << error << "\n";
  check(process_state(pid) == 'T', "worker1 was stopped, not dead (state " + std::string(1, process_state(pid)) + ")");
  check(kind == ErrorKind::kPeerUnavailable, "kind PeerUnavailable: " + error);
  check(contains(error, "worker1") && contains(error, "heartbeat"), "names worker1 and the heartbeat: " + error);
  // The window is 5 x 200 ms (x time_scale()); allow for a loaded machine, but far below
  // the deadline.
  check(took >= milliseconds(900 * time_scale()) && took < milliseconds(6000 * time_scale()),
        "declared failed after the heartbeat window");
  try {
    rpc_sync(name(1), "aten::neg", {at::ones({1})}, {}, milliseconds(60000));
    check(false, "later calls to the stopped worker fail");
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kPeerUnavailable, std::string("later call: ") + e.what());
  }
  kill(static_cast<pid_t>(pid), SIGKILL);
  check(at::equal(rpc_sync(name(2), "aten::neg", {at::ones({1})}).toTensor(), -at::ones({1})), "worker2 still serves");
  process_group().send({at::ones({1})}, 2, 99)->wait();
  shutdown(false);
}

// worker0 is the master (it hosts the job's store) and dies after start-up. Calls between
// worker1 and worker2 go on through its death; what needs the store fails clearly.
void master_killed(Store& coordination) {
  process_group().barrier()->wait();
  if (FLAGS_rank == 0) {
    process_group().recv({at::empty({1})}, 1, 97)->wait();
    raise(SIGKILL);
  }
  if (FLAGS_rank == 2) {
    process_group().recv({at::empty({1})}, 1, 96)->wait();
    shutdown(false);
    return;
  }
  // worker1: a stream of calls to worker2 that runs across the master's death.
  std::atomic<bool> stop{false}, master_gone{false};
  std::atomic<int> answered{0}, answered_after{0}, errors{0};
  std::string stream_error;
  std::thread stream([&] {
    for (int i = 0; !stop; ++i) {
      try {
        at::Tensor r = rpc_sync(name(2), "aten::add", {at::full({2}, double(i)), at::ones({2})}).toTensor();
        if (!at::equal(r, at::full({2}, i + 1.0))) throw std::runtime_error("wrong result");
        ++answered;
        if (master_gone) ++answered_after;
      } catch (const std::exception& e) {
        if (errors++ == 0) stream_error = e.what();
      }
    }
  });
  while (answered < 20) std::this_thread::yield();
  process_group().send({at::ones({1})}, 0, 97)->wait();  // die now
  std::string master_error;
  const auto deadline = Clock::now() + milliseconds(15000);
  while (master_error.empty() && Clock::now() < deadline) {
    try {
      rpc_sync(name(0), "aten::neg", {at::ones({1})}, {}, milliseconds(15000));
    } catch (const Error& e) {
      check(e.kind() == ErrorKind::kPeerUnavailable && contains(e.what(), "worker0"),
            std::string("calls to the dead master fail naming it: ") + e.what());
      master_error = e.what();
    }
  }
  check(!master_error.empty(), "the master's death was noticed");
  master_gone = true;
  try {
    current_runtime().store().set("after", "x");
    check(false, "the store is gone with its master");
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kPeerUnavailable && contains(e.what(), "store"),
          std::string("store calls fail clearly: ") + e.what());
    std::cerr << "worker1: store after the master's death: " << e.what() << "\n";
  }
  while (answered_after < 50) std::this_thread::yield();
  stop = true;
  stream.join();
  std::cerr << "worker1: " << answered << " calls to worker2 answered, " << answered_after
            << " after the master died, " << errors << " failed\n";
  check(errors == 0, "no call between the survivors failed: " + stream_error);
  process_group().send({at::ones({1})}, 2, 96)->wait();
  shutdown(false);
  (void)coordination;
}

// worker1 owns an RRef worker0 holds, holds one worker0 owns, and created an autograd
// context that reached worker0; then it dies. On worker0 the RRef it owned fails with an
// error naming it, the value it referenced is freed and its context is reclaimed.
void owner_killed() {
  if (FLAGS_rank == 1) {
    RRef held = remote(name(0), "aten::ones", {c10::List<int64_t>({1000})});
    held.to_here();
    dist_autograd::Context ctx;
    rpc_sync(name(0), "aten::mul", {at::ones({2}).set_requires_grad(true), 2.0});
    process_group().send({at::ones({1})}, 0, 95)->wait();  // ready
    process_group().recv({at::empty({1})}, 0, 94)->wait();  // until killed
    return;
  }
  RRef theirs = remote(name(1), "aten::ones", {c10::List<int64_t>({3})});
  check(theirs.to_here().toTensor().numel() == 3, "the RRef on worker1 works while it lives");
  process_group().recv({at::empty({1})}, 1, 95)->wait();
  Runtime& me = current_runtime();
  check(me.rref_counts().owners == 1 && me.rref_counts().owner_values == 1, "worker0 owns worker1's RRef");
  check(me.autograd().num_contexts() == 1, "worker1's autograd context reached worker0");
  FuturePtr death = rpc_async(name(1), "test.die_now");
  death->wait();
  check(death->hasError(), "the call that killed worker1 failed");
  // The agent runs the layers' cleanup before it fails the pending calls.
  const RRefCounts counts = me.rref_counts();
  check(counts.owners == 0 && counts.owner_values == 0,
        "the RRef only worker1 referenced is freed (owners " + std::to_string(counts.owners) + ", values " +
            std::to_string(counts.owner_values) + ")");
  check(me.autograd().num_contexts() == 0, "worker1's autograd context is reclaimed");
  try {
    theirs.to_here();
    check(false, "an RRef owned by a dead worker fails on use");
  } catch (const Error& e) {
    check(e.kind() == ErrorKind::kPeerUnavailable && contains(e.what(), "worker1") && contains(e.what(), "lost"),
          std::string("names the owner: ") + e.what());
    std::cerr << "worker0: to_here on the dead owner's RRef: " << e.what() << "\n";
  }
  theirs = RRef();
  check(me.rref_counts().users == 0, "dropping it needs no owner");
  shutdown(false);
}

// RRef control messages are dropped, their replies lost and all of them delayed at random
// (seeded): values are never freed while referenced, and nothing leaks in the end.
void rref_faults() {
  testing::exchange_rrefs(FLAGS_rank, FLAGS_world_size, 10, 20, check);
  process_group().barrier()->wait();
  check(testing::every_worker_released(FLAGS_world_size, milliseconds(60000)),
        "every RRef released on every worker despite lost and late control messages");
  process_group().barrier()->wait();
  shutdown(true);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  try {
    Options options;
    options.master_port = FLAGS_store_port;
    options.host_store = false;
    options.init_timeout = milliseconds(30000);
    auto coordination = connect_store("127.0.0.1", FLAGS_store_port, milliseconds(30000));
    std::unique_ptr<StoreServer> job_store;
    if (FLAGS_scenario == "stopped") {
      options.heartbeat_interval = milliseconds(200 * time_scale());
      options.heartbeat_misses = 5;
    } else if (FLAGS_scenario == "master_killed") {
      if (FLAGS_rank == 0) {
        job_store = start_store_server("127.0.0.1", 0);
        coordination->set("job_store_port", std::to_string(job_store->port()));
      }
      options.master_port = std::stoi(coordination->get("job_store_port", milliseconds(30000)));
    } else if (FLAGS_scenario == "rref_faults") {
      Faults faults;
      for (int32_t type : {kRRefUserDelete, kRRefForkRequest, kRRefChildAccept}) {
        faults.drop_probability[type] = 0.1;
        faults.lose_reply_probability[type] = 0.1;
        faults.max_random_delay[type] = milliseconds(30);
      }
      faults.seed = 1000 + FLAGS_rank;
      register_backend("faulty", [faults](MessagePort& port, Executor& executor, std::vector<WorkerInfo> workers,
                                          const Options& o) {
        AgentOptions agent;
        agent.num_threads = o.num_worker_threads;
        agent.default_timeout = o.rpc_timeout;
        return create_faulty_agent(create_process_group_agent(port, executor, std::move(workers), agent), faults);
      });
      options.backend = "faulty";
    }
    init_rpc(name(FLAGS_rank), FLAGS_rank, FLAGS_world_size, options);
    if (FLAGS_scenario == "callee_killed") {
      callee_killed();
    } else if (FLAGS_scenario == "stopped") {
      stopped();
    } else if (FLAGS_scenario == "master_killed") {
      master_killed(*coordination);
    } else if (FLAGS_scenario == "rref_faults") {
      rref_faults();
    } else if (FLAGS_scenario == "owner_killed") {
      owner_killed();
    } else {
      std::cerr << "unknown scenario " << FLAGS_scenario << "\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "worker" << FLAGS_rank << ": " << e.what() << "\n";
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
