#include "tools/worker/job_process.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "common/utf8.h"
#include "tools/flags/env_flags.h"
#include "tools/worker/metrics_http.h"

DEFINE_int32(rank, -1, "this worker's rank (or DRPC_RANK, RANK, JOB_COMPLETION_INDEX)");
DEFINE_int32(world_size, -1, "number of workers in the job (or DRPC_WORLD_SIZE, WORLD_SIZE)");
DEFINE_int32(local_rank, -1, "this worker's rank on its machine (or LOCAL_RANK; informational: logged)");
DEFINE_string(master_addr, "127.0.0.1", "where rank 0 serves the rendezvous store");
DEFINE_int32(master_port, 29500, "the store's port");
DEFINE_string(listen, "127.0.0.1", "the address this worker listens on");
DEFINE_string(advertise, "", "the address peers dial (required when --listen=0.0.0.0)");
DEFINE_int32(rpc_timeout_ms, 60000, "default RPC deadline");
DEFINE_int32(num_threads, 4, "handler threads");
DEFINE_string(token_file, "", "a file holding the job's token (else DRPC_TOKEN; never pass the token itself as a flag)");
DEFINE_string(tls_cert, "", "TLS: this worker's certificate chain (PEM)");
DEFINE_string(tls_key, "", "TLS: this worker's private key (PEM)");
DEFINE_string(tls_ca, "", "TLS: the job's CA certificate (PEM)");
DEFINE_string(tls_server_name, "", "TLS: the name in peers' certificates, if not their address");
DEFINE_int32(heartbeat_ms, 1000, "heartbeat interval (0: off)");
DEFINE_int32(heartbeat_misses, 10, "missed heartbeats after which a peer is declared failed");
DEFINE_string(data_plane, "", "auto | ucx | grpc: the link between workers (else DRPC_DATA_PLANE, else auto)");
DEFINE_int64(shm_arena_mb, 512, "MiB of shared-memory arena per peer on this host for large tensors (0: none)");
DEFINE_int32(metrics_port, -1, "serve /metrics, /healthz and /state on this port (0: any free one; -1: off)");
DEFINE_string(metrics_host, "127.0.0.1", "the address the metrics endpoint listens on");
DEFINE_int32(tolerate_failed_peers, 0, "/healthz stays 200 with up to this many peers gone (failed or stopped)");

