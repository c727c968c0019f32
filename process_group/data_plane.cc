// Data plane names and this host's identity (data_plane.h).

#include "process_group/data_plane.h"

#include <unistd.h>

#include <fstream>

#include "common/error.h"

namespace drpc {

DataPlane parse_data_plane(const std::string& name) {
  if (name == "auto") return DataPlane::kAuto;
  if (name == "ucx") return DataPlane::kUcx;
  if (name == "grpc") return DataPlane::kGrpc;
  throw Error(ErrorKind::kBadArgument, "unknown data plane '" + name + "' (expected auto, ucx or grpc)");
}

const char* data_plane_name(DataPlane plane) {
  switch (plane) {
    case DataPlane::kAuto:
      return "auto";
    case DataPlane::kUcx:
      return "ucx";
    case DataPlane::kGrpc:
      return "grpc";
  }
  return "?";
}

std::string this_host_id() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  // Processes in other network namespaces (other containers) count as other hosts: they
  // usually cannot share memory with us, and are meant to be reached over their network.
  char net[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", net, sizeof(net) - 1);
  return std::string(host) + "/" + boot_id + "/" + (n > 0 ? std::string(net, n) : std::string());
}

}  // namespace drpc
