#pragma once

#include <memory>

#include "dist_autograd/dist_autograd.h"
#include "dist_autograd/optimizer_protocol.h"
#include "rpc/function_registry.h"

namespace drpc {

// The owners' side of distributed optimizers (the server of optimizer_protocol.h):
// registers its three functions into `functions` and runs the optimizers they create on
// this worker's parameters, stepped with the gradients of a distributed autograd context.
// Concurrent steps of one optimizer are serialized. `autograd` and `functions` must
// outlive it.
class OptimizerHost {
 public:
  virtual ~OptimizerHost() = default;
};

std::unique_ptr<OptimizerHost> create_optimizer_host(AutogradContainer& autograd, FunctionRegistry& functions);

}  // namespace drpc
