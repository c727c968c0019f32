#include "testing/worker_processes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

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

std::string read_until_closed(int fd) {
  std::string output;
  char buf[512];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) output.append(buf, n);
  close(fd);
  return output;
}

int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (fd >= 0) close(fd);
  if (!ok) throw std::runtime_error("no free loopback port");
  return ntohs(addr.sin_port);
}

}  // namespace testing
}  // namespace drpc
