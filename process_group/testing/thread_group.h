#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "process_group/grpc_process_group.h"
#include "process_group/in_memory_store.h"

namespace drpc {
namespace testing {

// N ranks of a real gRPC process group, each in a thread of this process, rendezvousing
// through one in-memory store.
struct ThreadGroup {
  std::unique_ptr<InMemoryStore> store;
  std::vector<GroupEndpoints> ranks;  // each rank's group and message port
};

ThreadGroup make_thread_group(int world_size, const GrpcProcessGroupOptions& options = {});

// Runs fn(rank's group) on one thread per rank; returns "rank r: error" for each rank
// whose fn threw.
std::vector<std::string> run_on_ranks(ThreadGroup& group,
                                      const std::function<void(ProcessGroup&)>& fn);
// The same, with the rank's message port too.
std::vector<std::string> run_on_ranks(ThreadGroup& group,
                                      const std::function<void(ProcessGroup&, MessagePort&)>& fn);

}  // namespace testing
}  // namespace drpc
