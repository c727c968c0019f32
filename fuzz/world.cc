#include "fuzz/world.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <glog/logging.h>
#include <google/protobuf/stubs/logging.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "fuzz/check.h"
#include "process_group/in_memory_process_group.h"
#include "process_group/transport.h"
#include "rpc/envelope.h"
#include "rpc/process_group_agent.h"

namespace drpc {
namespace fuzz {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};
// A type no worker handles: the agent queues it on the handler pool like any request and
// answers kBadArgument, so its reply means everything queued before it was served.
constexpr int32_t kProbeType = 999;

FuturePtr completed(c10::IValue value) {
  auto f = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  f->markCompleted(std::move(value));
  return f;
}

FuturePtr failed(const std::string& why) {
  auto f = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  f->setError(std::make_exception_ptr(Error(ErrorKind::kBadArgument, why)));
  return f;
}

// The workers' functions. A fuzzer cannot name builtin operators here: what it attacks
// is the protocol's handling of bytes, not what a job chooses to run.
FuturePtr run(const std::string& fn, std::vector<c10::IValue> args, const Kwargs&, const Extensions&) {
  if (fn == "fuzz.param") return completed(at::ones({2}).requires_grad_());
  if (fn == "fuzz.echo") return completed(c10::ivalue::Tuple::create(std::move(args)));
  return failed("no function " + fn);
}

FuturePtr apply(const c10::IValue& value, const std::string& fn, std::vector<c10::IValue> args, const Kwargs&,
                const Extensions&) {
  if (fn == "fuzz.mul" && value.isTensor() && args.size() == 1 && args[0].isTensor()) {
    try {
      return completed(at::mul(value.toTensor(), args[0].toTensor()));
    } catch (const std::exception& e) {
      return failed(e.what());
    }
  }
  if (fn == "fuzz.echo") {
    args.insert(args.begin(), value);
    return completed(c10::ivalue::Tuple::create(std::move(args)));
  }
  return failed("no method " + fn);
}

void wait_confirmed(const RRef& rref) {
  FuturePtr confirmed = rref.impl().confirmation();
  confirmed->wait();
}

}  // namespace

struct World::Arrivals {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int32_t, int> count;  // message type -> how many reached rank 0
};

World::World(Recorder recorder) : arrivals_(std::make_shared<Arrivals>()) {
  groups_ = create_in_memory_process_groups(3);
  std::vector<WorkerInfo> infos = {{"worker0", 0}, {"worker1", 1}, {"worker2", 2}};
  workers_.resize(3);
  for (int r = 0; r < 3; ++r) {
    AgentOptions options;
    // One handler thread on rank 0: a probe queued behind a request is served after it.
    options.num_threads = r == 0 ? 1 : 2;
    options.default_timeout = kTimeout;
    Worker& w = workers_[r];
    w.executor = create_thread_executor("[worker" + std::to_string(r) + "/" + std::to_string(r) + "]");
    w.agent = create_process_group_agent(*groups_[r].messages, *w.executor, infos, options);
    if (r == 0) {
      auto arrivals = arrivals_;
      w.agent->add_interceptor(RpcAgent::Interceptor{
          nullptr, [arrivals, recorder](const WorkerInfo& from, Message& m) {
            if (recorder) recorder(from, m);
            std::lock_guard<std::mutex> lock(arrivals->mu);
            ++arrivals->count[m.type];
            // Child accepts usually ride on another message (rref/control_channel.h).
            if (m.extensions.count(kRRefCarriedControls) > 0) ++arrivals->count[kRRefChildAccept];
            arrivals->cv.notify_all();
          }});
    }
    w.rref = create_rref_context(*w.agent, *w.executor, run, apply);
    w.autograd = create_autograd_container(*w.agent, *w.executor);
  }
  for (auto& w : workers_) w.agent->start();
}

World::~World() {
  for (auto& w : workers_) w.agent->shutdown(false);
  for (auto& w : workers_) w.rref->shutdown();
  for (auto& g : groups_) g.group->shutdown();
  param_ = RRef();
  loss_ = at::Tensor();
  workers_.clear();  // each Worker's context goes before the agent it registered with
  groups_.clear();
}

void World::build_state() {
  const WorkerInfo w0 = agent(1).worker(0);
  param_ = rref(1).remote(w0, "fuzz.param", {}, {}, kTimeout);
  wait_confirmed(param_);
  param_.to_here(kTimeout);

  AutogradContainer& grad = autograd(1);
  context_ = grad.new_context();
  grad.set_current_context(context_);
  at::Tensor x = at::full({2}, 3.0).requires_grad_();
  c10::IValue y = param_.rpc_sync("fuzz.mul", {x}, {}, kTimeout);
  grad.set_current_context(-1);
  loss_ = y.toTensor().sum();
}

