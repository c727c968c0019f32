#pragma once

#include <stdexcept>
#include <string>

namespace drpc {

// What went wrong, in a form a program can branch on. The message says the rest.
enum class ErrorKind {
  kTimeout,          // a deadline passed
  kPeerUnavailable,  // a peer (worker, store) cannot be reached or has gone away
  kRemote,           // a remote function raised; the message carries the remote error
  kBadArgument,      // the caller passed something invalid (rank, name, types, ...)
  kMismatch,         // ranks disagree on a collective's shape, dtype or kind
  kShutdown,         // the object was shut down before or during the call
  kProtocol,         // malformed or unexpected bytes from the network
  kUnauthenticated,  // a connection without the job's credentials
  kInternal,         // a bug in drpc; please report it
};

inline const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kTimeout: return "Timeout";
    case ErrorKind::kPeerUnavailable: return "PeerUnavailable";
    case ErrorKind::kRemote: return "Remote";
    case ErrorKind::kBadArgument: return "BadArgument";
    case ErrorKind::kMismatch: return "Mismatch";
    case ErrorKind::kShutdown: return "Shutdown";
    case ErrorKind::kProtocol: return "Protocol";
    case ErrorKind::kUnauthenticated: return "Unauthenticated";
    case ErrorKind::kInternal: return "Internal";
  }
  return "Unknown";
}

// Thrown by every drpc layer. what() is "<Kind>: <message>".
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(std::string(error_kind_name(kind)) + ": " + message),
        kind_(kind),
        message_(message) {}

  ErrorKind kind() const { return kind_; }
  // The message without the kind prefix.
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

}  // namespace drpc
