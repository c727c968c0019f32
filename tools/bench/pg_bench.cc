// drpc's side of tools/bench/process_group.sh.
//   pg_bench --world_size=N        starts N ranks as processes; rank 0 prints one line:
//   busbw_MBps=X lat_us=X barrier_us=X
// (64 MiB float32 allreduce bus bandwidth, 4-byte allreduce latency, barrier latency).

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>

#include "common/subprocess.h"
#include "process_group/grpc_process_group.h"
#include "process_group/grpc_store.h"

DEFINE_int32(world_size, 2, "number of ranks");
DEFINE_int32(rank, -1, "internal: this process's rank (set by the launcher)");
DEFINE_int32(store_port, 0, "internal: the store's port");
DEFINE_int32(large_iters, 5, "64 MiB allreduces timed");
DEFINE_int32(small_iters, 1000, "4-byte allreduces and barriers timed");
DEFINE_int64(chunk_bytes, drpc::GrpcProcessGroupOptions().chunk_bytes, "allreduce ring chunk size (for tuning)");

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int run_rank() {
  at::set_num_threads(1);  // as the Gloo side does: 2 cores, several processes
  auto store = drpc::connect_store("127.0.0.1", FLAGS_store_port, std::chrono::seconds(30));
  drpc::GrpcProcessGroupOptions options;
  options.chunk_bytes = FLAGS_chunk_bytes;
  auto group = drpc::create_grpc_process_group(*store, FLAGS_rank, FLAGS_world_size, options);
  const int n = group->size();

  at::Tensor big = at::ones({16 << 20});  // 64 MiB of float32
  group->allreduce(big, drpc::ReduceOp::kSum)->wait();  // warm-up
  group->barrier()->wait();
  auto start = Clock::now();
  for (int i = 0; i < FLAGS_large_iters; ++i) group->allreduce(big, drpc::ReduceOp::kSum)->wait();
  const double large_s = seconds_since(start) / FLAGS_large_iters;
  const double busbw = big.nbytes() * 2.0 * (n - 1) / n / large_s / 1e6;

  at::Tensor small = at::ones({1});
  for (int i = 0; i < 50; ++i) group->allreduce(small, drpc::ReduceOp::kSum)->wait();
  group->barrier()->wait();
  start = Clock::now();
  for (int i = 0; i < FLAGS_small_iters; ++i) group->allreduce(small, drpc::ReduceOp::kSum)->wait();
  const double lat_us = seconds_since(start) / FLAGS_small_iters * 1e6;

  group->barrier()->wait();
  start = Clock::now();
  for (int i = 0; i < FLAGS_small_iters; ++i) group->barrier()->wait();
  const double barrier_us = seconds_since(start) / FLAGS_small_iters * 1e6;

  double pingpong_us = 0;
  if (n > 1 && FLAGS_rank < 2) {
    at::Tensor ball = at::ones({1});
    group->barrier()->wait();
    start = Clock::now();
    for (int i = 0; i < FLAGS_small_iters; ++i) {
      if (FLAGS_rank == 0) {
        group->send({ball}, 1, 7)->wait();
        group->recv({ball}, 1, 7)->wait();
      } else {
        group->recv({ball}, 0, 7)->wait();
        group->send({ball}, 0, 7)->wait();
      }
    }
    pingpong_us = seconds_since(start) / FLAGS_small_iters * 1e6;
  } else if (n > 1) {
    group->barrier()->wait();
  }
  group->barrier()->wait();
  if (FLAGS_rank == 0) {
    std::printf("busbw_MBps=%.0f lat_us=%.1f barrier_us=%.1f pingpong_us=%.1f\n", n > 1 ? busbw : 0.0,
                lat_us, barrier_us, pingpong_us);
    std::fflush(stdout);
  }
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_rank >= 0) return run_rank();

  auto store = drpc::start_store_server("127.0.0.1", 0);
  std::vector<std::unique_ptr<drpc::Subprocess>> ranks;
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return 1;
  self[len] = '\0';
  for (int r = 0; r < FLAGS_world_size; ++r) {
    ranks.push_back(drpc::Subprocess::start(
        {self, "--rank=" + std::to_string(r), "--world_size=" + std::to_string(FLAGS_world_size),
         "--store_port=" + std::to_string(store->port()),
         "--large_iters=" + std::to_string(FLAGS_large_iters),
         "--small_iters=" + std::to_string(FLAGS_small_iters), "--chunk_bytes=" + std::to_string(FLAGS_chunk_bytes)}));
  }
  int rc = 0;
  for (auto& r : ranks) {
    auto code = r->wait(std::chrono::minutes(10));
    if (!code || *code != 0) rc = 1;
  }
  return rc;
}
