#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "process_group/frame.h"
#include "process_group/transport.h"

namespace drpc {
namespace {

// Dense dtypes that may cross the wire; anything else in a header is malformed.
bool is_wire_dtype(int32_t dtype) {
  switch (static_cast<c10::ScalarType>(dtype)) {
    case c10::ScalarType::Byte:
    case c10::ScalarType::Char:
    case c10::ScalarType::Short:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Half:
    case c10::ScalarType::Float:
    case c10::ScalarType::Double:
    case c10::ScalarType::ComplexHalf:
    case c10::ScalarType::ComplexFloat:
    case c10::ScalarType::ComplexDouble:
    case c10::ScalarType::Bool:
    case c10::ScalarType::BFloat16:
      return true;
    default:
      return false;
  }
}

constexpr int kMaxDims = 64;

}  // namespace

size_t Frame::body_size() const {
  size_t total = 0;
  for (const auto& span : body) total += span.size;
  return total;
}

const uint8_t* Frame::contiguous(size_t offset, size_t len) const {
  for (const auto& span : body) {
    if (offset >= span.size) {
      offset -= span.size;
      continue;
    }
    return span.size - offset >= len ? span.data + offset : nullptr;
  }
  return nullptr;
}

void Frame::copy_body(size_t offset, void* dst, size_t len) const {
  auto* out = static_cast<uint8_t*>(dst);
  for (const auto& span : body) {
    if (len == 0) return;
    if (offset >= span.size) {
      offset -= span.size;
      continue;
    }
    const size_t n = std::min(len, span.size - offset);
    if (out != span.data + offset) std::memcpy(out, span.data + offset, n);  // equal: it landed in place
    out += n;
    len -= n;
    offset = 0;
  }
  if (len != 0) throw Error(ErrorKind::kInternal, "frame body is shorter than its header says");
}

void check_rank_in_world(int rank, int size) {
  if (rank < 0 || rank >= size) {
    throw Error(ErrorKind::kBadArgument,
                "rank " + std::to_string(rank) + " is out of range for world size " + std::to_string(size));
  }
}

void check_tensor_count(size_t count) {
  if (count > static_cast<size_t>(kMaxFrameTensors)) {
    throw Error(ErrorKind::kBadArgument, "a frame carries at most " + std::to_string(kMaxFrameTensors) +
                                             " tensors, got " + std::to_string(count));
  }
}

void describe_tensors(const std::vector<at::Tensor>& tensors, pg::FrameHeader* header) {
  check_tensor_count(tensors.size());
  for (const auto& t : tensors) {
    pg::TensorMeta* meta = header->add_tensors();
    meta->set_dtype(static_cast<int32_t>(t.scalar_type()));
    for (int64_t size : t.sizes()) meta->add_sizes(size);
    meta->set_nbytes(t.nbytes());
  }
}

std::vector<FrameTensor> frame_tensors(const std::vector<at::Tensor>& tensors) {
  std::vector<FrameTensor> out(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    out[i].dtype = static_cast<int32_t>(tensors[i].scalar_type());
    out[i].sizes.assign(tensors[i].sizes().begin(), tensors[i].sizes().end());
    out[i].nbytes = tensors[i].nbytes();
  }
  return out;
}

FrameTensor frame_tensor(const pg::TensorMeta& meta) {
  FrameTensor out;
  out.dtype = meta.dtype();
  out.sizes.assign(meta.sizes().begin(), meta.sizes().end());
  out.nbytes = meta.nbytes();
  return out;
}

namespace {

template <typename Sizes>
std::string describe_shape(int32_t dtype, const Sizes& sizes) {
  std::string out = is_wire_dtype(dtype) ? c10::toString(static_cast<c10::ScalarType>(dtype))
                                         : "dtype" + std::to_string(dtype);
  out += "[";
  bool first = true;
  for (int64_t size : sizes) {
    if (!first) out += ", ";
    first = false;
    out += std::to_string(size);
  }
  return out + "]";
}

// Frame tensor `i`'s byte count as its dtype and shape give it; throws kProtocol when the
// dtype is unknown or the shape malformed.
template <typename Sizes>
uint64_t shape_bytes(int i, int32_t dtype, const Sizes& sizes) {
  auto which = [i] { return "frame tensor " + std::to_string(i) + ": "; };
  if (!is_wire_dtype(dtype)) throw Error(ErrorKind::kProtocol, which() + "unknown dtype " + std::to_string(dtype));
  if (static_cast<int64_t>(sizes.size()) > kMaxDims) {
    throw Error(ErrorKind::kProtocol, which() + "more than " + std::to_string(kMaxDims) + " dims");
  }
  unsigned __int128 bytes = c10::elementSize(static_cast<c10::ScalarType>(dtype));
  // Zero dims make the byte count 0 whatever the others say, but libtorch still computes
  // strides from the others (in int64, unchecked): bound their product too.
  unsigned __int128 extent = 1;
  for (int64_t size : sizes) {
    if (size < 0) throw Error(ErrorKind::kProtocol, which() + "negative size");
    bytes *= static_cast<uint64_t>(size);
    if (bytes > std::numeric_limits<uint64_t>::max()) throw Error(ErrorKind::kProtocol, which() + "size overflows");
    extent *= static_cast<uint64_t>(std::max<int64_t>(size, 1));
    if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw Error(ErrorKind::kProtocol,
                  which() + "shape " + describe_shape(dtype, sizes) + " has more elements than int64 counts");
    }
  }
  return static_cast<uint64_t>(bytes);
}

void check_meta_count(int64_t count) {
  if (count > kMaxFrameTensors) {
    throw Error(ErrorKind::kProtocol, "frame lists " + std::to_string(count) + " tensors, more than the " +
                                          std::to_string(kMaxFrameTensors) + " a frame may carry");
  }
}

// Checks a FrameHeader's tensor metas; returns their total byte count.
unsigned __int128 checked_meta_bytes(const pg::FrameHeader& header) {
  check_meta_count(header.tensors_size());
  unsigned __int128 total = 0;
  for (int i = 0; i < header.tensors_size(); ++i) {
    const pg::TensorMeta& meta = header.tensors(i);
    const uint64_t bytes = shape_bytes(i, meta.dtype(), meta.sizes());
    if (bytes != meta.nbytes()) {
      throw Error(ErrorKind::kProtocol, "frame tensor " + std::to_string(i) + ": claims " +
                                            std::to_string(meta.nbytes()) + " bytes for shape " + describe_meta(meta));
    }
    total += bytes;
  }
  return total;
}

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // little-endian hosts only (x86_64, aarch64)
  return v;
}

