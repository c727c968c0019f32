// A worker process of a drpc job: joins the job, serves RPCs (builtin operators, the
// functions linked into this binary, TorchScript it loads) until the job shuts down.
//   drpc_worker --name=worker1 --rank=1 --world_size=3 --master_addr=10.0.0.5 --master_port=29500
//               [--listen=0.0.0.0] [--load=model=/models/model.pt,...] [--rpc_timeout_ms=60000]
// Every flag not given falls back to an environment variable (DRPC_NAME, DRPC_RANK,
// DRPC_WORLD_SIZE, DRPC_MASTER_ADDR, DRPC_MASTER_PORT, DRPC_LISTEN, DRPC_ADVERTISE, DRPC_LOAD,
// DRPC_RPC_TIMEOUT_MS, DRPC_NUM_THREADS, DRPC_TOKEN_FILE, DRPC_TLS_CERT, DRPC_TLS_KEY,
// DRPC_TLS_CA, DRPC_TLS_SERVER_NAME, DRPC_HEARTBEAT_MS, DRPC_HEARTBEAT_MISSES), as
// container orchestrators set them. The job token comes from --token_file or DRPC_TOKEN.
// --metrics_port=P (DRPC_METRICS_PORT; 0: any free port, announced on stdout) serves the
// worker's metrics in Prometheus' text format at http://127.0.0.1:P/metrics, or on
// --metrics_host (DRPC_METRICS_HOST); the worker logs them at shutdown. Log lines carry
// "[name/rank]"; --v=1 logs every call and reply, --v=2 the agent's internals.
// Exits 0 after a graceful shutdown (or SIGTERM: it leaves the job), 1 with a one-line
// reason otherwise.

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "drpc.h"
#include "tools/worker/metrics_http.h"

DEFINE_string(name, "", "this worker's name (default: worker<rank>)");
DEFINE_int32(rank, -1, "this worker's rank");
DEFINE_int32(world_size, -1, "number of workers in the job");
DEFINE_string(master_addr, "127.0.0.1", "where rank 0 serves the rendezvous store");
DEFINE_int32(master_port, 29500, "the store's port");
DEFINE_string(listen, "127.0.0.1", "the address this worker listens on");
DEFINE_string(advertise, "", "the address peers dial (required when --listen=0.0.0.0)");
DEFINE_string(load, "", "TorchScript to host: NAME=FILE[,NAME=FILE...]");
DEFINE_int32(rpc_timeout_ms, 60000, "default RPC deadline");
DEFINE_int32(num_threads, 4, "handler threads");
DEFINE_string(token_file, "", "a file holding the job's token (else DRPC_TOKEN; never pass the token itself as a flag)");
DEFINE_string(tls_cert, "", "TLS: this worker's certificate chain (PEM)");
DEFINE_string(tls_key, "", "TLS: this worker's private key (PEM)");
DEFINE_string(tls_ca, "", "TLS: the job's CA certificate (PEM)");
DEFINE_string(tls_server_name, "", "TLS: the name in peers' certificates, if not their address");
DEFINE_int32(heartbeat_ms, 1000, "heartbeat interval (0: off)");
DEFINE_int32(heartbeat_misses, 10, "missed heartbeats after which a peer is declared failed");
DEFINE_int32(metrics_port, -1, "serve Prometheus metrics on this port (0: any free one; -1: off)");
DEFINE_string(metrics_host, "127.0.0.1", "the address the metrics endpoint listens on");
// --log_dir is glog's own flag (logs go there instead of /tmp); DRPC_LOG_DIR works too.

