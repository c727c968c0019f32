#pragma once

// Internal to //process_group: the collective algorithms (broadcast, allreduce direct and
// ring, allgather, barrier): what each rank sends and receives, and how it reduces, as
// bodies that a CollectiveRunner runs in call order.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "process_group/collective_runner.h"
#include "process_group/process_group.h"

namespace drpc {

struct AllreduceTuning {
  // Up to this size a tensor goes to every peer at once (one round, lowest latency);
  // above it, a pipelined ring (reduce-scatter, then allgather).
  int64_t ring_threshold_bytes = 256 * 1024;
  // The ring moves at most this many bytes per frame, so transfer and reduction overlap.
  int64_t chunk_bytes = 4 << 20;
};

// Each checks its arguments (throws kBadArgument at once) and queues the collective on
// `runner` (borrowed for the call); the returned Work completes as ProcessGroup's
// contract says. The tensors must stay alive until it completes.
WorkPtr run_broadcast(CollectiveRunner& runner, at::Tensor tensor, int root);
WorkPtr run_allreduce(CollectiveRunner& runner, const AllreduceTuning& tuning, at::Tensor tensor, ReduceOp op);
WorkPtr run_allgather(CollectiveRunner& runner, const at::Tensor& input);
WorkPtr run_barrier(CollectiveRunner& runner);

}  // namespace drpc
