// A worker process for observability_processes_test.
//   observability_worker --rank=R --world_size=3 --store_port=P --scenario=profile
// Rank 0 profiles one call chain worker0 -> worker1 "obs.chain" -> worker2 "obs.leaf" and
// writes its Chrome trace to $OBS_TRACE_FILE. Exits 0 when all went well.

#include <gflags/gflags.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>

#include "common/logging.h"
#include "drpc.h"

DEFINE_int32(rank, 0, "rank");
DEFINE_int32(world_size, 3, "world size");
DEFINE_int32(store_port, 0, "the test's store on 127.0.0.1");
DEFINE_string(scenario, "profile", "profile");

using namespace drpc;

DRPC_REGISTER_FUNCTION("obs.leaf", [](at::Tensor x) {
  // Some real work, so the execution span is not empty.
  at::Tensor m = at::ones({64, 64});
  for (int i = 0; i < 20; ++i) m = at::matmul(m, at::eye(64));
  return x * 2 + m.sum().item<double>() * 0;
});
DRPC_REGISTER_FUNCTION("obs.chain", [](at::Tensor x) { return rpc_sync("worker2", "obs.leaf", {x}).toTensor() + 1; });

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  init_logging(argv[0]);
  try {
    Options options;
    options.master_port = FLAGS_store_port;
    options.host_store = false;
    options.init_timeout = std::chrono::seconds(30);
    init_rpc("worker" + std::to_string(FLAGS_rank), FLAGS_rank, FLAGS_world_size, options);
    if (FLAGS_rank == 0) {
      rpc_sync("worker1", "obs.chain", {at::ones({4})});  // warm-up, not recorded
      const char* path = std::getenv("OBS_TRACE_FILE");
      if (!path) throw std::runtime_error("OBS_TRACE_FILE is not set");
      Profiler profiler;
      at::Tensor y = rpc_sync("worker1", "obs.chain", {at::ones({4})}).toTensor();
      if (!at::equal(y, at::full({4}, 3.0))) throw std::runtime_error("obs.chain returned a wrong value");
      profiler.write_chrome_trace(path);
    }
    shutdown(true);
  } catch (const std::exception& e) {
    std::cerr << "worker" << FLAGS_rank << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
