#pragma once

#include <memory>

#include "dist_autograd/dist_autograd.h"
#include "rpc/function_registry.h"

namespace drpc {

// What a DistributedOptimizer asks of the owner of some parameters: an optimizer over
// them (SGD with momentum, Adam; torch::optim does the math), stepped with the
// gradients of a distributed autograd context.
struct OptimizerSpec {
  std::string kind = "sgd";  // "sgd" | "adam"
  double lr = 0.01;
  double momentum = 0;       // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
  double weight_decay = 0;
};

// One worker's side of distributed optimizers. Registers "drpc.optim.create"
// (spec fields, list of RRefs this worker owns) -> optimizer id, and "drpc.optim.step"
// (optimizer id, context id) into `functions`. Concurrent steps of one optimizer are
// serialized. `autograd` and `functions` must outlive it.
class OptimizerHost {
 public:
  virtual ~OptimizerHost() = default;
};

std::unique_ptr<OptimizerHost> create_optimizer_host(AutogradContainer& autograd, FunctionRegistry& functions);

}  // namespace drpc
