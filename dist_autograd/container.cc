#include <ATen/ops/ones_like.h>
#include <glog/logging.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "dist_autograd/dist_autograd.h"
#include "dist_autograd/proto/autograd.pb.h"

namespace drpc {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Each thread's current context, per container: several runtimes (each with its own
// container) may live in one process, and a thread may work for more than one of them.
thread_local std::unordered_map<uint64_t, int64_t> tls_contexts;
std::atomic<uint64_t> next_container_serial{1};

// On the sender: its next edges lead to the tensors that were sent.
struct SendRpcBackward : Node {
  variable_list apply(variable_list&& grads) override { return std::move(grads); }
  std::string name() const override { return "SendRpcBackward"; }
};

// On the receiver: the gradients that reach it belong to the sender. It is never run:
// backward captures its inputs and sends them.
struct RecvRpcBackward : Node {
  RecvRpcBackward(int64_t message, int from) : message_id(message), from_worker(from) {}
  variable_list apply(variable_list&&) override { return {}; }
  std::string name() const override { return "RecvRpcBackward"; }
  const int64_t message_id;
  const int from_worker;
};

struct Context {
  std::atomic<int64_t> last_used_ns{0};  // the executor's clock; for reclaiming orphans
  std::mutex mu;
  std::map<int64_t, std::shared_ptr<SendRpcBackward>> sends;
  std::map<int64_t, std::shared_ptr<RecvRpcBackward>> recvs;
  std::unordered_map<c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> grads;  // leaf -> (leaf, grad)
  std::set<int> workers;  // every worker this context exchanged messages with
};

class Container final : public AutogradContainer, public std::enable_shared_from_this<Container> {
 public:
  Container(RpcAgent& agent, Executor& executor, std::chrono::milliseconds orphan_ttl)
      : agent_(agent), executor_(executor), orphan_ttl_(orphan_ttl) {}

  ~Container() override {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    executor_.cancel(reap_timer_);
    tls_contexts.erase(serial_);
  }

  void install() {
    auto self = shared_from_this();
    agent_.add_interceptor(RpcAgent::Interceptor{
        [self](const WorkerInfo& to, Message& m) { self->on_send(to, m); },
        [self](const WorkerInfo& from, Message& m) { self->on_receive(from, m); }});
    agent_.register_handler(kAutogradBackward,
                            [self](const WorkerInfo& from, Message m) { return self->on_backward(from, std::move(m)); });
    agent_.register_handler(
        kAutogradRelease, [self](const WorkerInfo& from, Message m) { return self->on_release(from, std::move(m)); },
        RpcAgent::always_inline());
    std::weak_ptr<Container> weak = self;
    agent_.add_peer_failure_listener([weak](const WorkerInfo& peer, const Error&) {
      if (auto container = weak.lock()) container->reclaim_contexts_of(peer);
    });
    std::lock_guard<std::mutex> lock(mu_);
    schedule_reap_locked();
  }

  int64_t new_context() override {
    const int64_t id = (static_cast<int64_t>(agent_.self().id) << 48) | next_context_.fetch_add(1);
    get_or_create(id);
    return id;
  }

  FuturePtr release(int64_t context_id) override { return release_from(context_id, agent_.self().id); }

  bool has_context(int64_t context_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    return contexts_.count(context_id) > 0;
  }

  int64_t num_contexts() override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(contexts_.size());
  }

  int64_t context_of(const Extensions& extensions) override {
    const auto record = record_of(extensions);
    return record ? record->context() : -1;
  }

  int64_t current_context() override { return thread_context(); }
  void set_current_context(int64_t context_id) override {
    if (context_id < 0) {
      tls_contexts.erase(serial_);
    } else {
      tls_contexts[serial_] = context_id;
    }
  }

