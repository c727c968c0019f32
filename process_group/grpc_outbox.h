#pragma once

// Internal to //process_group: the outgoing side of one peer's gRPC stream. Frames are
// encoded into gRPC slices (large tensors in place) and queued; they are written one gRPC
// message at a time, and whatever queued up while a write was in flight goes out
// together in the next.

#include <ATen/core/Tensor.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "common/error.h"
#include "process_group/proto/frame.pb.h"

namespace drpc {

class Outbox {
 public:
  using SendCallback = std::function<void(std::exception_ptr)>;

  // `start_write` starts a write of the given message on the stream; it is called with
  // no lock held. Null: the stream is gone, nothing more is written.
  void attach(std::function<void(grpc::ByteBuffer*)> start_write);

  // Encodes and queues a frame; throws if the stream is closed. See Transport::send.
  void send(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors, SendCallback on_sent);

  // The message of the write in flight, which gRPC reads until that write completes.
  const void* message() const { return &buffer_; }

  // The write started last has finished; `why_not` says why when it failed.
  void on_write_done(bool ok, const std::function<Error()>& why_not);

  // No more frames: queued ones fail with `why`. Returns whether a write is still in flight.
  bool close(const Error& why);

  bool writing();

 private:
  void close_locked(const Error& why);
  // Starts the next write if the stream is idle and frames wait. Releases the lock.
  void maybe_start(std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  // Guarded by mu_.
  std::function<void(grpc::ByteBuffer*)> start_write_;
  std::vector<grpc::Slice> queued_slices_;
  std::vector<SendCallback> queued_callbacks_;
  std::vector<SendCallback> in_flight_;
  std::vector<SendCallback> failed_;  // to be told, outside the lock
  bool writing_ = false;
  std::optional<Error> closed_;
  grpc::ByteBuffer buffer_;  // the message in flight; untouched until its write completes
};

}  // namespace drpc
