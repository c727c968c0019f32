#pragma once

#include <memory>
#include <vector>

#include "process_group/group_endpoints.h"

namespace drpc {

// `size` ranks of a ProcessGroup in this process, joined by in-memory queues instead of
// the network: for fast, deterministic unit tests of the layers above. Collectives,
// point-to-point and messages behave as over gRPC (the same logic runs above the
// transport); shutdown() of one rank is seen by the others as that peer leaving. Each
// rank's group comes with its MessagePort (see GroupEndpoints for their lifetimes).
std::vector<GroupEndpoints> create_in_memory_process_groups(int size);

}  // namespace drpc