  void backward(int64_t context_id, const std::vector<at::Tensor>& roots, bool retain_graph) override {
    (void)retain_graph;  // the graph is always kept: other workers' passes may revisit it
    auto context = find(context_id);
    if (!context) throw Error(ErrorKind::kBadArgument, "unknown autograd context " + std::to_string(context_id));
    if (roots.empty()) throw Error(ErrorKind::kBadArgument, "backward was given no roots");
    torch::autograd::edge_list edges;
    variable_list inputs;
    for (const auto& root : roots) {
      if (root.numel() != 1) {
        throw Error(ErrorKind::kBadArgument, "backward roots must be scalars, got a tensor of " +
                                                 std::to_string(root.numel()) + " elements");
      }
      if (!root.requires_grad()) throw Error(ErrorKind::kBadArgument, "a backward root does not require grad");
      // A leaf root has no graph behind it: nothing would be computed, and the caller
      // most likely passed an input where it meant the loss.
      if (!root.grad_fn()) {
        throw Error(ErrorKind::kBadArgument, "a backward root is a leaf tensor, with no gradient function");
      }
      edges.push_back(torch::autograd::impl::gradient_edge(root));
      inputs.push_back(at::ones_like(root));
    }
    FuturePtr done = run(context_id, *context, edges, inputs);
    done->wait();
    if (done->hasError()) std::rethrow_exception(done->exception_ptr());
  }

  c10::Dict<at::Tensor, at::Tensor> gradients(int64_t context_id) override {
    auto context = find(context_id);
    if (!context) throw Error(ErrorKind::kBadArgument, "unknown autograd context " + std::to_string(context_id));
    c10::Dict<at::Tensor, at::Tensor> out;
    std::lock_guard<std::mutex> lock(context->mu);
    for (const auto& [impl, leaf_grad] : context->grads) out.insert(leaf_grad.first, leaf_grad.second);
    return out;
  }

 private:
  // --- recording ---------------------------------------------------------------------
  // The message's autograd record, if it has one. Throws kProtocol when it is malformed
  // (a peer's bytes).
  static std::optional<autograd::MessageRecord> record_of(const Extensions& extensions) {
    auto it = extensions.find(kAutogradExtension);
    if (it == extensions.end()) return std::nullopt;
    autograd::MessageRecord record;
    if (!record.ParseFromString(it->second)) {
      throw Error(ErrorKind::kProtocol, "malformed distributed autograd header");
    }
    return record;
  }

  static void put_record(int64_t context_id, int64_t message_id, const std::vector<bool>& requires_grad, Message& m) {
    autograd::MessageRecord record;
    record.set_context(context_id);
    record.set_message(message_id);
    for (bool r : requires_grad) record.add_requires_grad(r);
    m.extensions[kAutogradExtension] = record.SerializeAsString();
  }

