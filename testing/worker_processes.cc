#include "testing/worker_processes.h"

#include <cstdlib>

#include "common/subprocess.h"
#include "process_group/grpc_store.h"

namespace drpc {
namespace testing {

std::string runfile(const std::string& workspace_path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (workspace ? workspace : "drpc") + "/" + workspace_path;
}

std::vector<int> run_worker_processes(const std::string& runfiles_path, int world_size,
                                      const std::string& scenario, std::chrono::milliseconds deadline) {
  const std::string binary = runfile(runfiles_path);
  auto store = start_store_server("127.0.0.1", 0);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 0; r < world_size; ++r) {
    workers.push_back(Subprocess::start({binary, "--rank=" + std::to_string(r),
                                         "--world_size=" + std::to_string(world_size),
                                         "--store_port=" + std::to_string(store->port()), "--scenario=" + scenario},
                                        {"GLOG_minloglevel=1", "GLOG_logtostderr=1"}));
  }
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<int> codes;
  for (auto& w : workers) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    auto code = w->wait(std::max(left, std::chrono::milliseconds(1)));
    codes.push_back(code ? *code : -1);
  }
  return codes;  // the Subprocess destructors kill whatever still runs
}

}  // namespace testing
}  // namespace drpc
