// A job's security with the worker binary as users run it: a job over TLS with a token
// works end to end; a worker without the token cannot join.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "common/subprocess.h"
#include "drpc.h"
#include "process_group/grpc_store.h"
#include "testing/errors.h"
#include "testing/tls_certs.h"
#include "testing/worker_processes.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
using testing::contains;
using testing::runfile;

TEST(SecureJob, TlsWithTokenWorksEndToEndAndATokenlessWorkerCannotJoin) {
  const std::string dir = testing::make_temp_dir("secure");
  const testing::TlsCerts certs = testing::make_tls_certs(dir);
  std::ofstream(dir + "/token") << "correct horse battery staple\n";
  SecurityOptions security;
  security.token = read_token(dir + "/token");
  security.tls_cert_file = certs.cert;
  security.tls_key_file = certs.key;
  security.tls_ca_file = certs.ca;
  auto store = start_store_server("127.0.0.1", 0, security);
  const std::string port = std::to_string(store->port());

  // An intruder with the job's certificate but no token is refused by the store.
  {
    int fd = -1;
    auto intruder = Subprocess::start_with_output(
        {runfile("tools/worker/drpc_worker"), "--rank=1", "--world_size=3", "--master_port=" + port,
         "--tls_cert=" + certs.cert, "--tls_key=" + certs.key, "--tls_ca=" + certs.ca},
        {"GLOG_minloglevel=2"}, &fd);
    const std::string output = testing::read_until_closed(fd);
    auto code = intruder->wait(std::chrono::seconds(30));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 1) << output;
    EXPECT_TRUE(contains(output, "Unauthenticated") && contains(output, "token")) << output;
  }

  // The job: two worker processes given the token through a file and the environment.
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int r = 1; r <= 2; ++r) {
    std::vector<std::string> env = {"DRPC_RANK=" + std::to_string(r), "DRPC_WORLD_SIZE=3", "DRPC_MASTER_PORT=" + port,
                                    "DRPC_TLS_CERT=" + certs.cert, "DRPC_TLS_KEY=" + certs.key,
                                    "DRPC_TLS_CA=" + certs.ca, "GLOG_minloglevel=1"};
    env.push_back(r == 1 ? "DRPC_TOKEN_FILE=" + dir + "/token" : "DRPC_TOKEN=" + security.token);
    workers.push_back(Subprocess::start({runfile("tools/worker/drpc_worker")}, env));
  }
  Options options;
  options.master_port = store->port();
  options.host_store = false;
  options.init_timeout = std::chrono::seconds(30);
  options.token = security.token;
  options.tls_cert_file = certs.cert;
  options.tls_key_file = certs.key;
  options.tls_ca_file = certs.ca;
  init_rpc("worker0", 0, 3, options);
  at::Tensor x = at::arange(6, at::kFloat);
  EXPECT_TRUE(at::equal(rpc_sync("worker1", "aten::mul", {x, 2.0}).toTensor(), x * 2));
  RRef held = remote("worker2", "aten::add", {x, x});
  EXPECT_TRUE(at::equal(held.to_here().toTensor(), x * 2));
  {
    at::Tensor w = at::ones({6}).set_requires_grad(true);
    dist_autograd::Context ctx;
    at::Tensor y = rpc_sync("worker1", "aten::mul", {w, x}).toTensor();
    at::Tensor z = rpc_sync("worker2", "aten::mul", {y, y}).toTensor();
    dist_autograd::backward(ctx.id(), {z.sum()});
    auto grads = dist_autograd::get_gradients(ctx.id());
    EXPECT_TRUE(at::allclose(grads.at(w), 2 * x * x)) << grads.at(w);
  }
  held = RRef();
  shutdown(true);
  for (auto& w : workers) {
    auto code = w->wait(std::chrono::seconds(60));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 0);
  }
}

}  // namespace
}  // namespace drpc
