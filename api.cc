// The torch.distributed.rpc-style API: free functions over the process's default runtime
// (init_rpc ... shutdown), or over the runtime serving the call on this thread; the
// distributed autograd context guard, the DistributedOptimizer and the profiler.

#include <glog/logging.h>

#include <condition_variable>
#include <fstream>
#include <mutex>

#include "common/logging.h"
#include "drpc.h"
#include "process_group/security.h"
#include "runtime_scope.h"

namespace drpc {
namespace {

std::mutex& default_mu() {
  static std::mutex mu;
  return mu;
}
std::unique_ptr<Runtime>& default_runtime() {
  static std::unique_ptr<Runtime> runtime;
  return runtime;
}

}  // namespace

Runtime& current_runtime() {
  if (runtime_internal::serving_runtime) return *runtime_internal::serving_runtime;
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
  // This process's worker, for lines of threads not its own: set first, since the network's
  // threads log while the worker joins (which link each peer takes, who is late).
  set_process_log_tag(name, rank);
  auto runtime = Runtime::create(name, rank, world_size, options);
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
      // Only the last completion or the first error ends the wait: waking the waiter for
      // each of a thousand replies cost a context switch per call.
      if (state->left == 0 || done.hasError()) state->cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->left == 0 || state->error; });
    if (state->error) std::rethrow_exception(state->error);
  }
  std::vector<c10::IValue> values;
  values.reserve(futures.size());  // growing it made glibc consolidate its free lists each time
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
    (void)runtime_.autograd().release(id_);  // the other workers are told; not waited for
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
