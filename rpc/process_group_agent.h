#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "common/executor.h"
#include "process_group/process_group.h"
#include "rpc/rpc_agent.h"

namespace drpc {

struct AgentOptions {
  int num_threads = 4;                             // handler threads
  std::chrono::milliseconds default_timeout{60000};
};

// The RpcAgent over a ProcessGroup's messages. `group` is borrowed and must outlive the
// agent; `executor` (the worker's, borrowed, must outlive the agent) keeps the calls'
// deadlines, whose errors complete futures on its threads; once it is closed, calls that
// need a deadline fail with kShutdown. `workers` lists every worker of the job by rank
// (their names already checked).
// Futures of replies complete on the process group's network threads: callbacks attached
// to them must not block.
std::unique_ptr<RpcAgent> create_process_group_agent(ProcessGroup& group, Executor& executor, std::vector<WorkerInfo> workers,
                                                     const AgentOptions& options);

}  // namespace drpc
