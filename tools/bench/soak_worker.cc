// One worker of tools/bench/soak.sh: a mixed load from every worker to every other for
// --seconds, then a graceful shutdown. Rank 0 serves the store on a free port and writes
// it to --port_file; the others read it there. At the end each worker prints
//   worker<i> calls=N errors=N rss_start_MB=X rss_end_MB=X growth=X% rrefs_left=N contexts_left=N
//   worker<i> by_op ... / errors_by_kind ...
// and while it runs, a `progress` line every --progress_seconds.
//
// Every loop iteration (--threads loops per worker) does, against peers that rotate over
// all other workers: rpc_sync of a builtin and of a registered function, a batch of
// rpc_async (builtins, a registered function and a nested call that is forwarded to a
// third worker), remote + to_here + a call on the owner, an RRef handed to a third worker
// (by rpc_sync and by remote) before the owner confirmed it, an RRef dropped unused, and
// one distributed-autograd training step through a Linear layer on each other worker,
// updated by a DistributedOptimizer. Results are checked: a wrong value is an error.

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "drpc.h"
#include "process_group/grpc_store.h"

DEFINE_int32(rank, -1, "this worker's rank");
DEFINE_int32(world_size, 4, "workers in the job");
DEFINE_string(port_file, "", "rank 0 writes the store's port here (it binds port 0); the others read it");
DEFINE_double(seconds, 60, "how long the load runs");
DEFINE_int32(threads, 2, "load loops per worker");
DEFINE_int32(async_batch, 16, "rpc_async calls in flight per batch");
DEFINE_int32(worker_threads, 4, "handler threads per worker (Options::num_worker_threads; drpc's default is 4)");
DEFINE_double(progress_seconds, 30, "a progress line this often");

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string name(int rank) { return "worker" + std::to_string(rank); }

}  // namespace

DRPC_REGISTER_FUNCTION("soak.scale", [](at::Tensor t, double s) { return t * s; });
DRPC_REGISTER_FUNCTION("soak.fill", [](int64_t n, double v) { return at::full({n}, v); });
// A user of an RRef that another worker created: fetches the value from its owner.
DRPC_REGISTER_FUNCTION("soak.rref_sum", [](c10::IValue rref) {
  return drpc::RRef::from_ivalue(rref).to_here().toTensor().sum().item<double>();
});
// A served call that calls on: forwards to `next` without holding a handler thread.
DRPC_REGISTER_ASYNC_FUNCTION("soak.relay", [](std::string next, at::Tensor t) {
  return drpc::current_runtime().rpc_async(next, "aten::add", {t, 1.0});
});
// A Linear(32, 32) layer owned by this worker, for one caller's training loop.
DRPC_REGISTER_FUNCTION("soak.make_linear", [](int64_t seed) {
  auto w = (at::randn({32, 32}, at::detail::createCPUGenerator(seed)) / 8).set_requires_grad(true);
  auto b = at::zeros({32}).set_requires_grad(true);
  return c10::ivalue::Tuple::create({drpc::RRef::make_local(w).to_ivalue(), drpc::RRef::make_local(b).to_ivalue()});
});
DRPC_REGISTER_FUNCTION("soak.linear", [](c10::IValue w, c10::IValue b, at::Tensor x) {
  return at::tanh(at::addmm(drpc::RRef::from_ivalue(b).local_value().toTensor(), x,
                            drpc::RRef::from_ivalue(w).local_value().toTensor().t()));
});

namespace {

// What a loop does, one counter each; a "call" is one request the caller saw answered.
enum Op { kSetup, kSyncBuiltin, kSyncFunction, kAsync, kRemote, kToHere, kOwnerCall, kRRefPassed, kDropped, kForward,
          kBackward, kOptimizerStep, kNumOps };
const char* const kOpNames[kNumOps] = {"setup", "sync_builtin", "sync_function", "async",    "remote",
                                       "to_here",      "owner_call",    "rref_passed", "dropped_rref",
                                       "forward",      "backward",      "optimizer_step"};

std::array<std::atomic<int64_t>, kNumOps> g_calls{};
std::atomic<int64_t> g_errors{0};
std::mutex g_errors_mu;
std::map<std::string, int64_t> g_errors_by_kind;  // "op/Kind", guarded by g_errors_mu

int64_t total_calls() {
  int64_t n = 0;
  for (auto& c : g_calls) n += c.load();
  return n;
}

// Counts an error; the first few are logged whole so a failing run says why.
void record_error(Op op, const std::string& kind, const std::string& what) {
  const int64_t n = ++g_errors;
  {
    std::lock_guard<std::mutex> lock(g_errors_mu);
    ++g_errors_by_kind[std::string(kOpNames[op]) + "/" + kind];
  }
  if (n <= 20) LOG(ERROR) << name(FLAGS_rank) << ": " << kOpNames[op] << ": " << what;
}

// A result that came back but is not what was asked for.
struct Wrong : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw Wrong(what);
}

