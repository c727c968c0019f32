#pragma once

// The one conversion between drpc::ErrorKind and its wire numbers
// (common/proto/error_kind.proto, append only).

#include "common/error.h"
#include "common/proto/error_kind.pb.h"

namespace drpc {

inline wire::ErrorKind to_wire(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kTimeout: return wire::TIMEOUT;
    case ErrorKind::kPeerUnavailable: return wire::PEER_UNAVAILABLE;
    case ErrorKind::kRemote: return wire::REMOTE;
    case ErrorKind::kBadArgument: return wire::BAD_ARGUMENT;
    case ErrorKind::kMismatch: return wire::MISMATCH;
    case ErrorKind::kShutdown: return wire::SHUTDOWN;
    case ErrorKind::kProtocol: return wire::PROTOCOL;
    case ErrorKind::kUnauthenticated: return wire::UNAUTHENTICATED;
    case ErrorKind::kInternal: return wire::INTERNAL;
  }
  return wire::INTERNAL;
}

// A received error kind: numbers this build does not know (a newer peer's, or garbage)
// become kInternal. ERROR_KIND_NONE is not an error: callers check it first.
inline ErrorKind from_wire(int kind) {
  switch (kind) {
    case wire::TIMEOUT: return ErrorKind::kTimeout;
    case wire::PEER_UNAVAILABLE: return ErrorKind::kPeerUnavailable;
    case wire::REMOTE: return ErrorKind::kRemote;
    case wire::BAD_ARGUMENT: return ErrorKind::kBadArgument;
    case wire::MISMATCH: return ErrorKind::kMismatch;
    case wire::SHUTDOWN: return ErrorKind::kShutdown;
    case wire::PROTOCOL: return ErrorKind::kProtocol;
    case wire::UNAUTHENTICATED: return ErrorKind::kUnauthenticated;
    default: return ErrorKind::kInternal;
  }
}

}  // namespace drpc
