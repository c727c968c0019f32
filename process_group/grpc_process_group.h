#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "process_group/group_endpoints.h"
#include "process_group/process_group.h"
#include "process_group/security.h"
#include "process_group/store.h"

namespace drpc {

struct GrpcProcessGroupOptions {
  std::string listen_host = "127.0.0.1";  // local jobs stay on loopback
  int listen_port = 0;                    // 0: any free port
  std::string advertise_host;             // what peers dial; empty: listen_host
  // Each collective's deadline, and start-up's (all peers connected) unless connect_timeout is set.
  std::chrono::milliseconds timeout{60000};
  std::chrono::milliseconds connect_timeout{0};  // start-up's deadline; zero: `timeout`
  SecurityOptions security;               // token and TLS every peer must match
  // Liveness: see GrpcTransportOptions. A silent peer fails after interval * misses.
  std::chrono::milliseconds heartbeat_interval{1000};
  int heartbeat_misses = 10;
  std::string group_name = "default";
  int64_t ring_threshold_bytes = 256 * 1024;
  int64_t chunk_bytes = 4 << 20;
  // The data plane: "auto" (UCX shared memory between ranks on one host, gRPC between
  // hosts), "ucx" (UCX between all ranks: across hosts unencrypted and unauthenticated, for
  // trusted networks) or "grpc". Empty: the DRPC_DATA_PLANE environment variable, else auto.
  // Throws kBadArgument for any other value.
  std::string data_plane;
  // The shared-memory arena per peer on this host for large tensors of messages (0: none).
  int64_t shm_arena_bytes = int64_t{512} << 20;
};

// Joins the group of `size` ranks rendezvousing through `store` (borrowed; used only
// during the call: give each group its own prefix of a shared store). Returns once every
// peer is connected. Throws kBadArgument for a rank out of range or taken twice, kTimeout
// when peers do not appear in time, kPeerUnavailable when the store is gone.
std::unique_ptr<ProcessGroup> create_grpc_process_group(Store& store, int rank, int size,
                                                        const GrpcProcessGroupOptions& options);

// As create_grpc_process_group, and also the MessagePort over the same connections (for
// the RPC agent; see GroupEndpoints for their lifetimes).
GroupEndpoints create_grpc_group_endpoints(Store& store, int rank, int size, const GrpcProcessGroupOptions& options);

}  // namespace drpc
