#pragma once

#include <memory>

#include "process_group/store.h"

namespace drpc {

// A Store inside one process: for ranks run as threads, and the state behind the gRPC
// store's server. close() wakes every waiter with kShutdown.
class InMemoryStore : public Store {
 public:
  virtual void close() = 0;
};

std::unique_ptr<InMemoryStore> create_in_memory_store();

}  // namespace drpc
