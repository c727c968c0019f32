#pragma once

// The collectives and tagged point-to-point transfers of a fixed group of ranks. Messages
// for the RPC layer travel through the MessagePort over the same transport
// (message_port.h, group_endpoints.h).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "process_group/work.h"

namespace drpc {

enum class ReduceOp { kSum, kProduct, kMin, kMax, kAvg };

inline const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kProduct: return "PRODUCT";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kAvg: return "AVG";
  }
  return "?";
}

// A fixed group of `size()` processes ranked 0..size()-1, connected to each other.
//
// Collectives (broadcast, allreduce, allgather, barrier) must be called in the same order
// on every rank; they run one at a time, in call order, and complete asynchronously.
// They fail with kMismatch when ranks disagree on dtype, shape or operation, kTimeout when
// the group's timeout passes, kPeerUnavailable when a peer is gone, kShutdown after
// shutdown(). Tensors must be dense CPU tensors and stay alive until the Work completes;
// non-contiguous ones work. Every method is thread-safe.
class ProcessGroup {
 public:
  ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Copies `tensor` of rank `root` into `tensor` on every other rank, in place.
  virtual WorkPtr broadcast(at::Tensor tensor, int root) = 0;

  // Reduces `tensor` across ranks with `op` and leaves the result in `tensor` on every
  // rank, bitwise identical everywhere. kAvg on bool is kBadArgument; on integers it
  // truncates toward zero.
  virtual WorkPtr allreduce(at::Tensor tensor, ReduceOp op) = 0;

  // Gathers every rank's `input` (same dtype and shape everywhere); Work::result() holds
  // size() new tensors in rank order.
  virtual WorkPtr allgather(const at::Tensor& input) = 0;

  // Completes once every rank has entered the barrier.
  virtual WorkPtr barrier() = 0;

  // Sends `tensors` to `dst_rank` under `tag`. The tensors may be reused once the Work
  // completes. Messages between two ranks with one tag arrive in order.
  virtual WorkPtr send(const std::vector<at::Tensor>& tensors, int dst_rank, int64_t tag) = 0;

  // Receives into preallocated `tensors` (matching count, dtypes and shapes, else
  // kMismatch) what `src_rank` sent under `tag`.
  virtual WorkPtr recv(const std::vector<at::Tensor>& tensors, int src_rank, int64_t tag) = 0;

  // Receives what any rank sent under `tag`, into tensors allocated on arrival:
  // Work::result() and Work::source_rank().
  virtual WorkPtr recv_any(int64_t tag) = 0;

  // Stops at once: pending work fails with kShutdown, peers see this rank leave, and the
  // MessagePort sharing the transport stops too. Idempotent.
  virtual void shutdown() = 0;

  // Which link carries this rank's frames to `rank`: "grpc", "ucx", "ucx+shm" (UCX, with
  // large tensors of messages through this rank's shared-memory arena), "memory" (in-memory
  // groups) or "self". For diagnostics and tests. Thread-safe; throws kBadArgument for a
  // rank out of range.
  virtual std::string link_to(int rank) const = 0;
};

}  // namespace drpc
