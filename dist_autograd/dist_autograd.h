#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/executor.h"
#include "rpc/rpc_agent.h"

namespace drpc {

// Message types of distributed autograd.
enum AutogradMessageType : int32_t {
  kAutogradBackward = 200,  // gradients for a send function; replied to when downstream is done
  kAutogradRelease = 201,   // forget a context
};

// The id of distributed autograd's header on RPC messages (rpc/message.h's Extensions):
// the context a message belongs to and the send function of its tensors.
constexpr int32_t kAutogradExtension = 200;

// One worker's distributed autograd contexts. A context id carries its creating worker's
// id in the high 16 bits. Inside a context (see Scope), every message carrying tensors
// that require grad records a send function here and a recv function on the receiver;
// backward() runs the whole distributed graph (FAST mode) and leaves gradients in the
// context instead of in .grad. Thread-safe.
class AutogradContainer {
 public:
  AutogradContainer() = default;
  AutogradContainer(const AutogradContainer&) = delete;
  AutogradContainer& operator=(const AutogradContainer&) = delete;
  virtual ~AutogradContainer() = default;

  // A new context on this worker.
  virtual int64_t new_context() = 0;
  // Forgets `context_id` here at once and tells every worker that took part, without
  // waiting for them (as torch.distributed.autograd does: a training step does not pay a
  // round trip for it). The future completes once they all have forgotten it; it never
  // fails (a worker that is gone or shutting down reclaims its contexts itself).
  virtual FuturePtr release(int64_t context_id) = 0;
  virtual bool has_context(int64_t context_id) = 0;
  virtual int64_t num_contexts() = 0;

  // The context a received request belongs to (-1: none), read from its extensions: a
  // handler runs in it so the calls it makes are recorded there. Throws kProtocol when
  // the extension is malformed. Thread-safe.
  virtual int64_t context_of(const Extensions& extensions) = 0;
  // The context of the calling thread (-1: none), and setting it.
  virtual int64_t current_context() = 0;
  virtual void set_current_context(int64_t context_id) = 0;

  // Runs the distributed backward from `roots` (scalars) and returns once every worker
  // involved is done. Throws kBadArgument (no roots, a non-scalar or leaf root, unknown
  // context), or the first error of any worker, naming it.
  virtual void backward(int64_t context_id, const std::vector<at::Tensor>& roots, bool retain_graph) = 0;

  // The gradients accumulated in `context_id` on this worker, leaf -> gradient.
  virtual c10::Dict<at::Tensor, at::Tensor> gradients(int64_t context_id) = 0;
};

// Registers its handlers and interceptor on `agent` (borrowed; must outlive it; before
// agent.start()). A context another worker created that sees no use for `orphan_ttl` on
// `executor`'s clock is reclaimed (its creator died or forgot to release it); the check
// runs on `executor` (borrowed; must outlive the container).
std::shared_ptr<AutogradContainer> create_autograd_container(
    RpcAgent& agent, Executor& executor, std::chrono::milliseconds orphan_ttl = std::chrono::minutes(30));

}  // namespace drpc
