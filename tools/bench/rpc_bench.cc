// drpc's side of tools/bench/rpc.sh: two workers on loopback; worker0 prints
//   sync_us=X async_cps=X echo_MBps=X tcp_us=X sync_cpu_s_per_10k=X async_cpu_s_per_10k=X
// rpc_sync of aten::add on two 2-element tensors (us per call), rpc_async pipelined
// (calls per second, 10,000 calls in batches of 1,000 in flight), a 64 MiB tensor echoed
// (payload MB per second of round trip), and a raw TCP ping-pong of 8 bytes as the floor;
// and the CPU time both workers spent (all their threads: user + system) per 10,000 calls
// in the sync and async phases.

#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cstdio>

#include "common/subprocess.h"
#include "drpc.h"
#include "process_group/grpc_store.h"

DEFINE_int32(rank, -1, "internal: this worker's rank (set by the launcher)");
DEFINE_int32(store_port, 0, "internal: the store's port");
DEFINE_int32(sync_calls, 2000, "rpc_sync calls timed");
DEFINE_int32(async_calls, 10000, "rpc_async calls timed");
DEFINE_int32(echo_iters, 5, "64 MiB echoes timed");
DEFINE_string(mode, "rpc", "rpc | rref (remote + to_here pairs) | autograd (training steps)");
DEFINE_int32(world_size, 2, "workers (autograd mode: 1 trainer + world_size-1 remote layers)");
DEFINE_int32(iters, 500, "rref pairs or autograd steps timed");
DEFINE_int32(drops, 2000, "rref mode: RRefs dropped at once after the pairs");

DRPC_REGISTER_FUNCTION("bench.echo", [](at::Tensor t) { return t; });
DRPC_REGISTER_FUNCTION("bench.rref_owners", []() { return drpc::get_metrics().rref_owners; });
// A Linear(256, 256) layer whose weight and bias live on this worker.
DRPC_REGISTER_FUNCTION("bench.make_linear", []() {
  auto w = (at::randn({256, 256}, at::detail::createCPUGenerator(1)) / 16).set_requires_grad(true);
  auto b = at::zeros({256}).set_requires_grad(true);
  return c10::ivalue::Tuple::create({drpc::RRef::make_local(w).to_ivalue(), drpc::RRef::make_local(b).to_ivalue()});
});
DRPC_REGISTER_FUNCTION("bench.linear", [](c10::IValue w, c10::IValue b, at::Tensor x) {
  return at::relu(at::addmm(drpc::RRef::from_ivalue(b).local_value().toTensor(), x,
                            drpc::RRef::from_ivalue(w).local_value().toTensor().t()));
});

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The floor: 8 bytes back and forth over a plain TCP socket with TCP_NODELAY.
double tcp_pingpong_us(drpc::Store& store, int rank, int iters) {
  int one = 1;
  char buf[8] = {0};
  if (rank == 1) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    listen(listener, 1);
    store.set("tcp_port", std::to_string(ntohs(addr.sin_port)));
    int fd = accept(listener, nullptr, nullptr);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (int i = 0; i < iters; ++i) {
      if (recv(fd, buf, 8, MSG_WAITALL) != 8 || send(fd, buf, 8, 0) != 8) break;
    }
    close(fd);
    close(listener);
    return 0;
  }
  const int port = std::stoi(store.get("tcp_port", std::chrono::seconds(30)));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) {
    if (send(fd, buf, 8, 0) != 8 || recv(fd, buf, 8, MSG_WAITALL) != 8) break;
  }
  const double us = seconds_since(start) / iters * 1e6;
  close(fd);
  return us;
}

// remote(aten::add) followed by to_here(), us per pair.
void rref_pairs() {
  at::Tensor a = at::ones({2}), b = at::ones({2});
  for (int i = 0; i < 100; ++i) drpc::remote("worker1", "aten::add", {a, b}).to_here();
  auto start = Clock::now();
  for (int i = 0; i < FLAGS_iters; ++i) drpc::remote("worker1", "aten::add", {a, b}).to_here();
  std::printf("rref_us=%.1f\n", seconds_since(start) / FLAGS_iters * 1e6);
}

