#pragma once

// Internal to //process_group: how a frame is written to the wire, as pieces a transport
// can send without copying large tensors. The format is the one decode_wire_frames
// (transport.h, frame.cc) reads: [u32 little-endian length word][header][tensor bytes, in
// order]. No gRPC type here.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "process_group/proto/frame.pb.h"

namespace drpc {

// Tensors this small are copied next to the header: one piece is cheaper than a
// zero-copy piece with its own release callback.
constexpr size_t kInlineTensorBytes = 16 * 1024;

// Where encode_frame puts a frame's pieces, in wire order. A transport turns each into
// whatever its network takes (gRPC slices); the concatenation of the pieces is the frame.
class FramePieces {
 public:
  virtual ~FramePieces() = default;
  // A new piece of `size` bytes, which `fill` writes (called once, before this returns).
  virtual void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) = 0;
  // A piece that is `tensor`'s bytes in place: the transport keeps the tensor alive and
  // reads its storage until the piece is sent.
  virtual void add_tensor(const at::Tensor& tensor) = 0;
};

// Appends one frame: `header` (whose tensor metas the caller filled, see describe_tensors)
// and the bytes of `tensors` (contiguous CPU tensors). A MESSAGE header goes flat instead:
// the tensors' dtypes and shapes, read from `tensors`, then its payload; nothing else of it.
// The length word, the header and the leading run of tensors of at most kInlineTensorBytes
// make the first piece; after it, each non-empty tensor is a piece of its own, copied if
// small, else in place. Throws kBadArgument, before adding any piece, for a header over
// kMaxFrameHeaderBytes, more than kMaxFrameTensors tensors in a MESSAGE or one with more
// than 64 dims.
void encode_frame(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors, FramePieces& out);

// The checks encode_frame makes before it adds a piece (it throws the same errors); returns
// the header's size on the wire.
size_t checked_header_size(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors);

}  // namespace drpc
