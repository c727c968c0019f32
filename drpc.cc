#include "drpc.h"

#include <glog/logging.h>

#include <condition_variable>
#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "common/executor.h"
#include "common/logging.h"

#include "process_group/grpc_process_group.h"
#include "process_group/grpc_store.h"
#include "process_group/prefix_store.h"
#include "process_group/security.h"
#include "rpc/call_codec.h"
#include "rpc/process_group_agent.h"
#include "rpc/value_codec.h"
#include "dist_autograd/dist_autograd.h"
#include "rref/rref_context.h"

#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/operator.h>

namespace drpc {
namespace {

thread_local Runtime* tls_runtime = nullptr;

std::mutex& default_mu() {
  static std::mutex mu;
  return mu;
}
std::unique_ptr<Runtime>& default_runtime() {
  static std::unique_ptr<Runtime> runtime;
  return runtime;
}

std::mutex& backends_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, BackendFactory>& backends() {
  static std::map<std::string, BackendFactory> registry = {
      {"process_group", [](ProcessGroup& group, Executor& executor, std::vector<WorkerInfo> workers,
                           const Options& options) {
         AgentOptions agent;
         agent.num_threads = options.num_worker_threads;
         agent.default_timeout = options.rpc_timeout;
         return create_process_group_agent(group, executor, std::move(workers), agent);
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

// Puts the thread in a caller's distributed autograd context (-1: none) while it serves
// the call, so that the calls the function makes are recorded in it.
class CurrentAutogradContext {
 public:
  CurrentAutogradContext(AutogradContainer& autograd, int64_t context)
      : autograd_(autograd), previous_(autograd.current_context()) {
    autograd_.set_current_context(context);
  }
  ~CurrentAutogradContext() { autograd_.set_current_context(previous_); }

 private:
  AutogradContainer& autograd_;
  int64_t previous_;
};

// Sets the thread's current runtime for the duration of a served call.
class CurrentRuntime {
 public:
  explicit CurrentRuntime(Runtime* runtime) : previous_(tls_runtime) { tls_runtime = runtime; }
  ~CurrentRuntime() { tls_runtime = previous_; }

 private:
  Runtime* previous_;
};

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
    group_ = make_group(*pg_store, rank, world_size, options);
    if (!group_ || group_->rank() != rank || group_->size() != world_size) {
      throw Error(ErrorKind::kBadArgument, "the process group factory made no group of rank " + std::to_string(rank) +
                                               " in a world of " + std::to_string(world_size));
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
    agent_ = factory(*group_, *executor_, workers, options);
    std::vector<std::string> names;
    for (const auto& w : workers) names.push_back(w.name);
    metrics_ = std::make_unique<Metrics>(name, rank, names);
    agent_->set_instruments(metrics_.get(), tracer_.get());
    rref_ = create_rref_context(
        *agent_, *executor_,
        [this](const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs, const Extensions& caller) {
          CurrentRuntime current(this);
          CurrentAutogradContext in_context(*autograd_, autograd_->context_of(caller));
          return functions_.call(fn, CallArgs{std::move(args), std::move(kwargs)}, agent_->self().name);
        },
        [this](const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
               const Extensions& caller) {
          CurrentRuntime current(this);
          CurrentAutogradContext in_context(*autograd_, autograd_->context_of(caller));
          return apply(value, fn, std::move(args), std::move(kwargs));
        });
    autograd_ = create_autograd_container(*agent_, *executor_, options.autograd_context_ttl);
    optimizers_ = create_optimizer_host(*autograd_, functions_);
    agent_->register_handler(kCallRequest,
                             [this](const WorkerInfo& from, Message request) { return serve_call(from, request); });
    agent_->start();
  }

  ~RuntimeImpl() override { shutdown(false, std::chrono::milliseconds(0)); }

  WorkerInfo get_worker_info() const override { return agent_->self(); }
  WorkerInfo get_worker_info(const std::string& name) const override { return agent_->worker(name); }
  std::vector<WorkerInfo> get_worker_infos() const override { return agent_->workers(); }

  FuturePtr rpc_async(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                      std::chrono::milliseconds timeout) override {
    ValueHooks hooks;
    FuturePtr reply = send_call(to, fn, args, kwargs, timeout, &hooks);
    // The reply completes on a network thread; the user's future, and whatever its
    // callbacks do, on a callback thread.
    return complete_on_callback_thread(*agent_, reply, [hooks](const c10::IValue& done) {
      return decode_result(message_from_ivalue(done), hooks);
    });
  }

  // Waits on the reply itself and decodes it here: no hop through a callback thread.
  c10::IValue rpc_sync(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                       std::chrono::milliseconds timeout) override {
    ValueHooks hooks;
    FuturePtr reply = send_call(to, fn, args, kwargs, timeout, &hooks);
    reply->wait();
    return decode_result(message_from_ivalue(reply->value()), hooks);  // value() rethrows the call's error
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
  // Encodes and sends a call; `hooks` receives the RRef hooks its reply decodes with.
  FuturePtr send_call(const std::string& to, const std::string& fn, const std::vector<c10::IValue>& args,
                      const Kwargs& kwargs, std::chrono::milliseconds timeout, ValueHooks* hooks) {
    const WorkerInfo dst = agent_->worker(to);
    if (timeout == kDefaultTimeout) timeout = agent_->default_timeout();
    *hooks = rref_->hooks(dst.id);
    rpc::Call call;
    Message request{kCallRequest, "", {}};
    encode_call(fn, args, kwargs, *hooks, &call, &request.tensors);
    request.payload = call.SerializeAsString();
    return agent_->send(dst, std::move(request), timeout, fn);
  }

  FuturePtr serve_call(const WorkerInfo& from, const Message& request) {
    CurrentRuntime current(this);
    rpc::Call call;
    if (!call.ParseFromString(request.payload)) throw Error(ErrorKind::kProtocol, "malformed call");
    ValueHooks hooks = rref_->hooks(from.id);
    CallArgs args;
    decode_call(call, request.tensors, hooks, &args.args, &args.kwargs);
    std::vector<c10::IValue> all = args.args;
    for (const auto& kw : args.kwargs) all.push_back(kw.second);
    const std::string fn = call.function();
    const int64_t autograd_context = autograd_->context_of(request.extensions);
    // The function runs once the owners have confirmed every RRef among its arguments.
    auto result = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    // A profiled request's trace follows the function if it runs on another thread.
    auto profiled = tracer_->serving();
    when_done_on_pool(*agent_, rref_->confirmations(all),
                      [this, fn, args, result, autograd_context, profiled]() mutable {
      CurrentRuntime current(this);
      Tracer::Scope scope(tracer_.get(), profiled);
      // Calls the function makes belong to the caller's autograd context.
      const int64_t previous = autograd_->current_context();
      autograd_->set_current_context(autograd_context);
      FuturePtr out = functions_.call(fn, std::move(args), agent_->self().name);
      autograd_->set_current_context(previous);
      forward_future(out, result);
    });
    return result->then(
        [fn, hooks](c10::ivalue::Future& done) {
          return message_to_ivalue(encode_result(0, done.value(), fn + ": result", hooks));
        },
        c10::AnyType::get());
  }

  // `fn` on a value this worker owns: a method of the value (a TorchScript object's, or a
  // builtin operator's with the value as `self`, as Python's tensor methods), else a
  // registered function (or operator) named in full with the value as its first argument.
  FuturePtr apply(const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs) {
    // A plain name is a method; qualified names ("my.fn", "aten::add") name functions.
    const bool method = !fn.empty() && std::all_of(fn.begin(), fn.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    auto no_method = [&] {
      auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
      future->setError(std::make_exception_ptr(Error(
          ErrorKind::kBadArgument, "a value of type " + value.type()->str() + " on " + agent_->self().name +
                                       " has no method '" + fn + "'")));
      return future;
    };
    if (value.isObject()) {
      auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
      try {
        torch::jit::Module module(value.toObject());
        if (!module.find_method(fn)) return no_method();
        CallArgs call{std::move(args), std::move(kwargs)};
        future->markCompleted(FunctionRegistry::call_script(module, fn, call));
      } catch (const Error&) {
        future->setError(std::current_exception());
      } catch (const std::exception& e) {
        future->setError(std::make_exception_ptr(
            Error(ErrorKind::kRemote, fn + " raised on " + agent_->self().name + ": " + e.what())));
      }
      return future;
    }
    std::string resolved = fn;
    if (method) {
      resolved = "aten::" + fn;
      if (torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(resolved)).empty()) return no_method();
    }
    args.insert(args.begin(), value);
    return functions_.call(resolved, CallArgs{std::move(args), std::move(kwargs)}, agent_->self().name);
  }

  const Options options_;
  std::unique_ptr<StoreServer> store_server_;
  std::unique_ptr<Store> owned_store_;
  std::unique_ptr<Store> user_store_;  // over the job's store (owned or borrowed)
  std::unique_ptr<ProcessGroup> group_;
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
    return create_grpc_process_group(store, rank, world_size, pg);
  };
}

void register_backend(const std::string& name, BackendFactory factory) {
  std::lock_guard<std::mutex> lock(backends_mu());
  backends()[name] = std::move(factory);
}

std::unique_ptr<Runtime> Runtime::create(const std::string& name, int rank, int world_size, const Options& options) {
  return std::make_unique<RuntimeImpl>(name, rank, world_size, options);
}

Runtime& current_runtime() {
  if (tls_runtime) return *tls_runtime;
  std::lock_guard<std::mutex> lock(default_mu());
  if (!default_runtime()) throw Error(ErrorKind::kShutdown, "drpc is not initialized: call drpc::init_rpc first");
  return *default_runtime();
}

std::string read_token(const std::string& file) { return read_job_token(file, "DRPC_TOKEN"); }

void init_rpc(const std::string& name, int rank, int world_size, const Options& options) {
  {
    std::lock_guard<std::mutex> lock(default_mu());
    if (default_runtime()) throw Error(ErrorKind::kBadArgument, "init_rpc was already called in this process");
  }
  auto runtime = Runtime::create(name, rank, world_size, options);
  set_process_log_tag(name, rank);  // this process's worker, for lines of threads not its own
  std::lock_guard<std::mutex> lock(default_mu());
  default_runtime() = std::move(runtime);
}

WorkerInfo get_worker_info() { return current_runtime().get_worker_info(); }
WorkerInfo get_worker_info(const std::string& name) { return current_runtime().get_worker_info(name); }
std::vector<WorkerInfo> get_worker_infos() { return current_runtime().get_worker_infos(); }

FuturePtr rpc_async(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                    std::chrono::milliseconds timeout) {
  return current_runtime().rpc_async(to, fn, std::move(args), std::move(kwargs), timeout);
}

c10::IValue rpc_sync(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
                     std::chrono::milliseconds timeout) {
  return current_runtime().rpc_sync(to, fn, std::move(args), std::move(kwargs), timeout);
}

std::vector<c10::IValue> wait_all(const std::vector<FuturePtr>& futures) {
  // Completes when all have, or with the first error at once.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    size_t left;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  state->left = futures.size();
  for (const auto& f : futures) {
    f->addCallback([state](c10::ivalue::Future& done) {
      std::lock_guard<std::mutex> lock(state->mu);
      --state->left;
      if (done.hasError() && !state->error) state->error = done.exception_ptr();
      state->cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->left == 0 || state->error; });
    if (state->error) std::rethrow_exception(state->error);
  }
  std::vector<c10::IValue> values;
  for (const auto& f : futures) values.push_back(f->value());
  return values;
}

void set_rpc_timeout(std::chrono::milliseconds timeout) { current_runtime().set_rpc_timeout(timeout); }
std::chrono::milliseconds get_rpc_timeout() { return current_runtime().rpc_timeout(); }

ProcessGroup& process_group() { return current_runtime().process_group(); }

RRef remote(const std::string& to, const std::string& fn, std::vector<c10::IValue> args, Kwargs kwargs,
            std::chrono::milliseconds timeout) {
  return current_runtime().remote(to, fn, std::move(args), std::move(kwargs), timeout);
}

RRef RRef::make_local(c10::IValue value) { return current_runtime().make_local(std::move(value)); }

DistributedOptimizer::DistributedOptimizer(const OptimizerSpec& spec, const std::vector<RRef>& params)
    : DistributedOptimizer(current_runtime(), spec, params) {}

DistributedOptimizer::DistributedOptimizer(Runtime& runtime, const OptimizerSpec& spec, const std::vector<RRef>& params)
    : remote_(
          [&runtime](const std::string& to, const std::string& fn, std::vector<c10::IValue> args) {
            return runtime.rpc_async(to, fn, std::move(args));
          },
          spec, params) {}

DistributedOptimizer::~DistributedOptimizer() = default;

void DistributedOptimizer::step(int64_t context_id) { remote_.step(context_id); }

namespace dist_autograd {

Context::Context() : Context(current_runtime()) {}

Context::Context(Runtime& runtime) : runtime_(runtime) {
  previous_ = runtime_.autograd().current_context();
  // One context per thread at a time: calls would be recorded in the inner one only, and
  // the outer one's backward would silently miss them.
  if (previous_ >= 0) {
    throw Error(ErrorKind::kBadArgument, "this thread already has an autograd context (" + std::to_string(previous_) +
                                             "): create the new one on another thread, or after this one ends");
  }
  id_ = runtime_.autograd().new_context();
  runtime_.autograd().set_current_context(id_);
}

Context::~Context() {
  runtime_.autograd().set_current_context(previous_);
  try {
    runtime_.autograd().release(id_);
  } catch (const std::exception& e) {
    LOG(WARNING) << "releasing autograd context " << id_ << ": " << e.what();
  }
}

void backward(int64_t context_id, const std::vector<at::Tensor>& roots, bool retain_graph) {
  current_runtime().autograd().backward(context_id, roots, retain_graph);
}

c10::Dict<at::Tensor, at::Tensor> get_gradients(int64_t context_id) {
  return current_runtime().autograd().gradients(context_id);
}

}  // namespace dist_autograd

void shutdown(bool graceful, std::chrono::milliseconds timeout) {
  std::unique_ptr<Runtime> runtime;
  {
    std::lock_guard<std::mutex> lock(default_mu());
    runtime = std::move(default_runtime());
  }
  if (!runtime) return;
  runtime->shutdown(graceful, timeout);
  // Kept, stopped, for the rest of the process: objects made on it (a DistributedOptimizer,
  // an autograd Context, RRefs) may outlive shutdown and must find it there, failing
  // with kShutdown, not freed. Reachable from a static, so no leak checker reports it.
  static std::mutex retired_mu;
  static auto* retired = new std::vector<std::unique_ptr<Runtime>>();
  std::lock_guard<std::mutex> lock(retired_mu);
  retired->push_back(std::move(runtime));
}

// --- observability ---------------------------------------------------------------------

MetricsSnapshot get_metrics() { return current_runtime().metrics(); }

Profiler::Profiler() : Profiler(current_runtime()) {}

Profiler::Profiler(Runtime& runtime) : tracer_(runtime.tracer()) {
  for (const auto& w : runtime.get_worker_infos()) workers_.push_back(w.name);
  tracer_->start();
}

Profiler::~Profiler() { stop(); }

void Profiler::stop() {
  if (!running_) return;
  running_ = false;
  events_ = tracer_->stop();
}

const std::vector<TraceEvent>& Profiler::events() {
  stop();
  return events_;
}

std::string Profiler::chrome_trace() { return to_chrome_trace(events(), workers_); }

void Profiler::write_chrome_trace(const std::string& path) {
  const std::string trace = chrome_trace();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << trace;
  out.close();
  if (!out) throw Error(ErrorKind::kBadArgument, "cannot write the trace to '" + path + "'");
}

}  // namespace drpc
