#pragma once

// drpc's public API: remote calls between named workers of a libtorch job, over a gRPC
// process group. The names mirror torch.distributed.rpc.

#include <ATen/core/ivalue.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/executor.h"
#include "process_group/group_endpoints.h"
#include "process_group/message_port.h"
#include "process_group/process_group.h"
#include "process_group/store.h"
#include "rpc/function_registry.h"
#include "rpc/metrics.h"
#include "rpc/profiler.h"
#include "rpc/rpc_agent.h"
#include "dist_autograd/dist_autograd.h"
#include "dist_autograd/optimizer_host.h"
#include "rref/rref.h"

namespace drpc {

using RpcError = Error;

// Pass as a timeout to use the job's default (Options::rpc_timeout); 0 means no deadline.
constexpr std::chrono::milliseconds kDefaultTimeout{-1};

struct Options;
// Builds one worker's process group and the message port over the same transport (the
// agent's channel), rendezvousing through `store` (the job's store under a prefix of the
// group's own; only used during the call). Returns once every peer is connected; throws
// drpc::Error as create_grpc_group_endpoints does.
using ProcessGroupFactory = std::function<GroupEndpoints(Store& store, int rank, int world_size,
                                                         const Options& options)>;
// The default: the gRPC process group configured by Options' addresses, init_timeout,
// token, TLS and heartbeat fields.
ProcessGroupFactory grpc_process_group_factory();

struct Options {
  std::string master_addr = "127.0.0.1";  // where the store is served
  int master_port = 29500;
  bool host_store = true;                 // rank 0 serves the store (else it runs elsewhere)
  Store* store = nullptr;                 // rendezvous through this store instead (borrowed)
  std::string listen_host = "127.0.0.1";  // the address this worker listens on
  std::string advertise_host;             // what peers dial (default: listen_host)
  std::chrono::milliseconds rpc_timeout{60000};
  std::chrono::milliseconds init_timeout{60000};
  int num_worker_threads = 4;
  // A shared secret every connection (to the store and between workers) must present;
  // empty: none. Get it with read_token() (a file or DRPC_TOKEN), never from a flag.
  std::string token;
  // TLS through gRPC: this worker's certificate chain and key, and the job's CA (PEM
  // files; all three or none). Every connection verifies both ends. `tls_server_name`:
  // the name peers' certificates carry, when it is not the address dialled.
  std::string tls_cert_file, tls_key_file, tls_ca_file, tls_server_name;
  // Liveness: each worker sends every peer a heartbeat this often; a peer silent for
  // heartbeat_misses intervals is declared failed and calls to it fail at once (0: off).
  std::chrono::milliseconds heartbeat_interval{1000};
  int heartbeat_misses = 10;
  // The data plane between workers: "auto" (UCX shared memory between workers on one host,
  // gRPC between hosts), "ucx" (UCX between all workers: across hosts on UCX's TCP or RDMA,
  // unencrypted and unauthenticated, for trusted networks only) or "grpc". Empty: the
  // DRPC_DATA_PLANE environment variable, else "auto". A pair whose UCX link cannot be
  // opened stays on gRPC (--v=1 says why).
  std::string data_plane;
  // Between workers on one host, the large tensors of messages go through a shared-memory
  // arena per peer of this many MiB of address space, used as needed (README: "Shared memory
  // for large tensors"). 0: none; they travel as UCX messages. Negative: kBadArgument.
  int64_t shm_arena_mb = 512;
  std::string backend = "process_group";
  std::vector<std::pair<std::string, std::string>> scripts;  // TorchScript to host: name, path
  // Autograd contexts created by another worker and unused this long are reclaimed.
  std::chrono::milliseconds autograd_context_ttl{std::chrono::minutes(30)};
  // The process group under the agent (empty: grpc_process_group_factory()). Tests pass
  // one that hands out in-memory groups (testing::Job's Network::kInMemory), so every
  // layer above runs as composed here, without sockets.
  ProcessGroupFactory process_group;
};

// Builds an RpcAgent over the message port of a job's process group (see
// register_backend). `port` outlives the agent; `executor` is the worker's (its timers
// keep the agent's deadlines) and outlives it too.
using BackendFactory = std::function<std::unique_ptr<RpcAgent>(
    MessagePort& port, Executor& executor, std::vector<WorkerInfo> workers, const Options& options)>;
// Makes `factory` available as Options::backend == `name`. Thread-safe.
void register_backend(const std::string& name, BackendFactory factory);

// One worker's share of a job: store, process group, agent, functions. Several may live
// in one process (tests run ranks as threads). Thread-safe.
class Runtime {
 public:
  // Joins the job: validates `name` ([A-Za-z0-9_:-], under 128 characters, unique in the
  // job), rendezvous, connects to every worker. Throws kBadArgument, kTimeout,
  // kPeerUnavailable.
  static std::unique_ptr<Runtime> create(const std::string& name, int rank, int world_size, const Options& options);
  virtual ~Runtime() = default;

