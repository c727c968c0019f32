#pragma once

// Internal to //process_group: a rank's ProcessGroup and MessagePort over any Transport:
// routes each arriving frame by kind to the collectives (collective_runner.h,
// collective_algorithms.h), the point-to-point matcher (p2p_matcher.h) or the message
// channel (message_channel.h), and peer failures and shutdown to all three.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "process_group/group_endpoints.h"
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

// The group and its message port, sharing the transport (see GroupEndpoints for their
// lifetimes). Throws what `make_transport` throws.
GroupEndpoints create_collective_process_group(const TransportFactory& make_transport,
                                               const CollectiveOptions& options);

}  // namespace drpc
