#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "process_group/security.h"
#include "process_group/store.h"

namespace drpc {

// The store's server, hosted by the master (rank 0, or a standalone process).
class StoreServer {
 public:
  StoreServer() = default;
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  virtual ~StoreServer() = default;

  // The port it listens on (the real one when started on port 0).
  virtual int port() const = 0;
  // Stops serving: waiting clients get kShutdown. Idempotent; the destructor calls it.
  virtual void shutdown() = 0;
};

// Listens on host:port (port 0 picks a free one). Throws kBadArgument if it cannot bind.
// With a token in `security`, every call must carry it: others are refused with
// UNAUTHENTICATED (the client sees kUnauthenticated) and logged, and change nothing.
std::unique_ptr<StoreServer> start_store_server(const std::string& host, int port,
                                                const SecurityOptions& security = {});

// A client of the store at host:port. Waits up to `connect_timeout` for the server to
// answer, then throws kPeerUnavailable naming the address. Later calls that cannot reach
// the server throw kPeerUnavailable; calls the server refuses throw kUnauthenticated.
std::unique_ptr<Store> connect_store(const std::string& host, int port,
                                     std::chrono::milliseconds connect_timeout,
                                     const SecurityOptions& security = {});

}  // namespace drpc
