#pragma once

// Internal to //process_group: the ProcessGroup logic (collective algorithms, tag
// matching, messages, failure handling) over any Transport.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "process_group/process_group.h"
#include "process_group/transport.h"

namespace drpc {

struct CollectiveOptions {
  // Deadline of each collective, counted from when it starts running.
  std::chrono::milliseconds timeout{60000};
  // Allreduce sends tensors up to this size to every peer at once (one round, lowest
  // latency) and uses a pipelined ring (reduce-scatter, then allgather) above it.
  int64_t ring_threshold_bytes = 256 * 1024;
  // The ring moves at most this many bytes per frame, so transfer and reduction overlap.
  int64_t chunk_bytes = 4 << 20;
};

// Builds the transport with the process group as its sink; may throw (the error
// propagates out of create_collective_process_group).
using TransportFactory = std::function<std::unique_ptr<Transport>(FrameSink& sink)>;

std::unique_ptr<ProcessGroup> create_collective_process_group(const TransportFactory& make_transport,
                                                              const CollectiveOptions& options);

}  // namespace drpc