// Runs one step of the load; `calls` requests count as done if it returns. False if it
// failed (counted).
template <typename F>
bool run(Op op, int64_t calls, F&& step) {
  try {
    step();
    g_calls[op] += calls;
    return true;
  } catch (const drpc::Error& e) {
    record_error(op, drpc::error_kind_name(e.kind()), e.what());
  } catch (const Wrong& e) {
    record_error(op, "WrongResult", e.what());
  } catch (const std::exception& e) {
    record_error(op, "Other", e.what());
  }
  return false;
}

double rss_mb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // kB
  }
  return -1;
}

// One load loop. Its parameters live on the other workers and are used by it alone:
// trainers sharing parameters would race the optimizer against each other's forward.
class Loop {
 public:
  explicit Loop(int thread) : thread_(thread), n_(FLAGS_world_size), rank_(FLAGS_rank) {
    const int64_t seed = 1000 * rank_ + thread_;
    std::vector<drpc::RRef> params;
    for (int k = 1; k < n_; ++k) {
      auto wb = drpc::rpc_sync(name((rank_ + k) % n_), "soak.make_linear", {seed + k}).toTupleRef().elements();
      layers_.emplace_back((rank_ + k) % n_, drpc::RRef::from_ivalue(wb[0]), drpc::RRef::from_ivalue(wb[1]));
      params.push_back(std::get<1>(layers_.back()));
      params.push_back(std::get<2>(layers_.back()));
    }
    head_ = (at::randn({1, 32}, at::detail::createCPUGenerator(seed)) / 8).set_requires_grad(true);
    params.push_back(drpc::RRef::make_local(head_));
    optimizer_ = std::make_unique<drpc::DistributedOptimizer>(drpc::optim::sgd(0.01, 0.9), params);
    x_ = at::randn({16, 32}, at::detail::createCPUGenerator(seed + 100));
    target_ = at::randn({16, 1}, at::detail::createCPUGenerator(seed + 200));
  }

  void iteration(int64_t i) {
    // Peers rotate over every other worker; `third` is neither this one nor `peer`.
    const std::string peer = name((rank_ + 1 + i % (n_ - 1)) % n_);
    const std::string third = name((rank_ + 1 + (i + 1) % (n_ - 1)) % n_);
    const double v = static_cast<double>(i % 1000);
    const at::Tensor a = at::full({8}, v), b = at::full({8}, 2.0);

    run(kSyncBuiltin, 1, [&] {
      expect(at::equal(drpc::rpc_sync(peer, "aten::add", {a, b}).toTensor(), a + b), "aten::add on " + peer);
    });
    run(kSyncFunction, 1, [&] {
      expect(at::equal(drpc::rpc_sync(peer, "soak.scale", {a, 3.0}).toTensor(), a * 3), "soak.scale on " + peer);
    });
    run(kAsync, FLAGS_async_batch, [&] {
      // Every worker, this one included; a third of them forwarded once more.
      std::vector<drpc::FuturePtr> futures;
      std::vector<at::Tensor> expected;
      for (int j = 0; j < FLAGS_async_batch; ++j) {
        const std::string to = name((rank_ + j) % n_);
        const at::Tensor t = at::full({4}, v + j);
        if (j % 3 == 0) {
          futures.push_back(drpc::rpc_async(to, "aten::mul", {t, 2.0}));
          expected.push_back(t * 2);
        } else if (j % 3 == 1) {
          futures.push_back(drpc::rpc_async(to, "soak.scale", {t, 0.5}));
          expected.push_back(t * 0.5);
        } else {
          futures.push_back(drpc::rpc_async(to, "soak.relay", {name((rank_ + j + 1) % n_), t}));
          expected.push_back(t + 1);
        }
      }
      auto values = drpc::wait_all(futures);
      for (size_t j = 0; j < values.size(); ++j) {
        expect(at::equal(values[j].toTensor(), expected[j]), "async call " + std::to_string(j));
      }
    });
    run(kRemote, 1, [&] {
      drpc::RRef r = drpc::remote(peer, "soak.fill", {int64_t{6}, v});
      run(kToHere, 1, [&] { expect(at::equal(r.to_here().toTensor(), at::full({6}, v)), "to_here from " + peer); });
      run(kOwnerCall, 1, [&] {
        expect(at::equal(r.rpc_sync("soak.scale", {2.0}).toTensor(), at::full({6}, 2 * v)), "owner call on " + peer);
      });
    });
    run(kRRefPassed, 4, [&] {
      // Handed on at once, likely before the owner confirmed it: the fork protocol runs.
      drpc::RRef r = drpc::remote(peer, "soak.fill", {int64_t{5}, v});
      const double sum = drpc::rpc_sync(third, "soak.rref_sum", {r.to_ivalue()}).toDouble();
      expect(sum == 5 * v, "soak.rref_sum of an RRef from " + peer + " on " + third);
      drpc::RRef s = drpc::remote(third, "soak.rref_sum", {r.to_ivalue()});
      expect(s.to_here().toDouble() == 5 * v, "remote soak.rref_sum on " + third);
    });
    run(kDropped, 1, [&] {
      // Never used: its user reference is deleted while the owner may still be creating it.
      drpc::remote(third, "aten::ones", {c10::List<int64_t>({3})});
    });
    train_step();
  }