  void on_send(const WorkerInfo& to, Message& m) {
    // A reply carries its request's record (the agent copies it): its context, unless the
    // handler's thread is in one of its own.
    const auto carried = record_of(m.extensions);
    m.extensions.erase(kAutogradExtension);
    // A release sent from inside the context it releases must not bring it back to life.
    if (m.type == kAutogradRelease) return;
    const int64_t context_id = carried ? carried->context() : thread_context();
    if (context_id < 0) return;
    bool any = false;
    for (const auto& t : m.tensors) any = any || (t.defined() && t.requires_grad());
    auto context = get_or_create(context_id);
    if (!any) {
      // The context travels anyway: what the callee returns may depend on its own
      // parameters, and its reply must then be recorded in this context.
      {
        std::lock_guard<std::mutex> lock(context->mu);
        context->workers.insert(to.id);
      }
      put_record(context_id, -1, {}, m);
      return;
    }
    auto send = std::make_shared<SendRpcBackward>();
    std::vector<bool> requires_grad(m.tensors.size(), false);
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      if (!m.tensors[i].defined() || !m.tensors[i].requires_grad()) continue;
      send->add_next_edge(torch::autograd::impl::gradient_edge(m.tensors[i]));
      requires_grad[i] = true;
      m.tensors[i] = m.tensors[i].detach();
    }
    const int64_t message_id = (static_cast<int64_t>(agent_.self().id) << 48) | next_message_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(context->mu);
      context->sends[message_id] = send;
      context->workers.insert(to.id);
    }
    put_record(context_id, message_id, requires_grad, m);
  }

  void on_receive(const WorkerInfo& from, Message& m) {
    const auto record = record_of(m.extensions);
    if (!record || record->context() < 0 || m.type == kAutogradRelease) return;
    auto context = get_or_create(record->context());
    if (record->message() < 0) {  // the context only, no tensors requiring grad
      std::lock_guard<std::mutex> lock(context->mu);
      context->workers.insert(from.id);
      return;
    }
    auto recv = std::make_shared<RecvRpcBackward>(record->message(), from.id);
    for (int i = 0; i < record->requires_grad_size() && i < static_cast<int>(m.tensors.size()); ++i) {
      if (!record->requires_grad(i)) continue;
      at::Tensor t = m.tensors[i];
      const uint32_t input = recv->add_input_metadata(t);
      torch::autograd::impl::set_gradient_edge(t, Edge(recv, input));
    }
    std::lock_guard<std::mutex> lock(context->mu);
    context->recvs[record->message()] = recv;
    context->workers.insert(from.id);
  }

  // --- backward ------------------------------------------------------------------------
  // Runs the local engine from `roots`; gradients reaching leaves accumulate in the
  // context, those reaching recv functions go to their senders. Returns a future of the
  // reply to send upstream, completed once every sender has answered: nothing blocks a
  // handler thread while the rest of the chain works (several concurrent backward
  // passes would otherwise hold every thread of every worker waiting on one another).
  FuturePtr run(int64_t context_id, Context& context, const torch::autograd::edge_list& roots,
                const variable_list& inputs) {
    torch::autograd::edge_list outputs, recv_edges;
    std::vector<at::Tensor> leaves;
    std::vector<std::pair<RecvRpcBackward*, uint32_t>> recv_inputs;
    std::unordered_set<Node*> seen;
    std::vector<std::shared_ptr<Node>> stack;
    for (const auto& e : roots) {
      if (e.function) stack.push_back(e.function);
    }
    while (!stack.empty()) {
      std::shared_ptr<Node> node = stack.back();
      stack.pop_back();
      if (!seen.insert(node.get()).second) continue;
      if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())) {
        outputs.emplace_back(node, 0);
        leaves.push_back(acc->variable);
        continue;
      }
      if (auto* recv = dynamic_cast<RecvRpcBackward*>(node.get())) {
        for (uint32_t i = 0; i < recv->num_inputs(); ++i) {
          recv_edges.emplace_back(node, i);
          recv_inputs.emplace_back(recv, i);
        }
        continue;
      }
      for (const auto& next : node->next_edges()) {
        if (next.function) stack.push_back(next.function);
      }
    }
    // Leaves first, then recv inputs: the engine returns gradients in this order.
    outputs.insert(outputs.end(), recv_edges.begin(), recv_edges.end());
    if (outputs.empty()) return answered({});
    variable_list grads;
    try {
      grads = torch::autograd::Engine::get_default_engine().execute(roots, inputs, /*keep_graph=*/true,
                                                                    /*create_graph=*/false,
                                                                    /*accumulate_grad=*/false, outputs);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorKind::kRemote, "backward on " + agent_.self().name + " failed: " + e.what());
    }
    {
      std::lock_guard<std::mutex> lock(context.mu);
      for (size_t i = 0; i < leaves.size(); ++i) {
        if (!grads[i].defined()) continue;
        auto& slot = context.grads[leaves[i].unsafeGetTensorImpl()];
        if (!slot.first.defined()) {
          slot = {leaves[i], grads[i].clone()};
        } else {
          slot.second.add_(grads[i]);
        }
      }
    }
    // One gradient message per recv function, to the worker that sent its tensors.
    std::map<RecvRpcBackward*, std::vector<at::Tensor>> per_recv;
    for (size_t k = 0; k < recv_inputs.size(); ++k) {
      auto [recv, input] = recv_inputs[k];
      at::Tensor g = grads[leaves.size() + k];
      if (!g.defined()) {
        g = recv->input_metadata(input).zeros_like();
      }
      auto& list = per_recv[recv];
      list.resize(recv->num_inputs());
      list[input] = g;
    }
    std::vector<FuturePtr> pending;
    for (auto& [recv, list] : per_recv) {
      autograd::Backward request;
      request.set_context(context_id);
      request.set_message(recv->message_id);
      const WorkerInfo to = agent_.worker(recv->from_worker);
      pending.push_back(agent_.send(to, Message{kAutogradBackward, request.SerializeAsString(), list},
                                    agent_.default_timeout(), "distributed backward"));
    }
    return answered(pending);
  }

  // A future of the (empty) backward reply, completed when all of `pending` are, with the
  // first error among them if any failed.
  static FuturePtr answered(const std::vector<FuturePtr>& pending) {
    auto done = make_message_future();
    auto left = std::make_shared<std::atomic<size_t>>(pending.size() + 1);
    auto one_done = [done, left](c10::ivalue::Future& f) {
      if (f.hasError()) done->setErrorIfNeeded(f.exception_ptr());
      if (left->fetch_sub(1) == 1 && !done->completed()) {
        done->markCompleted(message_to_ivalue(Message{kAutogradBackward, "", {}}));
      }
    };
    for (const auto& f : pending) f->addCallback(one_done);
    one_done(*done);  // the +1: counts once every callback is attached
    return done;
  }

  FuturePtr on_backward(const WorkerInfo&, Message m) {
    autograd::Backward request;
    if (!request.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed backward message");
    auto context = find(request.context());
    if (!context) {
      throw Error(ErrorKind::kBadArgument, "unknown autograd context " + std::to_string(request.context()) + " on " +
                                               agent_.self().name);
    }
    touch(*context);
    std::shared_ptr<SendRpcBackward> send;
    {
      std::lock_guard<std::mutex> lock(context->mu);
      auto it = context->sends.find(request.message());
      if (it == context->sends.end()) throw Error(ErrorKind::kProtocol, "unknown send function");
      send = it->second;
    }
    if (m.tensors.size() != send->next_edges().size()) {
      throw Error(ErrorKind::kProtocol, "gradient count does not match the send function");
    }
    variable_list inputs(m.tensors.begin(), m.tensors.end());
    return run(request.context(), *context, send->next_edges(), inputs);
  }

  // Runs on the network thread (it never blocks); its reply waits for the workers this one
  // passed the release on to, so the creator's future covers the whole graph.
  FuturePtr on_release(const WorkerInfo& from, Message m) {
    autograd::Backward request;
    if (!request.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, "malformed release message");
    return release_from(request.context(), from.id);
  }

  // Forgets the context here, then tells every worker it touched except `from`, without
  // waiting. The future (a Message) completes once they all have; a worker that cannot be
  // told (it is gone, or the job is shutting down) holds nothing to release, or reclaims it.
  FuturePtr release_from(int64_t context_id, int from) {
    auto done = make_message_future();
    std::shared_ptr<Context> context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = contexts_.find(context_id);
      if (it != contexts_.end()) {
        context = it->second;
        contexts_.erase(it);
      }
    }
    std::set<int> workers;
    if (context) {
      std::lock_guard<std::mutex> lock(context->mu);
      workers = context->workers;
    }
    workers.erase(from);
    workers.erase(agent_.self().id);
    // Dropped here, on the releasing thread, and not in a reply's callback.
    context.reset();
    autograd::Backward request;
    request.set_context(context_id);
    const std::string payload = request.SerializeAsString();
    // A count per worker told and one for this function, so that `done` completes once,
    // after the last of them, whether there are workers to tell or none.
    auto left = std::make_shared<std::atomic<size_t>>(workers.size() + 1);
    auto one_done = [done, left] {
      if (left->fetch_sub(1) == 1) done->markCompleted(message_to_ivalue(Message{kAutogradRelease, "", {}}));
    };
    const std::string name = agent_.self().name;
    for (int w : workers) {
      FuturePtr sent;
      try {
        sent = agent_.send(agent_.worker(w), Message{kAutogradRelease, payload, {}}, agent_.default_timeout(),
                           "release of autograd context");
      } catch (const std::exception& e) {  // the others are still told
        VLOG(1) << name << ": releasing autograd context " << context_id << ": " << e.what();
        one_done();
        continue;
      }
      sent->addCallback([one_done, name, context_id](c10::ivalue::Future& f) {
        if (f.hasError()) VLOG(1) << name << ": releasing autograd context " << context_id << ": " << f.tryRetrieveErrorMessage();
        one_done();
      });
    }
    one_done();
    return done;
  }

  std::shared_ptr<Context> find(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second;
  }

  std::shared_ptr<Context> get_or_create(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = contexts_[id];
    if (!slot) slot = std::make_shared<Context>();
    touch(*slot);
    return slot;
  }

  int64_t thread_context() const {
    auto it = tls_contexts.find(serial_);
    return it == tls_contexts.end() ? -1 : it->second;
  }

  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(executor_.now().time_since_epoch()).count();
  }

  void touch(Context& context) const { context.last_used_ns = now_ns(); }

  // Contexts `creator` made can never be released by it now: drop them here at once
  // (a backward still running in one keeps it alive until it ends).
  void reclaim_contexts_of(const WorkerInfo& creator) {
    std::vector<std::shared_ptr<Context>> dropped;  // freed outside the lock
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = contexts_.begin(); it != contexts_.end();) {
        if ((it->first >> 48) == creator.id) {
          dropped.push_back(std::move(it->second));
          it = contexts_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (!dropped.empty()) {
      LOG(WARNING) << agent_.self().name << ": " << creator.name << " is gone: reclaimed the " << dropped.size()
                   << " autograd contexts it created";
    }
  }

  // Contexts created elsewhere and unused for orphan_ttl_ are dropped: a safety net for
  // creators that vanish without this worker noticing. Checked every quarter TTL.
  void schedule_reap_locked() {
    if (stopping_) return;
    std::weak_ptr<Container> weak = shared_from_this();
    reap_timer_ = executor_.run_after(std::max(orphan_ttl_ / 4, std::chrono::milliseconds(1)), [weak] {
      if (auto container = weak.lock()) container->reap_orphans();
    });
  }

  void reap_orphans() {
    std::vector<std::shared_ptr<Context>> dropped;  // freed outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = now_ns();
    const int64_t ttl = std::chrono::duration_cast<std::chrono::nanoseconds>(orphan_ttl_).count();
    for (auto it = contexts_.begin(); it != contexts_.end();) {
      const bool foreign = (it->first >> 48) != agent_.self().id;
      if (foreign && now - it->second->last_used_ns.load() > ttl) {
        LOG(WARNING) << agent_.self().name << ": reclaimed autograd context " << it->first << " (unused for "
                     << orphan_ttl_.count() << " ms)";
        dropped.push_back(std::move(it->second));
        it = contexts_.erase(it);
      } else {
        ++it;
      }
    }
    schedule_reap_locked();
  }

  RpcAgent& agent_;
  Executor& executor_;
  const std::chrono::milliseconds orphan_ttl_;
  const uint64_t serial_ = next_container_serial.fetch_add(1);
  std::atomic<int64_t> next_context_{0};
  std::atomic<int64_t> next_message_{0};
  std::mutex mu_;
  // Guarded by mu_.
  std::map<int64_t, std::shared_ptr<Context>> contexts_;
  Executor::TimerId reap_timer_ = 0;
  bool stopping_ = false;
};

}  // namespace

std::shared_ptr<AutogradContainer> create_autograd_container(RpcAgent& agent, Executor& executor,
                                                             std::chrono::milliseconds orphan_ttl) {
  auto container = std::make_shared<Container>(agent, executor, orphan_ttl);
  container->install();
  return container;
}

}  // namespace drpc
