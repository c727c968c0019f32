#pragma once

// Internal to //process_group: the gRPC transport. One server per rank; each pair of ranks
// shares one bidirectional stream of raw frames (the lower rank dials the higher one).

#include <chrono>
#include <memory>
#include <string>

#include "process_group/store.h"
#include "process_group/transport.h"

namespace drpc {

struct GrpcTransportOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;             // 0: any free port
  std::string advertise_host;      // what peers dial; empty: listen_host
  std::chrono::milliseconds connect_timeout{60000};
  std::string token;               // peers must present the same one
  std::string group_name;          // peers must belong to the same group
};

// Listens, publishes this rank's address in `store`, connects to every peer and returns
// once all are connected. `store` is used only during the call; `sink` must outlive the
// transport. Throws kBadArgument (rank out of range, cannot listen, rank taken),
// kTimeout (peers missing), kUnauthenticated (a peer refused us).
std::unique_ptr<Transport> create_grpc_transport(Store& store, int rank, int size,
                                                 const GrpcTransportOptions& options, FrameSink& sink);

}  // namespace drpc
