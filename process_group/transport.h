#pragma once

// Internal to //process_group: the byte-moving layer beneath CollectiveProcessGroup. A
// Transport connects one rank to every other and carries frames (a small header plus
// tensor bytes); the gRPC transport is the real one, the in-memory one serves fast unit
// tests. No gRPC type appears here.

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "process_group/buffer_pool.h"
#include "process_group/proto/frame.pb.h"

namespace drpc {

struct ByteSpan {
  const uint8_t* data;
  size_t size;
};

// A tensor as a frame describes it. Checked on arrival: nbytes is the dtype's size times
// the shape's element count.
struct FrameTensor {
  int32_t dtype = 0;  // c10::ScalarType
  c10::SmallVector<int64_t, 4> sizes;
  uint64_t nbytes = 0;
};

// One received frame. `body` holds the bytes of `tensors`, in order, in one or more
// fragments that `keepalive` owns. A MESSAGE frame's header has only its kind and payload
// (the message travels with a flat header, see decode_wire_frames); other kinds keep
// their tensor metas in the header too.
struct Frame {
  int source = -1;
  pg::FrameHeader header;
  std::vector<FrameTensor> tensors;
  std::vector<ByteSpan> body;
  std::shared_ptr<void> keepalive;

  size_t body_size() const;
  // Copies `len` bytes from byte `offset` of the body to `dst` (nothing where the body is
  // already there: a frame received in place).
  void copy_body(size_t offset, void* dst, size_t len) const;
  // The `len` body bytes from byte `offset` when they lie in one fragment, else null.
  const uint8_t* contiguous(size_t offset, size_t len) const;
};

// Where a transport delivers what arrives. Called on transport threads, in order per
// source; implementations must not block for long.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  virtual void on_frame(Frame frame) = 0;
  // The connection to `rank` is gone; called at most once per rank.
  virtual void on_peer_failed(int rank, const Error& reason) = 0;
};

class Transport {
 public:
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Queues `header` (whose `tensors` metas the caller filled, see describe_tensors, except
  // for a MESSAGE header: see encode_frame) and the bytes of `tensors` (contiguous CPU
  // tensors) for `dst` and returns at once. The tensors' storage is read in place until
  // `on_sent` runs (with null on success, else the error), on a transport thread or
  // inline; only then may the caller change them.
  // Thread-safe; frames to one peer arrive in order, several may share one network write.
  // Throws kPeerUnavailable or kShutdown when the frame cannot even be queued.
  virtual void send(int dst, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
                    std::function<void(std::exception_ptr)> on_sent) = 0;

  // A hint for large transfers: frame `step` of collective `seq` from `src` (a COLLECTIVE
  // frame whose one tensor has dst's byte count) belongs in `dst` (contiguous CPU). A link that
  // can receive it there does, and the frame then arrives with its body in dst's memory;
  // others deliver it as usual. The transport holds a reference to `dst` until then or until
  // release_placements(seq), and may write dst's bytes at any time before either: the caller
  // must not read or write them meanwhile. Thread-safe; never throws.
  virtual void place_collective_frame(int src, uint64_t seq, uint32_t step, const at::Tensor& dst) = 0;
  // Forgets the placements of collectives up to `seq` that no frame used, and returns once
  // no frame from a live peer is still being received into one of them: a frame already on
  // its way lands first, so that a collective that failed hands its tensors back whole and
  // nothing writes them afterwards. (A peer that failed cannot be waited for: what it had
  // under way when it was declared failed is abandoned, and nothing of it lands in place
  // after.) Thread-safe; not on a transport thread (it waits for them).
  virtual void release_placements(uint64_t seq) = 0;

  // Closes every connection; the sink receives nothing afterwards. Idempotent.
  virtual void shutdown() = 0;

  // The link frames to `rank` take (ProcessGroup::link_to). Thread-safe.
  virtual std::string link_to(int rank) const = 0;
};

// Throws kBadArgument ("rank R is out of range for world size N") unless 0 <= rank < size.
void check_rank_in_world(int rank, int size);

// The most tensors one frame may carry. A meta is a few header bytes but its tensor costs
// hundreds, so a receiver bounds the count before materialising any.
constexpr int kMaxFrameTensors = 1 << 16;

// Fills header->tensors with the dtype, shape and byte count of each tensor. Throws
// kBadArgument for more than kMaxFrameTensors tensors.
void describe_tensors(const std::vector<at::Tensor>& tensors, pg::FrameHeader* header);

// Throws kBadArgument for more than kMaxFrameTensors tensors.
void check_tensor_count(size_t count);

// The dtype, shape and byte count of each tensor, as a frame carrying them describes them.
std::vector<FrameTensor> frame_tensors(const std::vector<at::Tensor>& tensors);
FrameTensor frame_tensor(const pg::TensorMeta& meta);

// Checks that a FrameHeader's tensor metas are well formed (known dtype, at most 64 dims, a
// shape whose element count fits int64 even past a zero dim, at most kMaxFrameTensors) and
// that their bytes add up to `body_size` exactly; throws kProtocol naming what is wrong.
// read_frame_header makes the same checks on every frame that arrives from the network,
// before anything is allocated for its tensors.
void validate_frame(const pg::FrameHeader& header, size_t body_size);

// A human-readable dtype and shape, e.g. "Float[2, 3]".
std::string describe_meta(const pg::TensorMeta& meta);
std::string describe_meta(const FrameTensor& meta);

// A new tensor with `meta`'s dtype and shape, holding the body bytes from `offset`: in
// place when they arrived in one aligned piece, else copied, into a buffer from `pool`
// (which must outlive the call; the tensor keeps what it needs) when one is given and the
// tensor is large.
at::Tensor tensor_from_body(const Frame& frame, const FrameTensor& meta, size_t offset,
                            BufferPool* pool = nullptr);

// The most header bytes one frame may claim; a longer header is malformed.
constexpr uint32_t kMaxFrameHeaderBytes = 16 << 20;

// Set in a frame's length word when its header is a flat MESSAGE header (see below).
constexpr uint32_t kFlatMessageBit = uint32_t{1} << 31;

// Reads the header of one frame: `word` is its length word, `bytes` the `length` header
// bytes it announces (word without kFlatMessageBit). Fills frame->header and
// frame->tensors, each tensor checked (known dtype, at most 64 dims, a shape whose
// element count fits int64, a byte count that matches it, at most kMaxFrameTensors).
// Throws kProtocol naming what is malformed.
void read_frame_header(uint32_t word, const uint8_t* bytes, size_t length, Frame* frame);

// Splits one network message held in `pieces` (owned by `keepalive`) into validated frames
// whose bodies point into the pieces. A frame on the wire is a little-endian u32 length
// word, the header, then its tensors' bytes. The header is a FrameHeader, or, when the
// word has kFlatMessageBit, the flat header of a MESSAGE frame: [u32 tensor count], per
// tensor [u8 dtype][u8 dims][dims x i64 size], then the message's payload to the end.
// Throws kProtocol naming what is malformed; nothing is allocated for a frame's tensors
// before its bytes are known to have arrived.
std::vector<Frame> decode_wire_frames(const std::vector<ByteSpan>& pieces, std::shared_ptr<void> keepalive,
                                      int source);

}  // namespace drpc
