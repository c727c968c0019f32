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

void describe_tensors(const std::vector<at::Tensor>& tensors, pg::FrameHeader* header) {
  if (tensors.size() > static_cast<size_t>(kMaxFrameTensors)) {
    throw Error(ErrorKind::kBadArgument, "a frame carries at most " + std::to_string(kMaxFrameTensors) +
                                             " tensors, got " + std::to_string(tensors.size()));
  }
  for (const auto& t : tensors) {
    pg::TensorMeta* meta = header->add_tensors();
    meta->set_dtype(static_cast<int32_t>(t.scalar_type()));
    for (int64_t size : t.sizes()) meta->add_sizes(size);
    meta->set_nbytes(t.nbytes());
  }
}

void validate_frame(const pg::FrameHeader& header, size_t body_size) {
  if (header.tensors_size() > kMaxFrameTensors) {
    throw Error(ErrorKind::kProtocol, "frame lists " + std::to_string(header.tensors_size()) +
                                          " tensors, more than the " + std::to_string(kMaxFrameTensors) +
                                          " a frame may carry");
  }
  unsigned __int128 total = 0;
  for (int i = 0; i < header.tensors_size(); ++i) {
    const pg::TensorMeta& meta = header.tensors(i);
    auto which = [i] { return "frame tensor " + std::to_string(i) + ": "; };
    if (!is_wire_dtype(meta.dtype())) {
      throw Error(ErrorKind::kProtocol, which() + "unknown dtype " + std::to_string(meta.dtype()));
    }
    if (meta.sizes_size() > kMaxDims) {
      throw Error(ErrorKind::kProtocol, which() + "more than " + std::to_string(kMaxDims) + " dims");
    }
    unsigned __int128 bytes = c10::elementSize(static_cast<c10::ScalarType>(meta.dtype()));
    // Zero dims make the byte count 0 whatever the others say, but libtorch still computes
    // strides from the others (in int64, unchecked): bound their product too.
    unsigned __int128 extent = 1;
    for (int64_t size : meta.sizes()) {
      if (size < 0) throw Error(ErrorKind::kProtocol, which() + "negative size");
      bytes *= static_cast<uint64_t>(size);
      if (bytes > std::numeric_limits<uint64_t>::max()) {
        throw Error(ErrorKind::kProtocol, which() + "size overflows");
      }
      extent *= static_cast<uint64_t>(std::max<int64_t>(size, 1));
      if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw Error(ErrorKind::kProtocol, which() + "shape " + describe_meta(meta) + " has more elements than int64 counts");
      }
    }
    if (bytes != meta.nbytes()) {
      throw Error(ErrorKind::kProtocol, which() + "claims " + std::to_string(meta.nbytes()) +
                                            " bytes for shape " + describe_meta(meta));
    }
    total += bytes;
  }
  if (total != body_size) {
    throw Error(ErrorKind::kProtocol, "frame header describes " +
                                          std::to_string(static_cast<uint64_t>(total)) +
                                          " tensor bytes but " + std::to_string(body_size) +
                                          " arrived");
  }
}

std::string describe_meta(const pg::TensorMeta& meta) {
  std::string out = is_wire_dtype(meta.dtype())
                        ? c10::toString(static_cast<c10::ScalarType>(meta.dtype()))
                        : "dtype" + std::to_string(meta.dtype());
  out += "[";
  for (int i = 0; i < meta.sizes_size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(meta.sizes(i));
  }
  return out + "]";
}

at::Tensor tensor_from_body(const Frame& frame, const pg::TensorMeta& meta, size_t offset, BufferPool* pool) {
  std::vector<int64_t> sizes(meta.sizes().begin(), meta.sizes().end());
  const auto dtype = static_cast<c10::ScalarType>(meta.dtype());
  // Large tensors whose bytes arrived in one aligned piece are used in place: the tensor
  // keeps the received buffer alive instead of copying out of it.
  constexpr size_t kInPlaceBytes = 64 * 1024;
  if (meta.nbytes() >= kInPlaceBytes) {
    size_t skip = offset;
    for (const auto& span : frame.body) {
      if (skip >= span.size) {
        skip -= span.size;
        continue;
      }
      const uint8_t* start = span.data + skip;
      if (span.size - skip >= meta.nbytes() && reinterpret_cast<uintptr_t>(start) % 64 == 0) {
        std::shared_ptr<void> keepalive = frame.keepalive;
        return at::from_blob(const_cast<uint8_t*>(start), sizes, [keepalive](void*) {},
                             at::TensorOptions().dtype(dtype));
      }
      break;
    }
  }
  // A large copy goes into a reused buffer (buffer_pool.h says why).
  constexpr size_t kPooledTensorBytes = 1 << 20;
  if (pool != nullptr && meta.nbytes() >= kPooledTensorBytes) {
    if (std::shared_ptr<uint8_t> buffer = pool->take(meta.nbytes())) {
      frame.copy_body(offset, buffer.get(), meta.nbytes());
      uint8_t* data = buffer.get();
      return at::from_blob(data, sizes, [buffer = std::move(buffer)](void*) {}, at::TensorOptions().dtype(dtype));
    }
  }
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
  frame.copy_body(offset, t.data_ptr(), meta.nbytes());
  return t;
}

void encode_frame(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors, FramePieces& out) {
  const size_t header_size = header.ByteSizeLong();
  size_t head_size = 4 + header_size;
  size_t i = 0;
  // Copy the leading run of small tensors into the head piece.
  for (; i < tensors.size() && tensors[i].nbytes() <= kInlineTensorBytes; ++i) head_size += tensors[i].nbytes();
  out.add_bytes(head_size, [&](uint8_t* bytes) {
    const uint32_t len = static_cast<uint32_t>(header_size);
    std::memcpy(bytes, &len, 4);  // little-endian hosts only (x86_64, aarch64)
    header.SerializeWithCachedSizesToArray(bytes + 4);
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
    uint32_t header_size = 0;
    all.copy_body(offset, &header_size, 4);  // little-endian hosts only (x86_64, aarch64)
    offset += 4;
    if (header_size > kMaxFrameHeaderBytes || header_size > total - offset) {
      throw Error(ErrorKind::kProtocol, "frame header length " + std::to_string(header_size) +
                                            " exceeds the message (" + std::to_string(total) + " bytes)");
    }
    Frame frame;
    frame.source = source;
    frame.keepalive = keepalive;
    std::string header_bytes(header_size, '\0');
    all.copy_body(offset, header_bytes.data(), header_size);
    offset += header_size;
    if (!frame.header.ParseFromString(header_bytes)) {
      throw Error(ErrorKind::kProtocol, "frame header is not a valid FrameHeader");
    }
    uint64_t body_size = 0;
    for (int i = 0; i < frame.header.tensors_size(); ++i) {
      const uint64_t nbytes = frame.header.tensors(i).nbytes();
      if (nbytes > total - offset - body_size) {
        throw Error(ErrorKind::kProtocol, "frame tensor " + std::to_string(i) + " claims " + std::to_string(nbytes) +
                                              " bytes but the message holds only " +
                                              std::to_string(total - offset - body_size) + " more");
      }
      body_size += nbytes;
    }
    validate_frame(frame.header, body_size);  // metas consistent with their byte counts
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