namespace drpc {
namespace job {
namespace {

enum class Phase { kJoining, kServing, kLeaving, kDone };
std::atomic<Phase> g_phase{Phase::kJoining};
std::mutex g_runtime_mu;
Runtime* g_runtime = nullptr;  // guarded by g_runtime_mu; set once joined

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
  for (unsigned char c : valid_utf8(raw)) {
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
std::vector<std::string> failed_peers(const MetricsSnapshot& s) {
  std::vector<std::string> failed;
  for (const auto& p : s.peers) {
    if (!p.alive) failed.push_back(p.name + " (" + p.reason + ")");
  }
  return failed;
}

// /metrics, /healthz and /state. They read the runtime only once the worker has joined
// and until main releases it (g_phase; main stops the server before the release).
std::map<std::string, MetricsHttpServer::Handler> routes(const std::string& name, int rank, int world_size) {
  using Response = MetricsHttpServer::Response;
  std::map<std::string, MetricsHttpServer::Handler> r;
  r["/metrics"] = [] {
    if (g_phase != Phase::kServing) return Response{503, "text/plain; charset=utf-8", "not serving: still joining or leaving the job\n"};
    return Response{200, "text/plain; version=0.0.4; charset=utf-8", to_prometheus_text(get_metrics())};
  };
  // 200 once joined; 503 while joining, while leaving, or once a peer is gone (a job that
  // lost a worker cannot be made whole again: drpc admits no replacement).
  r["/healthz"] = [] {
    const Phase phase = g_phase;
    if (phase == Phase::kJoining) return Response{503, "text/plain; charset=utf-8", "joining the job\n"};
    if (phase != Phase::kServing) return Response{503, "text/plain; charset=utf-8", "leaving the job\n"};
    const auto failed = failed_peers(get_metrics());
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
      const MetricsSnapshot s = get_metrics();
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

int fail(const std::string& program, const std::string& reason) {
  std::cerr << program << ": " << reason << std::endl;
  return 1;
}

// SIGTERM, on a thread of its own (blocked here before any other thread starts, so every
// thread inherits the mask): leave the job, then exit 143.
void leave_on_sigterm() {
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
}

}  // namespace

Settings settings_from_flags() {
  flags::from_environment();
  if (FLAGS_rank < 0 || FLAGS_world_size < 1) {
    throw Error(ErrorKind::kBadArgument,
                "--rank and --world_size (or DRPC_RANK / RANK / JOB_COMPLETION_INDEX and DRPC_WORLD_SIZE / "
                "WORLD_SIZE) are required");
  }
  flags::check_range("rank", FLAGS_rank, 0, FLAGS_world_size - 1);
  flags::check_range("master_port", FLAGS_master_port, 0, 65535);
  flags::check_range("rpc_timeout_ms", FLAGS_rpc_timeout_ms, 0, INT32_MAX);
  flags::check_range("num_threads", FLAGS_num_threads, 1, 1024);
  flags::check_range("heartbeat_ms", FLAGS_heartbeat_ms, 0, INT32_MAX);
  flags::check_range("heartbeat_misses", FLAGS_heartbeat_misses, 1, INT32_MAX);
  flags::check_range("metrics_port", FLAGS_metrics_port, -1, 65535);
  flags::check_range("tolerate_failed_peers", FLAGS_tolerate_failed_peers, 0, INT32_MAX);
  Settings s;
  s.rank = FLAGS_rank;
  s.world_size = FLAGS_world_size;
  Options& o = s.options;
  o.master_addr = FLAGS_master_addr;
  o.master_port = FLAGS_master_port;
  o.listen_host = FLAGS_listen;
  o.advertise_host = FLAGS_advertise;
  o.rpc_timeout = std::chrono::milliseconds(FLAGS_rpc_timeout_ms);
  o.num_worker_threads = FLAGS_num_threads;
  o.token = read_token(FLAGS_token_file);
  o.tls_cert_file = FLAGS_tls_cert;
  o.tls_key_file = FLAGS_tls_key;
  o.tls_ca_file = FLAGS_tls_ca;
  o.tls_server_name = FLAGS_tls_server_name;
  o.heartbeat_interval = std::chrono::milliseconds(FLAGS_heartbeat_ms);
  o.data_plane = FLAGS_data_plane;
  o.shm_arena_mb = FLAGS_shm_arena_mb;
  o.heartbeat_misses = FLAGS_heartbeat_misses;
  return s;
}

int run(const std::string& program, const std::string& name, const Settings& settings,
        const std::function<void()>& body) {
  const int rank = settings.rank, world_size = settings.world_size;
  leave_on_sigterm();

  // The endpoint serves from the start: /healthz says 503 while the worker joins.
  std::unique_ptr<MetricsHttpServer> metrics;
  if (FLAGS_metrics_port >= 0) {
    try {
      metrics = MetricsHttpServer::start(FLAGS_metrics_host, FLAGS_metrics_port, routes(name, rank, world_size));
    } catch (const std::exception& e) {
      return fail(program, e.what());
    }
    std::cout << program << ": " << name << " serves metrics on http://" << FLAGS_metrics_host << ":"
              << metrics->port() << "/metrics" << std::endl;
  }
  try {
    init_rpc(name, rank, world_size, settings.options);
  } catch (const std::exception& e) {
    if (metrics) metrics->stop();
    return fail(program, e.what());
  }
  {
    std::lock_guard<std::mutex> lock(g_runtime_mu);
    g_runtime = &current_runtime();
  }
  Phase joining = Phase::kJoining;
  g_phase.compare_exchange_strong(joining, Phase::kServing);
  LOG(INFO) << name << " (rank " << rank << " of " << world_size
            << (FLAGS_local_rank >= 0 ? ", local rank " + std::to_string(FLAGS_local_rank) : std::string()) << ") serving";
  std::string error;
  try {
    if (body) body();
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    // Graceful unless the body failed: then peers learn at once that this worker is gone.
    current_runtime().shutdown(error.empty());
  } catch (const std::exception& e) {
    if (error.empty()) error = e.what();
  }
  const bool terminated = g_phase == Phase::kLeaving;  // SIGTERM stopped the agent
  g_phase = Phase::kDone;
  const MetricsSnapshot at_exit = get_metrics();
  LOG(INFO) << "metrics at shutdown:\n" << to_prometheus_text(at_exit);
  // A peer that failed (not one that left) broke the job even if this worker's own part
  // ended well: the job's result is incomplete, and an orchestrator must see it fail.
  for (const auto& p : at_exit.peers) {
    if (error.empty() && !p.alive && !p.left) error = "the job lost " + p.name + ": " + p.reason;
  }
  if (metrics) metrics->stop();
  {
    std::lock_guard<std::mutex> lock(g_runtime_mu);
    g_runtime = nullptr;
    shutdown(true);  // already shut down: releases the runtime
  }
  if (terminated) return kSigtermExit;
  if (!error.empty()) return fail(program, error);
  return 0;
}

}  // namespace job
}  // namespace drpc