// A flat MESSAGE header (decode_wire_frames gives its layout).
void read_flat_message(const uint8_t* bytes, size_t length, Frame* frame) {
  if (length < 4) throw Error(ErrorKind::kProtocol, "message header shorter than its tensor count");
  const uint32_t count = read_le<uint32_t>(bytes);
  check_meta_count(count);
  if ((length - 4) / 2 < count) {  // each tensor takes at least its dtype and dims bytes
    throw Error(ErrorKind::kProtocol, "message header lists " + std::to_string(count) + " tensors in " +
                                          std::to_string(length - 4) + " bytes");
  }
  size_t at = 4;
  frame->tensors.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (length - at < 2) throw Error(ErrorKind::kProtocol, "message header ends inside tensor " + std::to_string(i));
    FrameTensor& t = frame->tensors[i];
    t.dtype = bytes[at];
    const size_t dims = bytes[at + 1];
    at += 2;
    if ((length - at) / 8 < dims) {
      throw Error(ErrorKind::kProtocol, "message header ends inside tensor " + std::to_string(i) + "'s shape");
    }
    t.sizes.resize(dims);
    for (size_t d = 0; d < dims; ++d, at += 8) t.sizes[d] = read_le<int64_t>(bytes + at);
    t.nbytes = shape_bytes(static_cast<int>(i), t.dtype, t.sizes);
  }
  frame->header.set_kind(pg::FrameHeader::MESSAGE);
  frame->header.set_payload(bytes + at, length - at);
}

}  // namespace

void validate_frame(const pg::FrameHeader& header, size_t body_size) {
  const unsigned __int128 total = checked_meta_bytes(header);
  if (total != body_size) {
    throw Error(ErrorKind::kProtocol, "frame header describes " + std::to_string(static_cast<uint64_t>(total)) +
                                          " tensor bytes but " + std::to_string(body_size) + " arrived");
  }
}