void World::exercise() {
  const WorkerInfo w0 = agent(1).worker(0), w1 = agent(0).worker(1), w2 = agent(1).worker(2);
  // Rank 1 shares the parameter with rank 2, which asks the owner to record its fork.
  RRef held_by_2 = rref(1).remote(w2, "fuzz.echo", {param_.to_ivalue()}, {}, kTimeout);
  wait_for_recorded(kRRefForkRequest);
  // Rank 0 shares its reference to rank 1's value with rank 2; once rank 1 records
  // rank 2's fork, rank 0 hears that its child was accepted (alone, or riding on another
  // message from rank 1).
  RRef of_1 = rref(0).remote(w1, "fuzz.param", {}, {}, kTimeout);
  RRef shared = rref(0).remote(w2, "fuzz.echo", {of_1.to_ivalue()}, {}, kTimeout);
  wait_for_recorded(kRRefChildAccept);
  // Calls on the parameter with values of every kind, nested.
  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("w", at::arange(6, at::kInt).reshape({2, 3}));
  c10::impl::GenericList mixed(c10::AnyType::get());
  mixed.push_back(int64_t{7});
  mixed.push_back(c10::List<double>({0.5, -1.0}));
  mixed.push_back(c10::IValue());
  param_.rpc_sync("fuzz.echo",
                  {at::tensor({1.5, -2.0}, at::kDouble), c10::List<int64_t>({1, 2, 3}), dict, std::string("text"),
                   c10::complex<double>(1, -2), true, mixed},
                  {{"scale", 2.0}}, kTimeout);
  // A remote call whose arguments hold the parameter itself (an RRef shared back to its
  // owner) and tensors of other dtypes and shapes.
  RRef echoed = rref(1).remote(
      w0, "fuzz.echo",
      {param_.to_ivalue(),
       c10::ivalue::Tuple::create({at::ones({2, 2}, at::kHalf), at::zeros({3}, at::kBool), at::empty({0, 4}),
                                   at::arange(4, at::kLong), at::tensor(7.0)})},
      {}, kTimeout);
  echoed.to_here(kTimeout);
  // The distributed backward reaches rank 0's half of the graph; then the context goes.
  autograd(1).backward(context_, {loss_}, false);
  autograd(1).release(context_);
  wait_for_recorded(kAutogradRelease);
  // The last of rank 1's references to the parameter goes: the owner hears of it.
  param_ = RRef();
  echoed = RRef();
  held_by_2 = RRef();
  wait_for_recorded(kRRefUserDelete);
}

void World::wait_for_recorded(int32_t type) {
  std::unique_lock<std::mutex> lock(arrivals_->mu);
  if (!arrivals_->cv.wait_for(lock, kTimeout, [&] { return arrivals_->count[type] > 0; })) {
    throw Error(ErrorKind::kTimeout, "no message of type " + std::to_string(type) + " reached worker0");
  }
}

void World::inject(const PgMessage& message) {
  groups_[1].messages->send_message(0, message)->wait(kTimeout);
  RpcAgent& peer = agent(1);
  FuturePtr probe = peer.send(peer.worker(0), Message{kProbeType, "", {}}, kTimeout, "fuzz probe");
  probe->wait();
  FUZZ_CHECK(probe->hasError(), "worker0 handled the probe type");
  try {
    std::rethrow_exception(probe->exception_ptr());
  } catch (const Error& e) {
    FUZZ_CHECK(e.kind() == ErrorKind::kBadArgument, "worker0 did not serve the probe: " + std::string(e.what()));
  }
}

void run_message_input(const uint8_t* data, size_t size, const std::function<bool(const rpc::Envelope&)>& wanted) {
  std::vector<Frame> frames;
  try {
    frames = decode_wire_frames({ByteSpan{data, size}}, nullptr, 1);
  } catch (const Error& e) {
    FUZZ_CHECK(e.kind() == ErrorKind::kProtocol, e.what());
    return;
  }
  std::vector<PgMessage> messages;
  for (const Frame& frame : frames) {
    if (frame.header.kind() != pg::FrameHeader::MESSAGE) continue;
    rpc::Envelope envelope;
    // A header that is not an envelope is dropped by the agent at once; building a job
    // to watch that would only slow the fuzzer down.
    std::string problem;
    if (!decode_envelope(frame.header.payload(), &envelope, &problem) || !wanted(envelope)) continue;
    PgMessage message{frame.header.payload(), {}};
    size_t offset = 0;
    for (const auto& meta : frame.tensors) {
      message.tensors.push_back(tensor_from_body(frame, meta, offset));
      offset += meta.nbytes;
    }
    messages.push_back(std::move(message));
  }
  if (messages.empty()) return;
  World world;
  world.build_state();
  for (const auto& message : messages) world.inject(message);
}

void quiet_logs() {
  FLAGS_minloglevel = 3;  // FATAL only: malformed input is logged on every run otherwise
  google::protobuf::SetLogHandler(nullptr);
}

}  // namespace fuzz
}  // namespace drpc
