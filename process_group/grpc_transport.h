#pragma once

// Internal to //process_group: the gRPC transport. One server per rank; each pair of ranks
// shares one bidirectional stream of raw frames (the lower rank dials the higher one).

#include <chrono>
#include <memory>
#include <string>

#include "process_group/security.h"
#include "process_group/store.h"
#include "process_group/transport.h"
#include "process_group/ucx_links.h"

namespace drpc {

struct GrpcTransportOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;             // 0: any free port
  std::string advertise_host;      // what peers dial; empty: listen_host
  std::chrono::milliseconds connect_timeout{60000};
  SecurityOptions security;        // token and TLS every peer must match
  std::string group_name;          // peers must belong to the same group
  // Each connected peer is sent a heartbeat every `heartbeat_interval`; a peer from which
  // nothing arrived for heartbeat_misses intervals is declared failed (on_peer_failed
  // with kPeerUnavailable naming it). A zero interval turns heartbeats off. A single
  // message must arrive within that window too: collectives send large tensors in chunks.
  std::chrono::milliseconds heartbeat_interval{1000};
  int heartbeat_misses = 10;
  // Which link carries frames once a pair is connected (ucx_links.h). Whatever the choice,
  // a pair whose UCX link cannot be opened or probed stays on gRPC.
  DataPlane data_plane = DataPlane::kAuto;
  // Each UCX peer's shared-memory arena on this host (ucx_links.h; 0: none).
  size_t shm_arena_bytes = kDefaultArenaBytes;
};

// Listens, publishes this rank's address in `store`, connects to every peer and returns
// once all are connected. `store` is used only during the call; `sink` must outlive the
// transport. Throws kBadArgument (rank out of range, cannot listen, rank taken),
// kTimeout (peers missing), kUnauthenticated (a peer refused us), kPeerUnavailable (a
// connection broke before the peer answered, e.g. the peer went away).
std::unique_ptr<Transport> create_grpc_transport(Store& store, int rank, int size,
                                                 const GrpcTransportOptions& options, FrameSink& sink);

}  // namespace drpc
