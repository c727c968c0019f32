// The composition root: one worker's layers built, wired and shut down in order (the
// process-wide API over the current runtime is api.cc; its calls are call_service.cc).

#include "drpc.h"

#include <glog/logging.h>

#include <map>
#include <mutex>
#include <optional>

#include "call_service.h"
#include "common/executor.h"
#include "common/logging.h"

#include "process_group/grpc_process_group.h"
#include "process_group/grpc_store.h"
#include "process_group/prefix_store.h"
#include "process_group/security.h"
#include "rpc/process_group_agent.h"
#include "dist_autograd/dist_autograd.h"
#include "rref/rref_context.h"

namespace drpc {
namespace {

std::mutex& backends_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, BackendFactory>& backends() {
  static std::map<std::string, BackendFactory> registry = {
      {"process_group", [](MessagePort& port, Executor& executor, std::vector<WorkerInfo> workers,
                           const Options& options) {
         AgentOptions agent;
         agent.num_threads = options.num_worker_threads;
         agent.default_timeout = options.rpc_timeout;
         return create_process_group_agent(port, executor, std::move(workers), agent);
       }}};
  return registry;
}

SecurityOptions security_options(const Options& options) {
  SecurityOptions security;
  security.token = options.token;
  security.tls_cert_file = options.tls_cert_file;
  security.tls_key_file = options.tls_key_file;
  security.tls_ca_file = options.tls_ca_file;
  security.tls_server_name = options.tls_server_name;
  security.tls();  // all TLS files or none
  return security;
}

void check_name(const std::string& name) {
  if (name.empty() || name.size() >= 128) {
    throw Error(ErrorKind::kBadArgument, "worker name '" + name + "' must have 1 to 127 characters");
  }
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '-')) {
      throw Error(ErrorKind::kBadArgument, "worker name '" + name + "' may only contain [A-Za-z0-9_:-]");
    }
  }
}

