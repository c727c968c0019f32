// The worker binary as users run it: two drpc_worker processes configured through
// DRPC_* environment variables (one loading TorchScript), called by this test as rank 0.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/csrc/jit/api/module.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

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

}  // namespace
}  // namespace drpc
