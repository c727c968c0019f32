#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "common/executor.h"
#include "process_group/message_port.h"
#include "rpc/rpc_agent.h"

namespace drpc {

struct AgentOptions {
  int num_threads = 4;                             // handler threads
  std::chrono::milliseconds default_timeout{60000};
};

// The RpcAgent over a process group's MessagePort. `port` is borrowed and must outlive
// the agent (the agent installs its listener there and removes it when destroyed);
// `executor` (the worker's, borrowed, must outlive the agent) keeps the calls' deadlines,
// whose errors complete futures on its threads; once it is closed, calls that need a
// deadline fail with kShutdown. `workers` lists every worker of the job by rank (their
// names already checked). Futures of replies complete on the port's network threads:
// callbacks attached to them must not block.
std::unique_ptr<RpcAgent> create_process_group_agent(MessagePort& port, Executor& executor,
                                                     std::vector<WorkerInfo> workers, const AgentOptions& options);

}  // namespace drpc
