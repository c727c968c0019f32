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
#include <signal.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "common/utf8.h"
#include "drpc.h"
#include "tools/flags/env_flags.h"
#include "tools/worker/metrics_http.h"

DEFINE_string(name, "", "this worker's name (default: worker<rank>)");
DEFINE_int32(local_rank, -1, "this worker's rank on its machine (or LOCAL_RANK; informational: logged)");
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
DEFINE_int32(tolerate_failed_peers, 0, "/healthz stays 200 with up to this many peers gone (failed or stopped)");
// --log_dir is glog's own flag (logs go there instead of /tmp); DRPC_LOG_DIR works too.

// The exit status after SIGTERM, as a shell reports a process the signal killed.
constexpr int kSigtermExit = 128 + SIGTERM;

namespace {

enum class Phase { kJoining, kServing, kLeaving, kDone };
std::atomic<Phase> g_phase{Phase::kJoining};
std::mutex g_runtime_mu;
drpc::Runtime* g_runtime = nullptr;  // guarded by g_runtime_mu; set once joined

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kJoining: return "joining";
    case Phase::kServing: return "serving";
    case Phase::kLeaving: return "leaving";
    default: return "done";
  }
}

std::string json_string(const std::string& raw) {
  std::string out = "\"";
  for (unsigned char c : drpc::valid_utf8(raw)) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

// The peers that are gone: "worker2 (reason)", ... Those that said goodbye count too: a
// worker serves inside its graceful shutdown, which ends only once the whole job is done,
// so a peer leaves before that only when it was stopped (SIGTERM, a preemption) or failed
// its own way; at the very end of a job peers leave moments before this worker exits.
std::vector<std::string> failed_peers(const drpc::MetricsSnapshot& s) {
  std::vector<std::string> failed;
  for (const auto& p : s.peers) {
    if (!p.alive) failed.push_back(p.name + " (" + p.reason + ")");
  }
  return failed;
}

// /metrics, /healthz and /state. They read the runtime only once the worker has joined
// and until main releases it (g_phase; main stops the server before the release).
std::map<std::string, drpc::MetricsHttpServer::Handler> routes(const std::string& name, int rank, int world_size) {
  using Response = drpc::MetricsHttpServer::Response;
  std::map<std::string, drpc::MetricsHttpServer::Handler> r;
  r["/metrics"] = [] {
    if (g_phase != Phase::kServing) return Response{503, "text/plain; charset=utf-8", "not serving: still joining or leaving the job\n"};
    return Response{200, "text/plain; version=0.0.4; charset=utf-8", drpc::to_prometheus_text(drpc::get_metrics())};
  };
  // 200 once joined; 503 while joining, while leaving, or once a peer is gone (a job that
  // lost a worker cannot be made whole again: drpc admits no replacement).
  r["/healthz"] = [] {
    const Phase phase = g_phase;
    if (phase == Phase::kJoining) return Response{503, "text/plain; charset=utf-8", "joining the job\n"};
    if (phase != Phase::kServing) return Response{503, "text/plain; charset=utf-8", "leaving the job\n"};
    const auto failed = failed_peers(drpc::get_metrics());
    if (failed.size() > static_cast<size_t>(FLAGS_tolerate_failed_peers)) {
      std::string body = "peer gone:";
      for (const auto& f : failed) body += " " + f;
      return Response{503, "text/plain; charset=utf-8", body + "\n"};
    }
    return Response{200, "text/plain; charset=utf-8", "ok\n"};
  };
  r["/state"] = [name, rank, world_size] {
    const Phase phase = g_phase;
    std::string j = "{\"worker\":" + json_string(name) + ",\"rank\":" + std::to_string(rank) +
                    ",\"world_size\":" + std::to_string(world_size) + ",\"local_rank\":" +
                    std::to_string(FLAGS_local_rank) + ",\"state\":\"" + phase_name(phase) + "\"";
    if (phase == Phase::kServing) {
      const drpc::MetricsSnapshot s = drpc::get_metrics();
      j += ",\"healthy\":";
      j += failed_peers(s).size() > static_cast<size_t>(FLAGS_tolerate_failed_peers) ? "false" : "true";
      j += ",\"peers\":[";
      for (size_t i = 0; i < s.peers.size(); ++i) {
        const auto& p = s.peers[i];
        j += std::string(i ? "," : "") + "{\"name\":" + json_string(p.name) + ",\"rank\":" + std::to_string(p.rank) +
             ",\"state\":\"" + (p.alive ? "alive" : p.left ? "left" : "failed") + "\"";
        if (!p.alive) j += ",\"reason\":" + json_string(p.reason);
        j += ",\"last_heard_seconds_ago\":" + (p.last_heard_seconds < 0 ? std::string("null") : json_number(p.last_heard_seconds)) + "}";
      }
      j += "],\"calls_in_flight\":{\"sent\":" + std::to_string(s.in_flight_sent) + ",\"received\":" +
           std::to_string(s.in_flight_received) + ",\"oldest\":[";
      for (size_t i = 0; i < s.calls_in_flight.size(); ++i) {
        const auto& c = s.calls_in_flight[i];
        j += std::string(i ? "," : "") + "{\"function\":" + json_string(c.function) + ",\"peer\":" + json_string(c.peer) +
             ",\"age_seconds\":" + json_number(c.age_seconds) + "}";
      }
      j += "]},\"handler_queue\":" + std::to_string(s.handler_queue) + ",\"rrefs\":{\"owners\":" +
           std::to_string(s.rref_owners) + ",\"users\":" + std::to_string(s.rref_users) + ",\"pending_forks\":" +
           std::to_string(s.rref_pending_forks) + "},\"autograd_contexts\":" + std::to_string(s.autograd_contexts);
    }
    return Response{200, "application/json", j + "}\n"};
  };
  return r;
}

int fail(const std::string& reason) {
  std::cerr << "drpc_worker: " << reason << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("drpc_worker --rank=R --world_size=N [--master_addr=A --master_port=P ...]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);  // refuses malformed flags, naming them
  drpc::Options options;
  std::string name;
  try {
    drpc::flags::from_environment();
    if (FLAGS_rank < 0 || FLAGS_world_size < 1) {
      return fail(
          "--rank and --world_size (or DRPC_RANK / RANK / JOB_COMPLETION_INDEX and DRPC_WORLD_SIZE / WORLD_SIZE) "
          "are required");
    }
    drpc::flags::check_range("rank", FLAGS_rank, 0, FLAGS_world_size - 1);
    drpc::flags::check_range("master_port", FLAGS_master_port, 0, 65535);
    drpc::flags::check_range("rpc_timeout_ms", FLAGS_rpc_timeout_ms, 0, INT32_MAX);
    drpc::flags::check_range("num_threads", FLAGS_num_threads, 1, 1024);
    drpc::flags::check_range("heartbeat_ms", FLAGS_heartbeat_ms, 0, INT32_MAX);
    drpc::flags::check_range("heartbeat_misses", FLAGS_heartbeat_misses, 1, INT32_MAX);
    drpc::flags::check_range("metrics_port", FLAGS_metrics_port, -1, 65535);
    drpc::flags::check_range("tolerate_failed_peers", FLAGS_tolerate_failed_peers, 0, INT32_MAX);
    name = FLAGS_name.empty() ? "worker" + std::to_string(FLAGS_rank) : FLAGS_name;
    options.master_addr = FLAGS_master_addr;
    options.master_port = FLAGS_master_port;
    options.listen_host = FLAGS_listen;
    options.advertise_host = FLAGS_advertise;
    options.rpc_timeout = std::chrono::milliseconds(FLAGS_rpc_timeout_ms);
    options.num_worker_threads = FLAGS_num_threads;
    options.token = drpc::read_token(FLAGS_token_file);
    options.tls_cert_file = FLAGS_tls_cert;
    options.tls_key_file = FLAGS_tls_key;
    options.tls_ca_file = FLAGS_tls_ca;
    options.tls_server_name = FLAGS_tls_server_name;
    options.heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_ms);
    options.heartbeat_misses = FLAGS_heartbeat_misses;
    std::stringstream loads(FLAGS_load);
    for (std::string item; std::getline(loads, item, ',');) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) return fail("--load wants NAME=FILE, got '" + item + "'");
      options.scripts.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  } catch (const drpc::Error& e) {
    return fail("bad setting: " + e.message());
  } catch (const std::exception& e) {
    return fail(std::string("bad setting: ") + e.what());
  }
  drpc::init_logging(argv[0]);
  const int rank = FLAGS_rank, world_size = FLAGS_world_size, metrics_port = FLAGS_metrics_port;
  const std::string metrics_host = FLAGS_metrics_host;
  at::set_num_threads(1);

  // SIGTERM, on a thread of its own (blocked here before any other thread starts, so every
  // thread inherits the mask): leave the job, then exit 143.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);
  std::thread([term] {
    int signal = 0;
    sigwait(&term, &signal);
    g_phase = Phase::kLeaving;
    LOG(WARNING) << "SIGTERM: leaving the job";
    {
      std::lock_guard<std::mutex> lock(g_runtime_mu);
      if (!g_runtime) std::_Exit(kSigtermExit);  // not joined yet (or done): nothing to leave
      // Not graceful: the job may never finish. The agent stops at once (pending calls
      // fail); the main thread's shutdown then stops waiting for the job, closes the process
      // group (peers see this worker go) and exits 143.
      try {
        g_runtime->agent().shutdown(false);
      } catch (const std::exception& e) {
        LOG(ERROR) << "SIGTERM: " << e.what();
      }
    }
    std::this_thread::sleep_for(std::chrono::seconds(10));
    LOG(ERROR) << "SIGTERM: leaving took over 10 s; exiting anyway";
    std::_Exit(kSigtermExit);
  }).detach();

  // The endpoint serves from the start: /healthz says 503 while the worker joins.
  std::unique_ptr<drpc::MetricsHttpServer> metrics;
  if (metrics_port >= 0) {
    try {
      metrics = drpc::MetricsHttpServer::start(metrics_host, metrics_port, routes(name, rank, world_size));
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    std::cout << "drpc_worker: " << name << " serves metrics on http://" << metrics_host << ":" << metrics->port()
              << "/metrics" << std::endl;
  }
  try {
    drpc::init_rpc(name, rank, world_size, options);
  } catch (const std::exception& e) {
    if (metrics) metrics->stop();
    return fail(e.what());
  }
  {
    std::lock_guard<std::mutex> lock(g_runtime_mu);
    g_runtime = &drpc::current_runtime();
  }
  Phase joining = Phase::kJoining;
  g_phase.compare_exchange_strong(joining, Phase::kServing);
  LOG(INFO) << name << " (rank " << rank << " of " << world_size
            << (FLAGS_local_rank >= 0 ? ", local rank " + std::to_string(FLAGS_local_rank) : std::string()) << ") serving";
  std::string error;
  try {
    drpc::current_runtime().shutdown(true);  // serves until every worker of the job has shut down
  } catch (const std::exception& e) {
    error = e.what();
  }
  const bool terminated = g_phase == Phase::kLeaving;  // SIGTERM stopped the agent
  g_phase = Phase::kDone;
  LOG(INFO) << "metrics at shutdown:\n" << drpc::to_prometheus_text(drpc::get_metrics());
  if (metrics) metrics->stop();
  {
    std::lock_guard<std::mutex> lock(g_runtime_mu);
    g_runtime = nullptr;
    drpc::shutdown(true);  // already shut down: releases the runtime
  }
  if (terminated) return kSigtermExit;
  if (!error.empty()) return fail(error);
  return 0;
}