  virtual WorkerInfo get_worker_info() const = 0;
  virtual WorkerInfo get_worker_info(const std::string& name) const = 0;
  virtual std::vector<WorkerInfo> get_worker_infos() const = 0;

  // Runs function `fn` (see FunctionRegistry for names) on worker `to` and returns a
  // future of its result; errors are drpc::Error with their kind. The future completes,
  // and its `then` callbacks run, on this worker's callback threads, never on a network
  // thread: callbacks may make RPCs and wait on other futures.
  virtual FuturePtr rpc_async(const std::string& to, const std::string& fn, std::vector<c10::IValue> args = {},
                              Kwargs kwargs = {}, std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  // rpc_async(...) and wait: returns the result or throws its error.
  virtual c10::IValue rpc_sync(const std::string& to, const std::string& fn, std::vector<c10::IValue> args = {},
                               Kwargs kwargs = {}, std::chrono::milliseconds timeout = kDefaultTimeout) = 0;

  // The default timeout of the calls made from now on (kDefaultTimeout); 0 means none.
  // Calls already made keep theirs. Throws kBadArgument for a negative one.
  virtual std::chrono::milliseconds rpc_timeout() const = 0;
  virtual void set_rpc_timeout(std::chrono::milliseconds timeout) = 0;

  // Runs `fn` on `to` and returns at once an RRef to the result, which stays on `to`.
  // Errors of the call are raised by to_here() and later uses.
  virtual RRef remote(const std::string& to, const std::string& fn, std::vector<c10::IValue> args = {},
                      Kwargs kwargs = {}, std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  virtual RRef make_local(c10::IValue value) = 0;
  virtual RRefCounts rref_counts() = 0;

  virtual AutogradContainer& autograd() = 0;
  virtual FunctionRegistry& functions() = 0;
  virtual RpcAgent& agent() = 0;
  virtual ProcessGroup& process_group() = 0;
  // The job's rendezvous store, for the user's own coordination (keys live under
  // "user/"). Once the master hosting it is gone, its calls throw kPeerUnavailable naming
  // the store's address; RPCs between the remaining workers go on.
  virtual Store& store() = 0;
  // This worker's metrics now (see MetricsSnapshot); also after shutdown.
  virtual MetricsSnapshot metrics() = 0;
  // This worker's profiling switch (see Profiler).
  virtual std::shared_ptr<Tracer> tracer() = 0;

  // graceful: waits until every live worker of the job has called shutdown and none has
  // calls outstanding, however long that takes (this worker keeps serving meanwhile);
  // then deletes this worker's RRefs, waits for the job to settle again, and stops.
  // `timeout` (0: none) bounds the waiting; past it the worker stops anyway, with a
  // warning. Peers known to be gone are not waited for. Not graceful: stops at once,
  // failing what is pending with kShutdown. Idempotent.
  virtual void shutdown(bool graceful = true, std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
};

// --- the default runtime of this process, as in torch.distributed.rpc ------------------
void init_rpc(const std::string& name, int rank, int world_size, const Options& options = {});
// The job token from `file` if given, else from the environment variable DRPC_TOKEN, else
// empty. Throws kBadArgument for an unreadable or empty file.
std::string read_token(const std::string& file = "");
inline void init_model_parallel(const std::string& name, int rank, int world_size, const Options& options = {}) {
  init_rpc(name, rank, world_size, options);
}
WorkerInfo get_worker_info();
WorkerInfo get_worker_info(const std::string& name);
std::vector<WorkerInfo> get_worker_infos();
FuturePtr rpc_async(const std::string& to, const std::string& fn, std::vector<c10::IValue> args = {},
                    Kwargs kwargs = {}, std::chrono::milliseconds timeout = kDefaultTimeout);
c10::IValue rpc_sync(const std::string& to, const std::string& fn, std::vector<c10::IValue> args = {},
                     Kwargs kwargs = {}, std::chrono::milliseconds timeout = kDefaultTimeout);
RRef remote(const std::string& to, const std::string& fn, std::vector<c10::IValue> args = {}, Kwargs kwargs = {},
           std::chrono::milliseconds timeout = kDefaultTimeout);
// Waits for every future and returns their values; throws the first error as soon as any
// future fails, without waiting for the others (as torch.futures.wait_all does).
std::vector<c10::IValue> wait_all(const std::vector<FuturePtr>& futures);
ProcessGroup& process_group();
// current_runtime().set_rpc_timeout / rpc_timeout (torch's _set_rpc_timeout, get_rpc_timeout).
void set_rpc_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds get_rpc_timeout();
void shutdown(bool graceful = true, std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

namespace dist_autograd {

// A distributed autograd context for the calling thread, released on every worker that
// took part when it goes out of scope (here at once; the others are told and not waited
// for, as with torch.distributed.autograd). Calls made on this thread inside it are recorded.
// A thread has one at a time: throws kBadArgument if it already has one.
class Context {
 public:
  Context();                           // on current_runtime()
  explicit Context(Runtime& runtime);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  int64_t id() const { return id_; }

 private:
  Runtime& runtime_;
  int64_t id_;
  int64_t previous_;
};

// Runs the distributed backward pass from scalar `roots` and returns when every worker
// involved is done. Gradients go to the context (get_gradients), not to .grad.
void backward(int64_t context_id, const std::vector<at::Tensor>& roots, bool retain_graph = false);
// This worker's gradients in the context: leaf tensor -> gradient.
c10::Dict<at::Tensor, at::Tensor> get_gradients(int64_t context_id);

}  // namespace dist_autograd

namespace optim {
inline OptimizerSpec sgd(double lr, double momentum = 0, double weight_decay = 0) {
  OptimizerSpec spec;
  spec.kind = "sgd";
  spec.lr = lr;
  spec.momentum = momentum;
  spec.weight_decay = weight_decay;
  return spec;
}
inline OptimizerSpec adam(double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8) {
  OptimizerSpec spec;
  spec.kind = "adam";
  spec.lr = lr;
  spec.beta1 = beta1;
  spec.beta2 = beta2;
  spec.eps = eps;
  return spec;
}
}  // namespace optim

// Updates parameters that live on any workers (given as RRefs) with the gradients of a
// distributed autograd context: one optimizer per owner, created there; step() runs
// them concurrently and returns when all are done. Thread-safe.
class DistributedOptimizer {
 public:
  DistributedOptimizer(const OptimizerSpec& spec, const std::vector<RRef>& params);  // on current_runtime()
  DistributedOptimizer(Runtime& runtime, const OptimizerSpec& spec, const std::vector<RRef>& params);
  // Drops the optimizers it created on the owners (waits for their answers; a gone owner
  // or a stopped runtime has nothing left to drop).
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;
  void step(int64_t context_id);

 private:
  RemoteOptimizers remote_;  // the protocol's client (dist_autograd/optimizer_protocol.h)
};

// The runtime that free functions use on this thread: inside a function called over RPC,
// the worker serving it; otherwise the one init_rpc made. Throws kShutdown if none.
Runtime& current_runtime();

// --- observability ---------------------------------------------------------------------

// current_runtime().metrics(): calls by function and peer, errors by kind, bytes, in-flight
// calls, handler queue, latency quantiles, RRef and autograd counts. to_prometheus_text()
// formats them for a scraper.
MetricsSnapshot get_metrics();

// The RPC profiler: records every call this worker makes while it runs, from any thread,
// together with what each worker the call reaches does for it (send, network, queue and
// execution spans, and the calls made meanwhile, nested), merged here on this worker's
// clock; then writes a Chrome trace (chrome://tracing, Perfetto) with one process per
// worker and one row per thread. Starts when constructed; one at a time per worker
// (kBadArgument otherwise). Calls still in flight when it stops are left out. Not
// thread-safe itself; it may outlive its runtime.
class Profiler {
 public:
  Profiler();  // on current_runtime()
  explicit Profiler(Runtime& runtime);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Stops recording. Idempotent.
  void stop();
  // The events recorded (stops first), on this worker's steady clock.
  const std::vector<TraceEvent>& events();
  // The Chrome trace JSON of events().
  std::string chrome_trace();
  // Writes chrome_trace() to `path`; throws Error(kBadArgument) naming it if it cannot.
  void write_chrome_trace(const std::string& path);

 private:
  std::shared_ptr<Tracer> tracer_;
  std::vector<std::string> workers_;  // names by rank
  bool running_ = true;
  std::vector<TraceEvent> events_;
};

}  // namespace drpc
