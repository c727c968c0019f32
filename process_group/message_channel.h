#pragma once

// Internal to //process_group: the MessagePort over a Transport: MESSAGE frames out, and
// in to the listener in arrival order (held until one is set).

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "process_group/message_port.h"
#include "process_group/transport.h"

namespace drpc {

// Thread-safe. Lifecycle: construct, attach(transport), messages, close().
class MessageChannel final : public MessagePort {
 public:
  MessageChannel() = default;

  // Sends through `transport` (borrowed; must outlive the channel's use). Once, before
  // the first send.
  void attach(Transport& transport);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  WorkPtr send_message(int dst_rank, const PgMessage& message) override;
  void set_message_listener(MessageListener listener) override;

  // A MESSAGE frame (transport threads), for the listener. Never throws.
  void on_frame(Frame frame);
  // Tells the listener (now, or once set) that `peer` is gone. Once per peer.
  void on_peer_failed(int peer, const Error& reason);
  // Delivers nothing more; sends throw kShutdown. Idempotent; safe from the listener.
  void close();

 private:
  Transport* transport_ = nullptr;
  // Set by attach(), but the transport's callbacks can run before: atomics.
  std::atomic<int> rank_{-1};
  std::atomic<int> size_{0};

  std::mutex mu_;
  // Guarded by mu_.
  bool shut_down_ = false;
  std::map<int, Error> dead_;  // peer rank -> why it is gone
  std::deque<std::pair<int, PgMessage>> early_messages_;

  // Held while calling the listener, so messages reach it one at a time and in order.
  std::mutex listener_mu_;
  MessageListener listener_;  // written under both listener_mu_ and mu_

  // Buffers for large tensors that arrive in pieces (on gRPC links) and are copied out.
  const std::shared_ptr<BufferPool> large_tensors_ = std::make_shared<BufferPool>();
};

}  // namespace drpc
