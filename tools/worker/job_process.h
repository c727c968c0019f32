#pragma once

// What every drpc program that an operator runs as one worker of a job shares: the job's
// flags, the health endpoint and the exit statuses. drpc_worker and the main job
// (tools/demo/fashion_mnist) are built on it, so a container or a Kubernetes pod starts
// either one the same way.
//
// Flags (each not given on the command line reads DRPC_<FLAG>, then torch's and Kubernetes'
// names: tools/flags/env_flags.h): --rank, --world_size, --local_rank, --master_addr,
// --master_port, --listen, --advertise, --rpc_timeout_ms, --num_threads, --token_file,
// --tls_cert, --tls_key, --tls_ca, --tls_server_name, --heartbeat_ms, --heartbeat_misses,
// --metrics_port, --metrics_host, --tolerate_failed_peers.
//
// The endpoint (--metrics_port; 0: any free port, announced on stdout) serves /metrics
// (Prometheus text), /healthz (200 once joined; 503 while joining, while leaving, or once
// more peers than --tolerate_failed_peers are gone) and /state (JSON: peers, calls in
// flight, RRef and autograd-context counts).

#include <functional>
#include <string>

#include "drpc.h"

namespace drpc {
namespace job {

// The exit status after SIGTERM, as a shell reports a process the signal killed.
constexpr int kSigtermExit = 143;

// The job's settings from the flags and the environment. Call once, right after
// gflags::ParseCommandLineFlags (it reads every flag of the program from the environment,
// the program's own too). Throws drpc::Error(kBadArgument) naming the flag or variable
// that is wrong or missing; reads the token file.
struct Settings {
  int rank = -1;
  int world_size = -1;
  Options options;
};
Settings settings_from_flags();

// Runs this process's part of the job: starts the endpoint, joins as `name`, runs `body`
// on this thread (empty: nothing; a trainer trains there), then shuts down gracefully,
// which serves peers until every worker of the job has shut down. SIGTERM at any point
// leaves the job at once (pending calls fail; peers see this worker go). Returns the exit
// status: 0 after a graceful shutdown, kSigtermExit after SIGTERM, 1 after an error (told
// on stderr as "`program`: reason"). Call once per process, from main, before starting
// other threads (it blocks SIGTERM for the process).
int run(const std::string& program, const std::string& name, const Settings& settings,
        const std::function<void()>& body = {});

}  // namespace job
}  // namespace drpc