 private:
  void train_step() {
    drpc::dist_autograd::Context ctx;
    at::Tensor h = x_;
    for (const auto& [owner, w, b] : layers_) {
      const std::string to = name(owner);
      if (!run(kForward, 1, [&] { h = drpc::rpc_sync(to, "soak.linear", {w.to_ivalue(), b.to_ivalue(), h}).toTensor(); })) {
        return;
      }
    }
    at::Tensor loss = (h.matmul(head_.t()) - target_).pow(2).mean();
    const bool backward_ok = run(kBackward, 1, [&] {
      expect(std::isfinite(loss.item<double>()), "a finite loss");
      drpc::dist_autograd::backward(ctx.id(), {loss});
      expect(drpc::dist_autograd::get_gradients(ctx.id()).contains(head_), "a gradient for the local head");
    });
    // One step on each owner of parameters: every other worker and this one.
    if (backward_ok) run(kOptimizerStep, n_, [&] { optimizer_->step(ctx.id()); });
  }

  const int thread_, n_, rank_;
  std::vector<std::tuple<int, drpc::RRef, drpc::RRef>> layers_;  // owner, weight, bias
  at::Tensor head_, x_, target_;
  std::unique_ptr<drpc::DistributedOptimizer> optimizer_;
};

// Blocks until `deadline` or until `stop` is set.
class Stopper {
 public:
  void stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }
  bool wait_until(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return stopped_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
};