void read_frame_header(uint32_t word, const uint8_t* bytes, size_t length, Frame* frame) {
  if (word & kFlatMessageBit) return read_flat_message(bytes, length, frame);
  if (!frame->header.ParseFromArray(bytes, static_cast<int>(length))) {
    throw Error(ErrorKind::kProtocol, "frame header is not a valid FrameHeader");
  }
  checked_meta_bytes(frame->header);
  frame->tensors.reserve(frame->header.tensors_size());
  for (const auto& meta : frame->header.tensors()) frame->tensors.push_back(frame_tensor(meta));
}

std::string describe_meta(const pg::TensorMeta& meta) { return describe_shape(meta.dtype(), meta.sizes()); }

std::string describe_meta(const FrameTensor& meta) { return describe_shape(meta.dtype, meta.sizes); }

at::Tensor tensor_from_body(const Frame& frame, const FrameTensor& meta, size_t offset, BufferPool* pool) {
  const at::IntArrayRef sizes(meta.sizes);
  const auto dtype = static_cast<c10::ScalarType>(meta.dtype);
  // Large tensors whose bytes arrived in one aligned piece are used in place: the tensor
  // keeps the received buffer alive instead of copying out of it.
  constexpr size_t kInPlaceBytes = 64 * 1024;
  if (meta.nbytes >= kInPlaceBytes) {
    const uint8_t* start = frame.contiguous(offset, meta.nbytes);
    if (start != nullptr && reinterpret_cast<uintptr_t>(start) % 64 == 0) {
      std::shared_ptr<void> keepalive = frame.keepalive;
      return at::from_blob(const_cast<uint8_t*>(start), sizes, [keepalive](void*) {},
                           at::TensorOptions().dtype(dtype));
    }
  }
  // A large copy goes into a reused buffer (buffer_pool.h says why).
  constexpr size_t kPooledTensorBytes = 1 << 20;
  if (pool != nullptr && meta.nbytes >= kPooledTensorBytes) {
    if (std::shared_ptr<uint8_t> buffer = pool->take(meta.nbytes)) {
      frame.copy_body(offset, buffer.get(), meta.nbytes);
      uint8_t* data = buffer.get();
      return at::from_blob(data, sizes, [buffer = std::move(buffer)](void*) {}, at::TensorOptions().dtype(dtype));
    }
  }
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
  frame.copy_body(offset, t.data_ptr(), meta.nbytes);
  return t;
}

namespace {

// The flat header of a MESSAGE frame carrying `payload` and `tensors`.
size_t flat_message_size(const std::string& payload, const std::vector<at::Tensor>& tensors) {
  size_t size = 4 + payload.size();
  for (const auto& t : tensors) size += 2 + 8 * t.dim();
  return size;
}

uint8_t* write_flat_message(const std::string& payload, const std::vector<at::Tensor>& tensors, uint8_t* out) {
  const uint32_t count = static_cast<uint32_t>(tensors.size());
  std::memcpy(out, &count, 4);  // little-endian hosts only (x86_64, aarch64)
  out += 4;
  for (const auto& t : tensors) {
    *out++ = static_cast<uint8_t>(t.scalar_type());
    *out++ = static_cast<uint8_t>(t.dim());
    for (int64_t size : t.sizes()) {
      std::memcpy(out, &size, 8);
      out += 8;
    }
  }
  std::memcpy(out, payload.data(), payload.size());
  return out + payload.size();
}

}  // namespace

size_t checked_header_size(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors) {
  const bool flat = header.kind() == pg::FrameHeader::MESSAGE;
  if (flat) {
    check_tensor_count(tensors.size());
    for (const auto& t : tensors) {
      if (t.dim() > kMaxDims) {
        throw Error(ErrorKind::kBadArgument, "a frame's tensors have at most " + std::to_string(kMaxDims) +
                                                 " dims, got " + std::to_string(t.dim()));
      }
    }
  }
  const size_t header_size = flat ? flat_message_size(header.payload(), tensors) : header.ByteSizeLong();
  if (header_size > kMaxFrameHeaderBytes) {
    throw Error(ErrorKind::kBadArgument, "a frame's header is at most " + std::to_string(kMaxFrameHeaderBytes) +
                                             " bytes, this one " + std::to_string(header_size));
  }
  return header_size;
}

