#include "dist_autograd/optimizer_host.h"

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <map>
#include <mutex>

#include "rref/rref.h"

namespace drpc {
namespace {

struct HostedOptimizer {
  std::mutex mu;  // steps of one optimizer never overlap
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

class OptimizerHostImpl final : public OptimizerHost {
 public:
  OptimizerHostImpl(AutogradContainer& autograd, FunctionRegistry& functions) : autograd_(autograd) {
    functions.add(optimizer_protocol::kCreate, [this](CallArgs& call) { return create(call); });
    functions.add(optimizer_protocol::kStep, [this](CallArgs& call) { return step(call); });
    functions.add(optimizer_protocol::kRelease, [this](CallArgs& call) { return release(call); });
  }

 private:
  c10::IValue create(CallArgs& call) {
    if (call.args.size() != 2 || !call.args[1].isList()) {
      throw Error(ErrorKind::kBadArgument, std::string(optimizer_protocol::kCreate) + " takes a spec and a list of RRefs");
    }
    const OptimizerSpec spec = optimizer_protocol::decode_spec(call.args[0]);
    auto hosted = std::make_shared<HostedOptimizer>();
    for (const auto& r : call.args[1].toListRef()) {
      RRef rref = RRef::from_ivalue(r);
      hosted->params.push_back(rref.local_value().toTensor());  // kBadArgument unless owned here
    }
    if (spec.kind == "sgd") {
      hosted->optimizer = std::make_unique<torch::optim::SGD>(
          hosted->params,
          torch::optim::SGDOptions(spec.lr).momentum(spec.momentum).weight_decay(spec.weight_decay));
    } else if (spec.kind == "adam") {
      hosted->optimizer = std::make_unique<torch::optim::Adam>(
          hosted->params, torch::optim::AdamOptions(spec.lr)
                              .betas({spec.beta1, spec.beta2})
                              .eps(spec.eps)
                              .weight_decay(spec.weight_decay));
    } else {
      throw Error(ErrorKind::kBadArgument, "unknown optimizer '" + spec.kind + "' (sgd, adam)");
    }
    const int64_t id = next_id_.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu_);
    optimizers_[id] = hosted;
    return id;
  }

  c10::IValue step(CallArgs& call) {
    if (call.args.size() != 2) throw Error(ErrorKind::kBadArgument, "drpc.optim.step takes 2 arguments");
    std::shared_ptr<HostedOptimizer> hosted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = optimizers_.find(call.args[0].toInt());
      if (it == optimizers_.end()) throw Error(ErrorKind::kBadArgument, "unknown optimizer");
      hosted = it->second;
    }
    auto grads = autograd_.gradients(call.args[1].toInt());
    std::lock_guard<std::mutex> lock(hosted->mu);
    for (auto& p : hosted->params) {
      auto it = grads.find(p);
      p.mutable_grad() = it == grads.end() ? at::Tensor() : it->value();  // no gradient: no update
    }
    hosted->optimizer->step();
    for (auto& p : hosted->params) p.mutable_grad() = at::Tensor();
    return c10::IValue();
  }

  // Drops an optimizer (its state and its hold on the parameters); true if it existed.
  c10::IValue release(CallArgs& call) {
    if (call.args.size() != 1) throw Error(ErrorKind::kBadArgument, "drpc.optim.release takes 1 argument");
    std::lock_guard<std::mutex> lock(mu_);
    return optimizers_.erase(call.args[0].toInt()) > 0;
  }

  AutogradContainer& autograd_;
  std::atomic<int64_t> next_id_{0};
  std::mutex mu_;
  std::map<int64_t, std::shared_ptr<HostedOptimizer>> optimizers_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<OptimizerHost> create_optimizer_host(AutogradContainer& autograd, FunctionRegistry& functions) {
  return std::make_unique<OptimizerHostImpl>(autograd, functions);
}

}  // namespace drpc
