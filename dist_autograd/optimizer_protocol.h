#pragma once

// The DistributedOptimizer's protocol, both ends: a client (RemoteOptimizers, on the
// worker that trains) creates one optimizer on each owner of its parameters, steps them
// with a distributed autograd context's gradients, and drops them; the server
// (OptimizerHost, optimizer_host.h) runs them there. They meet through three registered
// functions whose arguments are typed here, the spec travelling as named fields.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "rpc/rpc_agent.h"
#include "rref/rref.h"

namespace drpc {

// An optimizer over some parameters on their owner (SGD with momentum, Adam;
// torch::optim does the math).
struct OptimizerSpec {
  std::string kind = "sgd";  // "sgd" | "adam"
  double lr = 0.01;
  double momentum = 0;       // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
  double weight_decay = 0;
};

namespace optimizer_protocol {
constexpr const char* kCreate = "drpc.optim.create";    // (spec, [RRef owned there]) -> optimizer id
constexpr const char* kStep = "drpc.optim.step";        // (optimizer id, context id) -> None
constexpr const char* kRelease = "drpc.optim.release";  // (optimizer id) -> whether it existed

// The spec as a dict of its named fields.
c10::IValue encode_spec(const OptimizerSpec& spec);
// Throws Error(kBadArgument) naming a missing, mistyped or unknown field.
OptimizerSpec decode_spec(const c10::IValue& value);
}  // namespace optimizer_protocol

// The client: one optimizer per owner of `params`, created when this is constructed
// (throws the first owner's error, e.g. a parameter it does not own). Thread-safe.
class RemoteOptimizers {
 public:
  // Sends a call to a worker by name (the Runtime's rpc_async).
  using Call = std::function<FuturePtr(const std::string& to, const std::string& fn, std::vector<c10::IValue> args)>;
  RemoteOptimizers(Call call, const OptimizerSpec& spec, const std::vector<RRef>& params);
  // Drops the optimizers on their owners and waits for their answers (a gone owner, or a
  // stopped runtime, has nothing left to drop).
  ~RemoteOptimizers();
  RemoteOptimizers(const RemoteOptimizers&) = delete;
  RemoteOptimizers& operator=(const RemoteOptimizers&) = delete;

  // Steps every owner's optimizer with `context_id`'s gradients, concurrently; returns
  // when all are done, or throws the first error (in owner order).
  void step(int64_t context_id);

 private:
  void release_all();

  const Call call_;
  std::vector<std::pair<std::string, int64_t>> optimizers_;  // owner name, optimizer id there
};

}  // namespace drpc
