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
#include <utility>
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

TEST(WorkerBinary, SigtermLeavesTheJobAndExits143) {
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
  EXPECT_EQ(*code, 143);  // 128 + SIGTERM: a preempted worker is not a success
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


// Everything `argv` prints (stdout and stderr) and its exit code (-1: still running after 60 s).
std::pair<int, std::string> run(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int fd = -1;
  auto p = Subprocess::start_with_output(argv, env, &fd);
  const std::string output = testing::read_until_closed(fd);
  auto code = p->wait(std::chrono::seconds(60));
  return {code ? *code : -1, output};
}

// torch's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) and Kubernetes'
// JOB_COMPLETION_INDEX start a job with no DRPC_* variable and no flag.
TEST(WorkerBinary, TorchAndKubernetesVariablesStartAJob) {
  auto store = start_store_server("127.0.0.1", 0);
  const std::string port = std::to_string(store->port());
  std::vector<std::unique_ptr<Subprocess>> workers;
  workers.push_back(Subprocess::start({runfile("tools/worker/drpc_worker")},
                                      {"RANK=1", "WORLD_SIZE=3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port,
                                       "LOCAL_RANK=1", "GLOG_minloglevel=1"}));
  workers.push_back(Subprocess::start(
      {runfile("tools/worker/drpc_worker")},
      {"JOB_COMPLETION_INDEX=2", "WORLD_SIZE=3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "GLOG_minloglevel=1"}));
  Options options;
  options.master_port = store->port();
  options.host_store = false;
  options.init_timeout = std::chrono::seconds(20);
  auto me = Runtime::create("worker0", 0, 3, options);
  EXPECT_EQ(me->get_worker_info("worker1").id, 1);
  EXPECT_EQ(me->get_worker_info("worker2").id, 2);
  EXPECT_TRUE(at::equal(me->rpc_sync("worker2", "aten::neg", {at::ones({1})}).toTensor(), -at::ones({1})));
  me->shutdown(true);
  for (auto& w : workers) {
    auto code = w->wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0);
  }
}

// Numbers with trailing garbage, from flags or variables, are refused with one line naming
// the flag (and the variable), by the worker, the main job and the launcher.
TEST(WorkerBinary, MalformedNumbersAreRefusedNamingTheFlag) {
  const std::string worker = runfile("tools/worker/drpc_worker");
  struct Case {
    std::vector<std::string> argv, env;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{worker, "--rank=0", "--world_size=1", "--master_port=29500x"}, {}, 1, "'master_port'"},
      {{worker}, {"RANK=0", "WORLD_SIZE=1", "MASTER_PORT=29500x"}, 1,
       "bad setting: MASTER_PORT='29500x' (for --master_port) is not a valid int32"},
      {{worker}, {"DRPC_RANK=0", "DRPC_WORLD_SIZE=1", "DRPC_RPC_TIMEOUT_MS=5s"}, 1,
       "DRPC_RPC_TIMEOUT_MS='5s' (for --rpc_timeout_ms) is not a valid int32"},
      {{worker}, {"RANK=1x", "WORLD_SIZE=2"}, 1, "RANK='1x' (for --rank) is not a valid int32"},
      {{worker}, {"RANK=3", "WORLD_SIZE=2"}, 1, "bad setting: RANK=3: must be in [0, 1]"},
      {{worker, "--rank=0", "--world_size=1", "--master_port=70000"}, {}, 1, "--master_port=70000: must be in [0, 65535]"},
      {{runfile("tools/demo/fashion_mnist")}, {"RANK=0", "WORLD_SIZE=1", "DRPC_EPOCHS=2x"}, 2,
       "DRPC_EPOCHS='2x' (for --epochs) is not a valid int32"},
      {{runfile("tools/demo/fashion_mnist"), "--rank=0", "--world_size=1", "--batch_size=64k"}, {}, 1, "'batch_size'"},
      {{runfile("tools/launch/drpc_launch"), "--nproc=2x", "--", worker}, {}, 1, "'nproc'"},
      {{runfile("tools/launch/drpc_launch"), "--", worker}, {"MASTER_PORT=1e3"}, 2,
       "MASTER_PORT='1e3' (for --master_port) is not a valid int32"},
      {{runfile("tools/launch/drpc_launch"), "--nnodes=2", "--node_rank=1", "--", worker}, {}, 2,
       "--master_port (default)=0: must be in [1, 65535]"},
      {{runfile("tools/launch/drpc_launch"), "--nnodes=2", "--node_rank=2", "--master_port=5", "--", worker}, {}, 2,
       "--node_rank=2: must be in [0, 1]"},
  };
  for (const auto& c : cases) {
    auto [code, output] = run(c.argv, c.env);
    std::string what = c.argv.back();
    for (const auto& e : c.env) what += " " + e;
    EXPECT_EQ(code, c.code) << what << ": " << output;
    EXPECT_NE(output.find(c.message), std::string::npos) << what << ": " << output;
  }
}

// Two launchers as two nodes of one job (--nnodes, --node_rank, --master_addr), one worker
// each: ranks 0 and 1 of 2, LOCAL_RANK 0 on both; the job of two drpc_workers ends at once.
TEST(WorkerBinary, LaunchersOnTwoNodesFormOneJob) {
  const std::string port = std::to_string(testing::free_loopback_port());
  std::vector<std::unique_ptr<Subprocess>> launchers;
  std::vector<int> fds(2, -1);
  for (int node = 0; node < 2; ++node) {
    launchers.push_back(Subprocess::start_with_output(
        {runfile("tools/launch/drpc_launch"), "--nnodes=2", "--node_rank=" + std::to_string(node),
         "--master_addr=127.0.0.1", "--master_port=" + port, "--nproc=1", "--", runfile("tools/worker/drpc_worker")},
        {"GLOG_logtostderr=1", "GLOG_minloglevel=0"}, &fds[node]));
  }
  for (int node = 0; node < 2; ++node) {
    auto code = launchers[node]->wait(std::chrono::seconds(60));
    if (!code) launchers[node]->kill(SIGKILL);
    const std::string output = testing::read_until_closed(fds[node]);
    ASSERT_TRUE(code.has_value()) << output;
    EXPECT_EQ(*code, 0) << output;
    const std::string r = std::to_string(node);
    EXPECT_NE(output.find("[rank " + r + "] "), std::string::npos) << output;
    EXPECT_NE(output.find("worker" + r + " (rank " + r + " of 2, local rank 0) serving"), std::string::npos)
        << output;
  }
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