class RuntimeImpl final : public Runtime {
 public:
  RuntimeImpl(const std::string& name, int rank, int world_size, const Options& options) : options_(options) {
    check_name(name);
    if (world_size <= 0 || rank < 0 || rank >= world_size) {
      throw Error(ErrorKind::kBadArgument, "rank " + std::to_string(rank) + " is out of range for world size " +
                                               std::to_string(world_size));
    }
    const SecurityOptions security = security_options(options);
    Store* store = options.store;
    if (!store) {
      if (rank == 0 && options.host_store) {
        store_server_ = start_store_server(options.master_addr, options.master_port, security);
      }
      owned_store_ = connect_store(options.master_addr, options.master_port, options.init_timeout, security);
      store = owned_store_.get();
    }
    auto rpc_store = create_prefix_store("rpc", *store);
    // Names first: a clash is reported before any connection is made.
    rpc_store->set("name/" + std::to_string(rank), name);
    std::vector<WorkerInfo> workers;
    std::map<std::string, int> seen;
    std::optional<Error> clash;
    for (int r = 0; r < world_size; ++r) {
      const std::string other = rpc_store->get("name/" + std::to_string(r), options.init_timeout);
      if (seen.count(other)) {
        clash = Error(ErrorKind::kBadArgument, "worker name '" + other + "' is used by ranks " +
                                                   std::to_string(seen[other]) + " and " + std::to_string(r));
        break;
      }
      seen[other] = r;
      workers.push_back(WorkerInfo{other, r});
    }
    // Every rank sees the same names, hence the same clash; but a store hosted here goes
    // when this constructor throws, and a rank still reading would then see an unreachable
    // store instead. So each rank says it has read them (even without a clash: the host
    // cannot know in advance), and the host waits for that before it throws.
    try {
      rpc_store->set("names_read/" + std::to_string(rank), "1");
    } catch (const Error&) {
      if (!clash) throw;  // else the clash is the news; the store's trouble is incidental
    }
    if (clash) {
      if (store_server_) {
        std::vector<std::string> keys;
        for (int r = 0; r < world_size; ++r) keys.push_back("names_read/" + std::to_string(r));
        try {
          rpc_store->wait(keys, options.init_timeout);
        } catch (const Error& e) {
          LOG(WARNING) << "rank " << rank << " stops hosting the store before every rank has read the names: "
                       << e.what();
        }
      }
      throw *clash;
    }
    user_store_ = create_prefix_store("user", *store);
    auto pg_store = create_prefix_store("pg", *store);
    const ProcessGroupFactory make_group = options.process_group ? options.process_group : grpc_process_group_factory();
    GroupEndpoints endpoints = make_group(*pg_store, rank, world_size, options);
    group_ = std::move(endpoints.group);
    messages_ = std::move(endpoints.messages);
    if (!group_ || !messages_ || group_->rank() != rank || group_->size() != world_size ||
        messages_->rank() != rank || messages_->size() != world_size) {
      throw Error(ErrorKind::kBadArgument, "the process group factory made no group and message port of rank " +
                                               std::to_string(rank) + " in a world of " + std::to_string(world_size));
    }
    for (const auto& [script, path] : options.scripts) functions_.load_script(script, path);
    BackendFactory factory;
    {
      std::lock_guard<std::mutex> lock(backends_mu());
      auto it = backends().find(options.backend);
      if (it == backends().end()) throw Error(ErrorKind::kBadArgument, "unknown RPC backend '" + options.backend + "'");
      factory = it->second;
    }
    log_tag_ = make_log_tag(name, rank);
    executor_ = create_thread_executor(log_tag_);
    agent_ = factory(*messages_, *executor_, workers, options);
    std::vector<std::string> names;
    for (const auto& w : workers) names.push_back(w.name);
    metrics_ = std::make_unique<Metrics>(name, rank, names);
    agent_->set_instruments(metrics_.get(), tracer_.get());
    rref_ = create_rref_context(
        *agent_, *executor_,
        [this](const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs, const Extensions& caller) {
          return calls_->run(fn, std::move(args), std::move(kwargs), caller);
        },
        [this](const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
               const Extensions& caller) {
          return calls_->apply(value, fn, std::move(args), std::move(kwargs), caller);
        });
    autograd_ = create_autograd_container(*agent_, *executor_, options.autograd_context_ttl);
    optimizers_ = create_optimizer_host(*autograd_, functions_);
    calls_ = std::make_unique<CallService>(*this, *agent_, *rref_, *autograd_, functions_, *tracer_);
    agent_->start();
  }

  ~RuntimeImpl() override { shutdown(false, std::chrono::milliseconds(0)); }

  WorkerInfo get_worker_info() const override { return agent_->self(); }
  WorkerInfo get_worker_info(const std::string& name) const override { return agent_->worker(name); }
  std::vector<WorkerInfo> get_worker_infos() const override { return agent_->workers(); }

  FuturePtr rpc_async(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                      std::chrono::milliseconds timeout) override {
    return calls_->rpc_async(to, fn, std::move(args), std::move(kwargs), timeout);
  }
  c10::IValue rpc_sync(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                       std::chrono::milliseconds timeout) override {
    return calls_->rpc_sync(to, fn, std::move(args), std::move(kwargs), timeout);
  }

  std::chrono::milliseconds rpc_timeout() const override { return agent_->default_timeout(); }
  void set_rpc_timeout(std::chrono::milliseconds timeout) override { agent_->set_default_timeout(timeout); }

  RRef remote(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
              std::chrono::milliseconds timeout) override {
    const WorkerInfo dst = agent_->worker(to);
    if (timeout == kDefaultTimeout) timeout = agent_->default_timeout();
    return rref_->remote(dst, fn, std::move(args), std::move(kwargs), timeout);
  }

  RRef make_local(c10::IValue value) override { return rref_->make_local(std::move(value)); }
  RRefCounts rref_counts() override { return rref_->counts(); }
  AutogradContainer& autograd() override { return *autograd_; }

  FunctionRegistry& functions() override { return functions_; }
  RpcAgent& agent() override { return *agent_; }
  ProcessGroup& process_group() override { return *group_; }
  Store& store() override { return *user_store_; }