int run_worker() {
  at::set_num_threads(1);  // 4 workers share 2 cores: intra-op threads would only contend
  std::unique_ptr<drpc::StoreServer> server;
  int port = 0;
  if (FLAGS_rank == 0) {
    server = drpc::start_store_server("127.0.0.1", 0);
    port = server->port();
    // Written under another name and renamed, so a reader never sees half a number.
    const std::string tmp = FLAGS_port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    if (std::rename(tmp.c_str(), FLAGS_port_file.c_str()) != 0) {
      throw drpc::Error(drpc::ErrorKind::kBadArgument, "cannot write --port_file " + FLAGS_port_file);
    }
  } else {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!(std::ifstream(FLAGS_port_file) >> port)) {
      if (Clock::now() > deadline) {
        throw drpc::Error(drpc::ErrorKind::kTimeout, "no store port in " + FLAGS_port_file + " after 60 s");
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  auto store = drpc::connect_store("127.0.0.1", port, std::chrono::seconds(60));
  drpc::Options options;
  options.store = store.get();
  options.num_worker_threads = FLAGS_worker_threads;
  drpc::init_rpc(name(FLAGS_rank), FLAGS_rank, FLAGS_world_size, options);
  drpc::Runtime& runtime = drpc::current_runtime();

  // init_rpc is a rendezvous, so the workers' clocks start within a moment of each other.
  const auto start = Clock::now();
  const auto duration = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(FLAGS_seconds));
  const auto end = start + duration;
  const auto warmup = std::min<Clock::duration>(duration / 10, std::chrono::seconds(60));
  std::atomic<bool> done{false};
  std::vector<std::thread> loops;
  for (int t = 0; t < FLAGS_threads; ++t) {
    loops.emplace_back([t, end, &done] {
      std::unique_ptr<Loop> loop;
      // The setup's calls: a layer made on each other worker, an optimizer on each owner.
      run(kSetup, 2 * FLAGS_world_size - 1, [&] { loop = std::make_unique<Loop>(t); });
      if (!loop) return;
      for (int64_t i = 0; Clock::now() < end; ++i) loop->iteration(i);
    });
  }

  // Memory after the warm-up and at the end; progress in between.
  Stopper stopper;
  double rss_start = -1;
  std::thread monitor([&] {
    const auto every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(FLAGS_progress_seconds));
    auto next = start + every;
    bool sampled = false;
    while (true) {
      const auto wake = sampled ? next : std::min(next, start + warmup);
      if (stopper.wait_until(wake)) return;
      if (!sampled && Clock::now() >= start + warmup) {
        rss_start = rss_mb();
        sampled = true;
      }
      if (Clock::now() >= next) {
        std::printf("progress %s t=%.0fs calls=%lld errors=%lld rss_MB=%.1f\n", name(FLAGS_rank).c_str(),
                    std::chrono::duration<double>(Clock::now() - start).count(),
                    static_cast<long long>(total_calls()), static_cast<long long>(g_errors.load()), rss_mb());
        std::fflush(stdout);
        next += every;
      }
    }
  });
  for (auto& t : loops) t.join();
  const double rss_end = rss_mb();
  stopper.stop();
  monitor.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // Graceful: waits until the whole job is quiet. The runtime's objects stay until
  // drpc::shutdown() destroys them, so what is left in them can be counted.
  runtime.shutdown(true);
  const drpc::RRefCounts left = runtime.rref_counts();
  const int64_t contexts_left = runtime.autograd().num_contexts();
  drpc::shutdown();

  const int64_t rrefs_left = left.owners + left.owner_values + left.users + left.pending_children + left.pending_users;
  const double growth = rss_start > 0 ? (rss_end - rss_start) / rss_start * 100 : -1;
  std::printf("worker%d calls=%lld errors=%lld rss_start_MB=%.1f rss_end_MB=%.1f growth=%.1f%% rrefs_left=%lld "
              "contexts_left=%lld seconds=%.0f\n",
              FLAGS_rank, static_cast<long long>(total_calls()), static_cast<long long>(g_errors.load()), rss_start,
              rss_end, growth, static_cast<long long>(rrefs_left), static_cast<long long>(contexts_left), seconds);
  std::ostringstream ops;
  for (int op = 0; op < kNumOps; ++op) ops << " " << kOpNames[op] << "=" << g_calls[op].load();
  std::printf("worker%d by_op%s\n", FLAGS_rank, ops.str().c_str());
  if (rrefs_left > 0) {
    std::printf("worker%d rrefs_left owners=%lld owner_values=%lld users=%lld pending_children=%lld "
                "pending_users=%lld\n",
                FLAGS_rank, static_cast<long long>(left.owners), static_cast<long long>(left.owner_values),
                static_cast<long long>(left.users), static_cast<long long>(left.pending_children),
                static_cast<long long>(left.pending_users));
  }
  {
    std::lock_guard<std::mutex> lock(g_errors_mu);
    if (!g_errors_by_kind.empty()) {
      std::ostringstream kinds;
      for (const auto& [kind, count] : g_errors_by_kind) kinds << " " << kind << "=" << count;
      std::printf("worker%d errors_by_kind%s\n", FLAGS_rank, kinds.str().c_str());
    }
  }
  std::fflush(stdout);
  return g_errors > 0 || rrefs_left > 0 || contexts_left > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("soak_worker --rank=R --world_size=N --port_file=PATH --seconds=S (see tools/bench/soak.sh)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  // If the script that started this worker dies, so does the worker: no stray processes.
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return 3;
  if (FLAGS_rank < 0 || FLAGS_rank >= FLAGS_world_size || FLAGS_world_size < 3 || FLAGS_port_file.empty() ||
      FLAGS_seconds <= 0 || FLAGS_threads < 1 || FLAGS_async_batch < 1 || FLAGS_worker_threads < 1) {
    std::fprintf(stderr, "soak_worker: needs 0 <= --rank < --world_size, --world_size >= 3 (an RRef goes to a "
                         "third worker), --port_file, --seconds > 0, --threads, --async_batch and --worker_threads >= 1\n");
    return 2;
  }
  try {
    return run_worker();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker%d: %s\n", FLAGS_rank, e.what());
    return 2;
  }
}
