#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace drpc {
namespace testing {

// The absolute path of a file in this test's runfiles, given relative to the workspace
// (e.g. "tools/worker/drpc_worker").
std::string runfile(const std::string& workspace_path);

// Starts `world_size` processes of the test binary at `runfiles_path` (relative to the
// workspace, e.g. "tests/rpc_worker") with --rank, --world_size, --store_port (a store this
// call hosts on loopback) and --scenario, waits for all, and returns their exit codes (128
// + signal when killed; -1 for one still running at `deadline`, which is then killed).
std::vector<int> run_worker_processes(const std::string& runfiles_path, int world_size,
                                      const std::string& scenario,
                                      std::chrono::milliseconds deadline = std::chrono::minutes(4));

// Reads what a child writes to `fd` until it closes its end (exits), then closes `fd`.
std::string read_until_closed(int fd);

// A loopback TCP port that is free now, for a process that must be told its port before
// it starts (a worker hosting the store).
int free_loopback_port();

}  // namespace testing
}  // namespace drpc