  MetricsSnapshot metrics() override {
    MetricsSnapshot s = metrics_->snapshot();
    const RRefCounts c = rref_->counts();
    s.rref_owners = c.owners;
    s.rref_users = c.users;
    s.rref_pending_forks = c.pending_children + c.pending_users;
    s.autograd_contexts = autograd_->num_contexts();
    return s;
  }
  std::shared_ptr<Tracer> tracer() override { return tracer_; }

  void shutdown(bool graceful, std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    ScopedLogTag tag(&log_tag_);
    // The objects stay (until destruction) so later calls fail with kShutdown.
    if (graceful) {
      // As torch.distributed.rpc: first every worker reaches shutdown and the job goes
      // quiet (so no RRef is deleted while another worker may still use it, nor a value
      // this worker owns for others); then this worker's references are deleted, and once
      // the owners have processed every delete, whatever an owner still holds is a leak.
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      auto left = [&] {
        if (timeout.count() <= 0) return std::chrono::milliseconds(0);
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (ms.count() <= 0) throw Error(ErrorKind::kTimeout, "graceful shutdown took over " +
                                                                  std::to_string(timeout.count()) + " ms");
        return ms;
      };
      try {
        agent_->join(left());
        rref_->release_all(options_.rpc_timeout);
        agent_->join(left());
        for (const auto& leak : rref_->leaks()) LOG(WARNING) << agent_->self().name << ": leaked " << leak;
      } catch (const Error& e) {
        LOG(WARNING) << agent_->self().name << ": graceful shutdown stops waiting: " << e.what();
      }
    }
    agent_->shutdown(false);  // the job was joined above (or could not be)
    LOG(INFO) << summary_line(metrics());
    rref_->shutdown();
    executor_->close();
    group_->shutdown();
    if (store_server_) store_server_->shutdown();
  }

 private:
  const Options options_;
  std::unique_ptr<StoreServer> store_server_;
  std::unique_ptr<Store> owned_store_;
  std::unique_ptr<Store> user_store_;  // over the job's store (owned or borrowed)
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<MessagePort> messages_;  // the agent's channel, over group_'s transport
  FunctionRegistry functions_;
  // Before the agent, which records into them until it is destroyed.
  std::unique_ptr<Metrics> metrics_;
  std::shared_ptr<Tracer> tracer_ = std::make_shared<Tracer>();
  std::string log_tag_;
  // The worker's timers and deferred work; before the layers that use it.
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<RpcAgent> agent_;
  std::shared_ptr<RRefContext> rref_;  // destroyed before the agent it registered with
  std::shared_ptr<AutogradContainer> autograd_;
  std::unique_ptr<OptimizerHost> optimizers_;
  std::unique_ptr<CallService> calls_;  // serves calls through the layers above
  std::mutex shutdown_mu_;
  bool shut_down_ = false;  // guarded by shutdown_mu_
};

}  // namespace

ProcessGroupFactory grpc_process_group_factory() {
  return [](Store& store, int rank, int world_size, const Options& options) {
    GrpcProcessGroupOptions pg;
    pg.listen_host = options.listen_host;
    pg.advertise_host = options.advertise_host;
    if (pg.advertise_host.empty() && (pg.listen_host == "0.0.0.0" || pg.listen_host == "::")) {
      throw Error(ErrorKind::kBadArgument, "listening on " + pg.listen_host +
                                               " needs an address peers can dial (Options::advertise_host)");
    }
    pg.timeout = options.init_timeout;
    pg.security = security_options(options);
    pg.heartbeat_interval = options.heartbeat_interval;
    pg.heartbeat_misses = options.heartbeat_misses;
    pg.data_plane = options.data_plane;
    if (options.shm_arena_mb < 0) {
      throw Error(ErrorKind::kBadArgument, "shm_arena_mb must be 0 or more, got " + std::to_string(options.shm_arena_mb));
    }
    pg.shm_arena_bytes = options.shm_arena_mb << 20;
    return create_grpc_group_endpoints(store, rank, world_size, pg);
  };
}

void register_backend(const std::string& name, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(backends_mu());
  backends()[name] = std::move(factory);
}

std::unique_ptr<Runtime> Runtime::create(const std::string& name, int rank, int world_size, const Options& options) {
  return std::make_unique<RuntimeImpl>(name, rank, world_size, options);
}

}  // namespace drpc
