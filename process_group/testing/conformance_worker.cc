// One rank of a process group as a real process, started by multiprocess_test.
//   conformance_worker --rank=R --world_size=N --store_port=P --scenario=S
// Exits 0 when its scenario behaved as expected; prints what went wrong otherwise.

#include <gflags/gflags.h>
#include <signal.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

#include "common/error.h"
#include "process_group/grpc_process_group.h"
#include "process_group/grpc_store.h"
#include "process_group/testing/conformance.h"

DEFINE_int32(rank, 0, "this process's rank");
DEFINE_int32(world_size, 1, "number of ranks");
DEFINE_int32(store_port, 0, "port of the store server on 127.0.0.1");
DEFINE_string(scenario, "conformance", "conformance | peer_killed");

namespace drpc {
namespace {

using std::chrono::milliseconds;

int run_conformance_scenario(ProcessGroup& group, MessagePort& messages) {
  auto failures = testing::run_conformance(group, messages);
  // Every pair is on the link DRPC_DATA_PLANE asks for ("auto": UCX, all ranks being on this
  // host, with large tensors through shared memory).
  const char* plane = std::getenv("DRPC_DATA_PLANE");
  const std::string expected = plane != nullptr && std::string(plane) == "grpc" ? "grpc" : "ucx+shm";
  for (int peer = 0; peer < group.size(); ++peer) {
    const std::string link = group.link_to(peer);
    if (peer != group.rank() && link != expected) {
      failures.push_back("frames to rank " + std::to_string(peer) + " go over " + link + ", not " + expected);
    }
  }
  for (const auto& f : failures) std::cerr << "rank " << group.rank() << ": " << f << "\n";
  group.barrier()->wait();  // nobody leaves while a peer may still need it
  return failures.empty() ? 0 : 1;
}

// Rank 2 kills itself while ranks 0 and 1 wait in an allreduce; they must get an error
// naming rank 2 well before the 60 s collective timeout.
int run_peer_killed_scenario(ProcessGroup& group) {
  if (group.rank() == 2) {
    at::Tensor go = at::empty({1});
    group.recv({go}, 0, 1)->wait();
    group.recv({go}, 1, 1)->wait();
    raise(SIGKILL);
  }
  at::Tensor t = at::ones({1 << 18});
  auto work = group.allreduce(t, ReduceOp::kSum);
  group.send({at::ones({1})}, 2, 1)->wait();
  const auto start = std::chrono::steady_clock::now();
  try {
    work->wait(milliseconds(30000));
  } catch (const Error& e) {
    const auto took = std::chrono::steady_clock::now() - start;
    const bool ok = e.kind() == ErrorKind::kPeerUnavailable &&
                    std::string(e.what()).find("rank 2") != std::string::npos && took < milliseconds(5000);
    std::cerr << "rank " << group.rank() << " got: " << e.what() << "\n";
    return ok ? 0 : 1;
  }
  std::cerr << "rank " << group.rank() << ": allreduce succeeded without rank 2\n";
  return 1;
}

}  // namespace
}  // namespace drpc

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  using namespace drpc;
  try {
    auto store = connect_store("127.0.0.1", FLAGS_store_port, milliseconds(10000));
    GrpcProcessGroupOptions options;
    options.timeout = milliseconds(60000);
    GroupEndpoints endpoints = create_grpc_group_endpoints(*store, FLAGS_rank, FLAGS_world_size, options);
    int rc = FLAGS_scenario == "peer_killed" ? run_peer_killed_scenario(*endpoints.group)
                                             : run_conformance_scenario(*endpoints.group, *endpoints.messages);
    endpoints.group->shutdown();
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "rank " << FLAGS_rank << ": " << e.what() << "\n";
    return 2;
  }
}
