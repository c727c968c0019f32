// The worker binary as users run it: two drpc_worker processes configured through
// DRPC_* environment variables (one loading TorchScript), called by this test as rank 0.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <torch/csrc/jit/api/module.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "drpc.h"
#include "process_group/grpc_store.h"
#include "testing/worker_processes.h"

namespace drpc {
namespace {

using testing::runfile;

TEST(WorkerBinary, ServesBuiltinsAndLoadedTorchScriptThenExitsCleanly) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string script = std::string(tmp ? tmp : "/tmp") + "/triple.pt";
  {
    torch::jit::Module m("Triple");
    m.define("def forward(self, x):\n    return x * 3\n");
    m.save(script);
  }
  // This test hosts the store and is rank 0; the workers are ranks 1 and 2.
  auto store = start_store_server("127.0.0.1", 0);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 1; r <= 2; ++r) {
    workers.push_back(Subprocess::start(
        {runfile("tools/worker/drpc_worker")},
        {"DRPC_RANK=" + std::to_string(r), "DRPC_WORLD_SIZE=3", "DRPC_MASTER_PORT=" + std::to_string(store->port()),
         "DRPC_LOAD=triple=" + script, "GLOG_minloglevel=1"}));
  }
  Options options;
  options.master_port = store->port();
  options.host_store = false;
  options.init_timeout = std::chrono::seconds(20);
  auto me = Runtime::create("worker0", 0, 3, options);
  at::Tensor x = at::arange(4, at::kFloat);
  EXPECT_TRUE(at::equal(me->rpc_sync("worker1", "torchscript:triple", {x}).toTensor(), x * 3));
  EXPECT_TRUE(at::equal(me->rpc_sync("worker2", "aten::add", {x, x}).toTensor(), x * 2));
  me->shutdown(true);  // the workers' graceful shutdowns complete with this one
  for (auto& w : workers) {
    auto code = w->wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0);
  }
}

TEST(WorkerBinary, SigtermLeavesTheJobAndExitsZero) {
  auto store = start_store_server("127.0.0.1", 0);
  auto worker = Subprocess::start({runfile("tools/worker/drpc_worker"), "--rank=1", "--world_size=2",
                                   "--master_port=" + std::to_string(store->port())},
                                  {"GLOG_minloglevel=1"});
  Options options;
  options.master_port = store->port();
  options.host_store = false;
  options.init_timeout = std::chrono::seconds(20);
  auto me = Runtime::create("worker0", 0, 2, options);
  EXPECT_TRUE(at::equal(me->rpc_sync("worker1", "aten::neg", {at::ones({1})}).toTensor(), -at::ones({1})));
  worker->kill(SIGTERM);
  auto code = worker->wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0);
  try {
    me->rpc_sync("worker1", "aten::neg", {at::ones({1})}, {}, std::chrono::milliseconds(5000));
    ADD_FAILURE() << "a call to a worker that left succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
  }
  me->shutdown(false);
}

TEST(WorkerBinary, MissingSettingsAreAOneLineError) {
  int fd = -1;
  auto worker = Subprocess::start_with_output({runfile("tools/worker/drpc_worker")}, {}, &fd);
  std::string output;
  char buf[512];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) output.append(buf, n);
  close(fd);
  auto code = worker->wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(output.find("--rank and --world_size"), std::string::npos) << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
}


// drpc_worker processes of one job whose rank 0 hosts the store, each started with its own
// name; their exit codes and output (a few lines, well within a pipe's buffer, so it can be
// read after the exit).
class NamedWorkers {
 public:
  explicit NamedWorkers(int world_size)
      : world_size_(world_size), port_(testing::free_loopback_port()), workers_(world_size), fds_(world_size, -1),
        codes_(world_size), outputs_(world_size) {}

  void start(int rank, const std::string& name) {
    workers_[rank] = Subprocess::start_with_output(
        {runfile("tools/worker/drpc_worker"), "--name=" + name, "--rank=" + std::to_string(rank),
         "--world_size=" + std::to_string(world_size_), "--master_port=" + std::to_string(port_)},
        {"GLOG_minloglevel=2"}, &fds_[rank]);
  }

  // Waits for `rank` to exit (killing it after 90 s) and collects its output.
  void finish(int rank) {
    codes_[rank] = workers_[rank]->wait(std::chrono::seconds(90));
    if (!codes_[rank]) workers_[rank]->kill(SIGKILL);
    outputs_[rank] = testing::read_until_closed(fds_[rank]);
  }

  // Every rank exited non-zero with `error` in its output.
  void expect_all_failed_with(const std::string& error) {
    for (int r = 0; r < world_size_; ++r) {
      ASSERT_TRUE(codes_[r].has_value()) << "rank " << r << " was still running: " << outputs_[r];
      EXPECT_NE(*codes_[r], 0) << "rank " << r << ": " << outputs_[r];
      EXPECT_NE(outputs_[r].find(error), std::string::npos) << "rank " << r << ": " << outputs_[r];
    }
  }

 private:
  const int world_size_;
  const int port_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::vector<int> fds_;
  std::vector<std::optional<int>> codes_;
  std::vector<std::string> outputs_;
};

TEST(WorkerBinary, DuplicateNameIsReportedByEveryRank) {
  NamedWorkers job(3);
  job.start(0, "worker0");
  job.start(1, "worker1");
  job.start(2, "worker0");
  for (int r = 0; r < 3; ++r) job.finish(r);
  job.expect_all_failed_with("worker name 'worker0' is used by ranks 0 and 2");
}

// Ranks 0 and 1 both call themselves worker0 and see the clash at once; rank 2 starts only
// once rank 1 has failed. Rank 0 hosts the store: had it gone when it saw the clash, rank 2
// would find no store instead of the clash.
TEST(WorkerBinary, DuplicateNameReachesEveryRankEvenOneStartedAfterTheClashWasSeen) {
  NamedWorkers job(3);
  job.start(0, "worker0");
  job.start(1, "worker0");
  job.finish(1);
  job.start(2, "worker2");
  job.finish(2);
  job.finish(0);
  job.expect_all_failed_with("worker name 'worker0' is used by ranks 0 and 1");
}

}  // namespace
}  // namespace drpc
