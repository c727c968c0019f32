// drpc's side of tools/bench/rpc.sh: two workers on loopback; worker0 prints
//   sync_us=X async_cps=X echo_MBps=X tcp_us=X
// rpc_sync of aten::add on two 2-element tensors (us per call), rpc_async pipelined
// (calls per second, 10,000 calls in batches of 1,000 in flight), a 64 MiB tensor echoed
// (payload MB per second of round trip), and a raw TCP ping-pong of 8 bytes as the floor.

#include <arpa/inet.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

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

DRPC_REGISTER_FUNCTION("bench.echo", [](at::Tensor t) { return t; });

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

int run_worker() {
  at::set_num_threads(1);
  auto store = drpc::connect_store("127.0.0.1", FLAGS_store_port, std::chrono::seconds(30));
  drpc::Options options;
  options.store = store.get();
  drpc::init_rpc("worker" + std::to_string(FLAGS_rank), FLAGS_rank, 2, options);
  const double tcp_us = tcp_pingpong_us(*store, FLAGS_rank, 5000);
  if (FLAGS_rank == 0) {
    at::Tensor a = at::ones({2}), b = at::ones({2});
    for (int i = 0; i < 200; ++i) drpc::rpc_sync("worker1", "aten::add", {a, b});
    auto start = Clock::now();
    for (int i = 0; i < FLAGS_sync_calls; ++i) drpc::rpc_sync("worker1", "aten::add", {a, b});
    const double sync_us = seconds_since(start) / FLAGS_sync_calls * 1e6;

    start = Clock::now();
    for (int done = 0; done < FLAGS_async_calls; done += 1000) {
      std::vector<drpc::FuturePtr> futures;
      for (int i = 0; i < 1000; ++i) futures.push_back(drpc::rpc_async("worker1", "aten::add", {a, b}));
      drpc::wait_all(futures);
    }
    const double async_cps = FLAGS_async_calls / seconds_since(start);

    at::Tensor big = at::ones({16 << 20});  // 64 MiB
    drpc::rpc_sync("worker1", "bench.echo", {big});
    start = Clock::now();
    for (int i = 0; i < FLAGS_echo_iters; ++i) drpc::rpc_sync("worker1", "bench.echo", {big});
    const double echo_mbps = big.nbytes() / (seconds_since(start) / FLAGS_echo_iters) / 1e6;
    std::printf("sync_us=%.1f async_cps=%.0f echo_MBps=%.0f tcp_us=%.1f\n", sync_us, async_cps, echo_mbps, tcp_us);
    std::fflush(stdout);
  }
  drpc::shutdown(true);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  mallopt(M_MMAP_THRESHOLD, 1 << 30);  // large messages otherwise fault in fresh pages
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (FLAGS_rank >= 0) return run_worker();
  auto server = drpc::start_store_server("127.0.0.1", 0);
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return 1;
  self[len] = '\0';
  std::vector<std::unique_ptr<drpc::Subprocess>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(drpc::Subprocess::start(
        {self, "--rank=" + std::to_string(r), "--store_port=" + std::to_string(server->port()),
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
