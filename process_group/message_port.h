#pragma once

// The transport-level message channel the RPC agent runs over: opaque messages to and
// from the other ranks of a group, apart from the group's collectives. A MessagePort and
// the ProcessGroup made with it share one transport (see GroupEndpoints).

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "process_group/work.h"

namespace drpc {

// A message for the RPC layer: opaque header bytes plus tensors, which travel beside the
// header without being serialized into it.
struct PgMessage {
  std::string header;
  std::vector<at::Tensor> tensors;
};

// Receives messages sent with MessagePort::send_message. Called on the transport's
// network threads, in order per source rank; must return quickly and not block on the
// port or its group.
struct MessageListener {
  std::function<void(int source_rank, PgMessage message)> on_message;
  // A peer's connection broke or it left; called once per peer. `reason` names it.
  std::function<void(int rank, const Error& reason)> on_peer_failed;
};

// One rank's end of the messages between the `size()` ranks of a group. Every method is
// thread-safe. It stops when the group sharing its transport shuts down.
class MessagePort {
 public:
  MessagePort() = default;
  MessagePort(const MessagePort&) = delete;
  MessagePort& operator=(const MessagePort&) = delete;
  virtual ~MessagePort() = default;

  // This rank, 0..size()-1. Never fails.
  virtual int rank() const = 0;
  // The number of ranks. Never fails.
  virtual int size() const = 0;

  // Sends a message to `dst_rank`'s MessageListener without waiting; the Work completes
  // once it is written (the tensors may then change). Throws kBadArgument, kShutdown,
  // kPeerUnavailable when it cannot be queued.
  virtual WorkPtr send_message(int dst_rank, const PgMessage& message) = 0;

  // Installs the listener for messages and peer failures (an empty one detaches it; it
  // returns after any call in progress). Set it once, before peers send messages:
  // messages that arrive before are held for it, in order, and peers already failed
  // reported to it. The listener's captures must outlive its installation.
  virtual void set_message_listener(MessageListener listener) = 0;
};

}  // namespace drpc