namespace {

// The flag if it was given, else the environment variable, else the flag's default.
std::string setting(const char* flag, const char* env) {
  gflags::CommandLineFlagInfo info = gflags::GetCommandLineFlagInfoOrDie(flag);
  if (!info.is_default) return info.current_value;
  const char* v = std::getenv(env);
  return v ? v : info.current_value;
}

int fail(const std::string& reason) {
  std::cerr << "drpc_worker: " << reason << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const std::string log_dir = setting("log_dir", "DRPC_LOG_DIR");
  if (!log_dir.empty()) FLAGS_log_dir = log_dir;
  drpc::init_logging(argv[0]);
  int rank, world_size, metrics_port;
  std::string metrics_host;
  drpc::Options options;
  std::string name;
  try {
    rank = std::stoi(setting("rank", "DRPC_RANK"));
    world_size = std::stoi(setting("world_size", "DRPC_WORLD_SIZE"));
    name = setting("name", "DRPC_NAME");
    if (name.empty()) name = "worker" + std::to_string(rank);
    options.master_addr = setting("master_addr", "DRPC_MASTER_ADDR");
    options.master_port = std::stoi(setting("master_port", "DRPC_MASTER_PORT"));
    options.listen_host = setting("listen", "DRPC_LISTEN");
    options.advertise_host = setting("advertise", "DRPC_ADVERTISE");
    options.rpc_timeout = std::chrono::milliseconds(std::stoi(setting("rpc_timeout_ms", "DRPC_RPC_TIMEOUT_MS")));
    options.num_worker_threads = std::stoi(setting("num_threads", "DRPC_NUM_THREADS"));
    options.token = drpc::read_token(setting("token_file", "DRPC_TOKEN_FILE"));
    options.tls_cert_file = setting("tls_cert", "DRPC_TLS_CERT");
    options.tls_key_file = setting("tls_key", "DRPC_TLS_KEY");
    options.tls_ca_file = setting("tls_ca", "DRPC_TLS_CA");
    options.tls_server_name = setting("tls_server_name", "DRPC_TLS_SERVER_NAME");
    options.heartbeat_interval = std::chrono::milliseconds(std::stoi(setting("heartbeat_ms", "DRPC_HEARTBEAT_MS")));
    options.heartbeat_misses = std::stoi(setting("heartbeat_misses", "DRPC_HEARTBEAT_MISSES"));
    metrics_port = std::stoi(setting("metrics_port", "DRPC_METRICS_PORT"));
    metrics_host = setting("metrics_host", "DRPC_METRICS_HOST");
    std::stringstream loads(setting("load", "DRPC_LOAD"));
    for (std::string item; std::getline(loads, item, ',');) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) return fail("--load wants NAME=FILE, got '" + item + "'");
      options.scripts.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  } catch (const std::exception& e) {
    return fail(std::string("bad setting: ") + e.what());
  }
  if (rank < 0 || world_size < 1) return fail("--rank and --world_size (or DRPC_RANK, DRPC_WORLD_SIZE) are required");
  at::set_num_threads(1);

  // SIGTERM: leave the job (an orderly exit; the others see this worker go).
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);
  try {
    drpc::init_rpc(name, rank, world_size, options);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  LOG(INFO) << name << " (rank " << rank << " of " << world_size << ") serving";
  std::unique_ptr<drpc::MetricsHttpServer> metrics;
  if (metrics_port >= 0) {
    try {
      metrics = drpc::MetricsHttpServer::start(metrics_host, metrics_port,
                                               [] { return drpc::to_prometheus_text(drpc::get_metrics()); });
    } catch (const std::exception& e) {
      drpc::shutdown(false);
      return fail(e.what());
    }
    std::cout << "drpc_worker: " << name << " serves metrics on http://" << metrics_host << ":" << metrics->port()
              << "/metrics" << std::endl;
  }
  // SIGTERM exits at once: peers see the connections close. (The main thread stays in
  // the graceful shutdown below, which waits for the whole job.)
  std::thread([term] {
    int signal = 0;
    sigwait(&term, &signal);
    LOG(WARNING) << "SIGTERM: leaving the job";
    std::_Exit(0);
  }).detach();
  try {
    drpc::current_runtime().shutdown(true);  // serves until every worker of the job has shut down
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  LOG(INFO) << "metrics at shutdown:\n" << drpc::to_prometheus_text(drpc::get_metrics());
  if (metrics) metrics->stop();
  drpc::shutdown(true);  // already shut down: releases the runtime
  return 0;
}