void encode_frame(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors, FramePieces& out) {
  const bool flat = header.kind() == pg::FrameHeader::MESSAGE;
  const size_t header_size = checked_header_size(header, tensors);
  size_t head_size = 4 + header_size;
  size_t i = 0;
  // Copy the leading run of small tensors into the head piece.
  for (; i < tensors.size() && tensors[i].nbytes() <= kInlineTensorBytes; ++i) head_size += tensors[i].nbytes();
  out.add_bytes(head_size, [&](uint8_t* bytes) {
    const uint32_t word = static_cast<uint32_t>(header_size) | (flat ? kFlatMessageBit : 0);
    std::memcpy(bytes, &word, 4);  // little-endian hosts only (x86_64, aarch64)
    if (flat) {
      write_flat_message(header.payload(), tensors, bytes + 4);
    } else {
      header.SerializeWithCachedSizesToArray(bytes + 4);
    }
    bytes += 4 + header_size;
    for (size_t j = 0; j < i; ++j) {
      if (tensors[j].nbytes()) std::memcpy(bytes, tensors[j].data_ptr(), tensors[j].nbytes());
      bytes += tensors[j].nbytes();
    }
  });
  for (; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (t.nbytes() == 0) continue;
    if (t.nbytes() <= kInlineTensorBytes) {
      out.add_bytes(t.nbytes(), [&](uint8_t* bytes) { std::memcpy(bytes, t.data_ptr(), t.nbytes()); });
    } else {
      out.add_tensor(t);
    }
  }
}

std::vector<Frame> decode_wire_frames(const std::vector<ByteSpan>& pieces, std::shared_ptr<void> keepalive,
                                      int source) {
  Frame all;  // the whole message as one span list, to read across piece boundaries
  for (const auto& piece : pieces) {
    if (piece.size > 0) all.body.push_back(piece);
  }
  const size_t total = all.body_size();
  std::vector<Frame> frames;
  size_t offset = 0;
  while (offset < total) {
    if (total - offset < 4) throw Error(ErrorKind::kProtocol, "frame shorter than its length prefix");
    uint32_t word = 0;
    all.copy_body(offset, &word, 4);  // little-endian hosts only (x86_64, aarch64)
    offset += 4;
    const uint32_t header_size = word & ~kFlatMessageBit;
    if (header_size > kMaxFrameHeaderBytes || header_size > total - offset) {
      throw Error(ErrorKind::kProtocol, "frame header length " + std::to_string(header_size) +
                                            " exceeds the message (" + std::to_string(total) + " bytes)");
    }
    Frame frame;
    frame.source = source;
    frame.keepalive = keepalive;
    const uint8_t* header_bytes = all.contiguous(offset, header_size);
    std::string copied;
    if (header_bytes == nullptr) {  // the header straddles pieces
      copied.resize(header_size);
      all.copy_body(offset, copied.data(), header_size);
      header_bytes = reinterpret_cast<const uint8_t*>(copied.data());
    }
    read_frame_header(word, header_bytes, header_size, &frame);
    offset += header_size;
    uint64_t body_size = 0;
    for (size_t i = 0; i < frame.tensors.size(); ++i) {
      const uint64_t nbytes = frame.tensors[i].nbytes;
      if (nbytes > total - offset - body_size) {
        throw Error(ErrorKind::kProtocol, "frame tensor " + std::to_string(i) + " claims " + std::to_string(nbytes) +
                                              " bytes but the message holds only " +
                                              std::to_string(total - offset - body_size) + " more");
      }
      body_size += nbytes;
    }
    // The body: the spans of `all` covering [offset, offset + body_size).
    size_t skip = offset, want = body_size;
    for (const auto& span : all.body) {
      if (want == 0) break;
      if (skip >= span.size) {
        skip -= span.size;
        continue;
      }
      const size_t n = std::min(want, span.size - skip);
      frame.body.push_back(ByteSpan{span.data + skip, n});
      want -= n;
      skip = 0;
    }
    offset += body_size;
    frames.push_back(std::move(frame));
  }
  return frames;
}

}  // namespace drpc
