#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "process_group/process_group.h"
#include "rpc/rpc_agent.h"

namespace drpc {

struct AgentOptions {
  int num_threads = 4;                             // handler threads
  std::chrono::milliseconds default_timeout{60000};
};

// The RpcAgent over a ProcessGroup's messages. `group` is borrowed and must outlive the
// agent; `workers` lists every worker of the job by rank (their names already checked).
// Futures of replies complete on the process group's network threads: callbacks attached
// to them must not block.
std::unique_ptr<RpcAgent> create_process_group_agent(ProcessGroup& group, std::vector<WorkerInfo> workers,
                                                     const AgentOptions& options);

}  // namespace drpc
