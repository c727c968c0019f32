#pragma once

// A job of real ProcessGroupAgents over in-memory process groups, in one process: for the
// unit tests of the layers above rpc/ (rref/, dist_autograd/), which run their protocols
// through the real agent without sockets.

#include <memory>
#include <string>
#include <vector>

#include "common/executor.h"
#include "common/logging.h"
#include "process_group/in_memory_process_group.h"
#include "rpc/process_group_agent.h"

namespace drpc {

struct InMemoryAgents {
  // Workers "<prefix>0" .. "<prefix><n-1>", not started (register handlers first).
  explicit InMemoryAgents(int n, AgentOptions options = {}, const std::string& prefix = "worker")
      : groups(create_in_memory_process_groups(n)) {
    std::vector<WorkerInfo> workers;
    for (int r = 0; r < n; ++r) workers.push_back(WorkerInfo{prefix + std::to_string(r), r});
    for (int r = 0; r < n; ++r) executors.push_back(create_thread_executor(make_log_tag(workers[r].name, r)));
    for (int r = 0; r < n; ++r)
      agents.push_back(create_process_group_agent(*groups[r].messages, *executors[r], workers, options));
  }
  ~InMemoryAgents() {
    for (auto& a : agents) a->shutdown(false);
  }
  InMemoryAgents(const InMemoryAgents&) = delete;
  InMemoryAgents& operator=(const InMemoryAgents&) = delete;

  RpcAgent& operator[](int r) { return *agents[r]; }
  void start() {
    for (auto& a : agents) a->start();
  }

  std::vector<GroupEndpoints> groups;  // each rank's group and the port its agent uses
  std::vector<std::unique_ptr<Executor>> executors;  // the agents' deadlines; outlive them
  std::vector<std::unique_ptr<RpcAgent>> agents;
};

}  // namespace drpc
