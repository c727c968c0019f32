#pragma once

// Internal to //process_group: which link carries frames between two ranks, and what makes
// two ranks neighbours on one host (ucx_links.h uses both).

#include <string>

namespace drpc {

// Which link carries frames between two ranks (Options::data_plane, DRPC_DATA_PLANE).
enum class DataPlane {
  kAuto,  // UCX shared memory for peers on this host, gRPC for the others
  kUcx,   // UCX for every peer, across hosts on UCX's TCP or RDMA (unencrypted)
  kGrpc,  // gRPC only
};

// "auto", "ucx" or "grpc"; throws kBadArgument naming any other value.
DataPlane parse_data_plane(const std::string& name);
const char* data_plane_name(DataPlane plane);

// Identifies this host (its name, boot and network namespace): peers with the same id may
// share memory.
std::string this_host_id();

}  // namespace drpc
