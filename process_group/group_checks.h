#pragma once

// Internal to //process_group: the argument checks and error texts shared by the parts of
// the collective process group (collectives, point-to-point, messages), so all word them
// alike.

#include <ATen/core/Tensor.h>

#include <string>

#include "common/error.h"
#include "process_group/proto/frame.pb.h"

namespace drpc {

// The dtype, shape and byte count of `t`.
inline pg::TensorMeta meta_of(const at::Tensor& t) {
  pg::TensorMeta meta;
  meta.set_dtype(static_cast<int32_t>(t.scalar_type()));
  for (int64_t size : t.sizes()) meta.add_sizes(size);
  meta.set_nbytes(t.nbytes());
  return meta;
}

// Throws kBadArgument unless `t` is a defined dense CPU tensor.
inline void check_dense_cpu(const at::Tensor& t, const char* what) {
  if (!t.defined()) throw Error(ErrorKind::kBadArgument, std::string(what) + ": undefined tensor");
  if (!t.device().is_cpu() || t.layout() != c10::kStrided) {
    throw Error(ErrorKind::kBadArgument,
                std::string(what) + ": only dense CPU tensors are supported, got " +
                    t.toString());
  }
}

// Throws kBadArgument unless 0 <= r < size.
inline void check_rank(int r, int size, const char* what) {
  if (r < 0 || r >= size) {
    throw Error(ErrorKind::kBadArgument, std::string(what) + " " + std::to_string(r) +
                                             " is out of range for a group of size " +
                                             std::to_string(size));
  }
}

// Throws kBadArgument unless `r` is a rank of the group other than `self`.
inline void check_peer(int r, int self, int size, const char* what) {
  check_rank(r, size, what);
  if (r == self) throw Error(ErrorKind::kBadArgument, std::string(what) + " is this rank itself");
}

inline Error shutdown_error(int rank) {
  return Error(ErrorKind::kShutdown, "rank " + std::to_string(rank) + "'s process group is shut down");
}

inline Error peer_error(int peer, const Error& reason) {
  return Error(ErrorKind::kPeerUnavailable, "rank " + std::to_string(peer) + " is gone (" + reason.message() + ")");
}

}  // namespace drpc
