// The gRPC process group: the collective process group over the gRPC transport.

#include "process_group/grpc_process_group.h"

#include <cstdlib>

#include "process_group/collective_process_group.h"
#include "process_group/grpc_transport.h"

namespace drpc {
namespace {

DataPlane resolve_data_plane(const std::string& chosen) {
  if (!chosen.empty()) return parse_data_plane(chosen);
  const char* from_environment = std::getenv("DRPC_DATA_PLANE");
  if (from_environment != nullptr && *from_environment != '\0') return parse_data_plane(from_environment);
  return DataPlane::kAuto;
}

}  // namespace

GroupEndpoints create_grpc_group_endpoints(Store& store, int rank, int size, const GrpcProcessGroupOptions& options) {
  GrpcTransportOptions transport;
  transport.listen_host = options.listen_host;
  transport.listen_port = options.listen_port;
  transport.advertise_host = options.advertise_host;
  transport.connect_timeout = options.connect_timeout.count() > 0 ? options.connect_timeout : options.timeout;
  transport.security = options.security;
  transport.heartbeat_interval = options.heartbeat_interval;
  transport.heartbeat_misses = options.heartbeat_misses;
  transport.group_name = options.group_name;
  transport.data_plane = resolve_data_plane(options.data_plane);
  if (options.shm_arena_bytes < 0) throw Error(ErrorKind::kBadArgument, "shm_arena_bytes must be 0 or more");
  transport.shm_arena_bytes = static_cast<size_t>(options.shm_arena_bytes);
  CollectiveOptions collective;
  collective.timeout = options.timeout;
  collective.ring_threshold_bytes = options.ring_threshold_bytes;
  collective.chunk_bytes = options.chunk_bytes;
  return create_collective_process_group(
      [&](FrameSink& sink) { return create_grpc_transport(store, rank, size, transport, sink); },
      collective);
}

std::unique_ptr<ProcessGroup> create_grpc_process_group(Store& store, int rank, int size,
                                                        const GrpcProcessGroupOptions& options) {
  return create_grpc_group_endpoints(store, rank, size, options).group;  // the port goes; the group keeps the transport
}

}  // namespace drpc