// FLAGS_drops RRefs that worker1 owns, dropped at once: the time until worker1 has freed
// them all (the owner's count polled with rpc_sync), per RRef. What a training loop pays
// when it lets go of a step's remote() results.
void rref_drops() {
  at::Tensor a = at::ones({2}), b = at::ones({2});
  std::vector<drpc::RRef> rrefs;
  for (int i = 0; i < FLAGS_drops; ++i) rrefs.push_back(drpc::remote("worker1", "aten::add", {a, b}));
  for (auto& r : rrefs) r.to_here();
  const auto owned = [] { return drpc::rpc_sync("worker1", "bench.rref_owners").toInt(); };
  if (owned() < FLAGS_drops) LOG(FATAL) << "worker1 does not own the RRefs made";
  auto start = Clock::now();
  rrefs.clear();
  const auto give_up = start + std::chrono::seconds(60);
  while (owned() > 0) {  // each probe is a round trip to worker1, so this does not spin
    if (Clock::now() > give_up) LOG(FATAL) << "worker1 still owns RRefs 60 s after they were dropped";
  }
  std::printf("rref_drop_us=%.2f\n", seconds_since(start) / FLAGS_drops * 1e6);
}

// One training step: forward through remote Linear(256,256) layers (one per other
// worker), a local head, MSE loss, distributed backward, DistributedOptimizer SGD step.
void autograd_steps() {
  std::vector<std::pair<drpc::RRef, drpc::RRef>> layers;
  std::vector<drpc::RRef> params;
  for (int r = 1; r < FLAGS_world_size; ++r) {
    auto wb = drpc::rpc_sync("worker" + std::to_string(r), "bench.make_linear").toTupleRef().elements();
    layers.emplace_back(drpc::RRef::from_ivalue(wb[0]), drpc::RRef::from_ivalue(wb[1]));
    params.push_back(layers.back().first);
    params.push_back(layers.back().second);
  }
  at::Tensor head = (at::randn({1, 256}, at::detail::createCPUGenerator(2)) / 16).set_requires_grad(true);
  params.push_back(drpc::RRef::make_local(head));
  drpc::DistributedOptimizer opt(drpc::optim::sgd(0.01), params);
  at::Tensor x = at::randn({32, 256}, at::detail::createCPUGenerator(3));
  at::Tensor target = at::randn({32, 1}, at::detail::createCPUGenerator(4));
  auto step = [&] {
    drpc::dist_autograd::Context ctx;
    at::Tensor h = x;
    for (size_t l = 0; l < layers.size(); ++l) {
      h = drpc::rpc_sync("worker" + std::to_string(l + 1), "bench.linear",
                         {layers[l].first.to_ivalue(), layers[l].second.to_ivalue(), h})
              .toTensor();
    }
    at::Tensor loss = (h.matmul(head.t()) - target).pow(2).mean();
    drpc::dist_autograd::backward(ctx.id(), {loss});
    opt.step(ctx.id());
  };
  for (int i = 0; i < 10; ++i) step();
  auto start = Clock::now();
  for (int i = 0; i < FLAGS_iters; ++i) step();
  std::printf("step_ms=%.3f\n", seconds_since(start) / FLAGS_iters * 1e3);
}

// CPU seconds this process has used (every thread, user + system).
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Both workers' CPU seconds between two marks worker0 sets in the store: worker1 reads its
// own at each mark and reports the difference.
class PhaseCpu {
 public:
  PhaseCpu(drpc::Store& store, std::string phase) : store_(store), phase_(std::move(phase)) {}
  // worker0: the phase starts / ends; returns both workers' CPU seconds at end().
  void start() {
    start_ = process_cpu_seconds();
    store_.set(phase_ + "/start", "1");
  }
  double end() {
    const double mine = process_cpu_seconds() - start_;
    store_.set(phase_ + "/end", "1");
    return mine + std::stod(store_.get(phase_ + "/cpu1", std::chrono::seconds(60)));
  }
  // worker1: measures itself across worker0's marks.
  void follow() {
    store_.get(phase_ + "/start", std::chrono::minutes(5));
    const double start = process_cpu_seconds();
    store_.get(phase_ + "/end", std::chrono::minutes(5));
    store_.set(phase_ + "/cpu1", std::to_string(process_cpu_seconds() - start));
  }

