// A worker process of a drpc job: joins the job, serves RPCs (builtin operators, the
// functions linked into this binary, TorchScript it loads) until the job shuts down.
//   drpc_worker --name=worker1 --rank=1 --world_size=3 --master_addr=10.0.0.5 --master_port=29500
//               [--listen=0.0.0.0] [--load=model=/models/model.pt,...] [--rpc_timeout_ms=60000]
// Every flag not given reads the environment variable DRPC_<FLAG> (DRPC_NAME, DRPC_RANK,
// DRPC_WORLD_SIZE, DRPC_MASTER_ADDR, DRPC_MASTER_PORT, DRPC_LISTEN, DRPC_ADVERTISE, DRPC_LOAD,
// DRPC_RPC_TIMEOUT_MS, DRPC_NUM_THREADS, DRPC_TOKEN_FILE, DRPC_TLS_CERT, ...), as container
// orchestrators set them, and then torch's names (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, LOCAL_RANK) and Kubernetes' JOB_COMPLETION_INDEX for the rank
// (tools/flags/env_flags.h). Numbers must be whole numbers ("29500x" is refused, naming
// the flag or variable). The job token comes from --token_file or DRPC_TOKEN.
// --metrics_port=P (DRPC_METRICS_PORT; 0: any free port, announced on stdout) serves the
// worker's metrics in Prometheus' text format at http://127.0.0.1:P/metrics, or on
// --metrics_host (DRPC_METRICS_HOST); the worker logs them at shutdown. Log lines carry
// "[name/rank]"; --v=1 logs every call and reply, --v=2 the agent's internals.
// Exits 0 after a graceful shutdown; 143 (128 + SIGTERM) on SIGTERM, after leaving the job
// (a preempted worker is not a success); 1 with a one-line reason otherwise.

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <ATen/Parallel.h>

#include <iostream>
#include <sstream>

#include "common/logging.h"
#include "drpc.h"
#include "tools/worker/job_process.h"

// The job's flags (--rank, --master_addr, --token_file, --metrics_port, ...) are
// tools/worker/job_process.h's; these are the worker's own.
DEFINE_string(name, "", "this worker's name (default: worker<rank>)");
DEFINE_string(load, "", "TorchScript to host: NAME=FILE[,NAME=FILE...]");
// --log_dir is glog's own flag (logs go there instead of /tmp); DRPC_LOG_DIR works too.

namespace {

int fail(const std::string& reason) {
  std::cerr << "drpc_worker: " << reason << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("drpc_worker --rank=R --world_size=N [--master_addr=A --master_port=P ...]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);  // refuses malformed flags, naming them
  drpc::job::Settings settings;
  std::string name;
  try {
    settings = drpc::job::settings_from_flags();
    name = FLAGS_name.empty() ? "worker" + std::to_string(settings.rank) : FLAGS_name;
    std::stringstream loads(FLAGS_load);
    for (std::string item; std::getline(loads, item, ',');) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) return fail("--load wants NAME=FILE, got '" + item + "'");
      settings.options.scripts.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  } catch (const drpc::Error& e) {
    return fail("bad setting: " + e.message());
  } catch (const std::exception& e) {
    return fail(std::string("bad setting: ") + e.what());
  }
  drpc::init_logging(argv[0]);
  at::set_num_threads(1);
  return drpc::job::run("drpc_worker", name, settings);  // serves until the whole job has shut down
}