 private:
  drpc::Store& store_;
  const std::string phase_;
  double start_ = 0;
};

int run_worker() {
  at::set_num_threads(1);
  auto store = drpc::connect_store("127.0.0.1", FLAGS_store_port, std::chrono::seconds(30));
  drpc::Options options;
  options.store = store.get();
  drpc::init_rpc("worker" + std::to_string(FLAGS_rank), FLAGS_rank, FLAGS_world_size, options);
  if (FLAGS_mode != "rpc") {
    if (FLAGS_rank == 0) {
      if (FLAGS_mode == "rref") {
        rref_pairs();
        rref_drops();
      }
      if (FLAGS_mode == "autograd") autograd_steps();
      std::fflush(stdout);
    }
    drpc::shutdown(true);
    return 0;
  }
  const double tcp_us = tcp_pingpong_us(*store, FLAGS_rank, 5000);
  PhaseCpu sync_cpu(*store, "sync"), async_cpu(*store, "async");
  if (FLAGS_rank == 1) {
    sync_cpu.follow();
    async_cpu.follow();
  }
  if (FLAGS_rank == 0) {
    at::Tensor a = at::ones({2}), b = at::ones({2});
    for (int i = 0; i < 200; ++i) drpc::rpc_sync("worker1", "aten::add", {a, b});
    sync_cpu.start();
    auto start = Clock::now();
    for (int i = 0; i < FLAGS_sync_calls; ++i) drpc::rpc_sync("worker1", "aten::add", {a, b});
    const double sync_us = seconds_since(start) / FLAGS_sync_calls * 1e6;
    const double sync_cpu_per_10k = sync_cpu.end() / FLAGS_sync_calls * 1e4;

    async_cpu.start();
    start = Clock::now();
    for (int done = 0; done < FLAGS_async_calls; done += 1000) {
      std::vector<drpc::FuturePtr> futures;
      for (int i = 0; i < 1000; ++i) futures.push_back(drpc::rpc_async("worker1", "aten::add", {a, b}));
      drpc::wait_all(futures);
    }
    const double async_cps = FLAGS_async_calls / seconds_since(start);
    const double async_cpu_per_10k = async_cpu.end() / FLAGS_async_calls * 1e4;

    at::Tensor big = at::ones({16 << 20});  // 64 MiB
    drpc::rpc_sync("worker1", "bench.echo", {big});
    start = Clock::now();
    for (int i = 0; i < FLAGS_echo_iters; ++i) drpc::rpc_sync("worker1", "bench.echo", {big});
    const double echo_mbps = big.nbytes() / (seconds_since(start) / FLAGS_echo_iters) / 1e6;
    std::printf("sync_us=%.1f async_cps=%.0f echo_MBps=%.0f tcp_us=%.1f sync_cpu_s_per_10k=%.2f async_cpu_s_per_10k=%.2f\n",
                sync_us, async_cps, echo_mbps, tcp_us, sync_cpu_per_10k, async_cpu_per_10k);
    std::fflush(stdout);
  }
  drpc::shutdown(true);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_rank >= 0) return run_worker();
  auto server = drpc::start_store_server("127.0.0.1", 0);
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return 1;
  self[len] = '\0';
  std::vector<std::unique_ptr<drpc::Subprocess>> workers;
  for (int r = 0; r < FLAGS_world_size; ++r) {
    workers.push_back(drpc::Subprocess::start(
        {self, "--rank=" + std::to_string(r), "--store_port=" + std::to_string(server->port()),
         "--mode=" + FLAGS_mode, "--world_size=" + std::to_string(FLAGS_world_size),
         "--iters=" + std::to_string(FLAGS_iters), "--drops=" + std::to_string(FLAGS_drops),
         "--sync_calls=" + std::to_string(FLAGS_sync_calls), "--async_calls=" + std::to_string(FLAGS_async_calls),
         "--echo_iters=" + std::to_string(FLAGS_echo_iters)}));
  }
  int rc = 0;
  for (auto& w : workers) {
    auto code = w->wait(std::chrono::minutes(10));
    if (!code || *code != 0) rc = 1;
  }
  return rc;
}
