// The frame decoder (process_group/frame.cc) on hostile network bytes: a message is split
// into frames, each validated, and every tensor materialised as the process group does.
// Properties: malformed input is a kProtocol error and nothing else; a tensor holds
// exactly the bytes the frame carried; the result does not depend on how the transport
// cut the message into slices.

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/check.h"
#include "process_group/transport.h"

namespace {

using drpc::ByteSpan;
using drpc::Error;
using drpc::ErrorKind;
using drpc::Frame;
using drpc::FrameTensor;

// Decodes; returns false (after checking the error's kind) for rejected input.
bool decode(const std::vector<ByteSpan>& pieces, std::vector<Frame>* frames, std::string* error) {
  try {
    *frames = drpc::decode_wire_frames(pieces, nullptr, 1);
    return true;
  } catch (const Error& e) {
    FUZZ_CHECK(e.kind() == ErrorKind::kProtocol, e.what());
    *error = e.message();
    return false;
  }
}

std::string body_bytes(const Frame& frame) {
  std::string out(frame.body_size(), '\0');
  frame.copy_body(0, out.data(), out.size());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<Frame> frames;
  std::string error;
  const bool ok = decode({ByteSpan{data, size}}, &frames, &error);

  // The same bytes in three slices, as gRPC may hand them over.
  std::vector<Frame> sliced;
  std::string sliced_error;
  const size_t a = size / 3, b = 2 * size / 3;
  const bool sliced_ok =
      decode({ByteSpan{data, a}, ByteSpan{data + a, b - a}, ByteSpan{data + b, size - b}}, &sliced, &sliced_error);
  FUZZ_CHECK(ok == sliced_ok, "slicing changed the verdict: " + error + sliced_error);
  FUZZ_CHECK(error == sliced_error, "slicing changed the error: " + error + " / " + sliced_error);
  if (!ok) return 0;
  FUZZ_CHECK(frames.size() == sliced.size(), "slicing changed the frame count");

  for (size_t f = 0; f < frames.size(); ++f) {
    const Frame& frame = frames[f];
    FUZZ_CHECK(frame.header.SerializeAsString() == sliced[f].header.SerializeAsString(), "slicing changed a header");
    FUZZ_CHECK(frame.tensors.size() == sliced[f].tensors.size(), "slicing changed the tensor count");
    for (size_t i = 0; i < frame.tensors.size(); ++i) {
      const FrameTensor& x = frame.tensors[i];
      const FrameTensor& y = sliced[f].tensors[i];
      FUZZ_CHECK(x.dtype == y.dtype && x.sizes == y.sizes && x.nbytes == y.nbytes, "slicing changed a tensor's shape");
    }
    const std::string body = body_bytes(frame);
    FUZZ_CHECK(body == body_bytes(sliced[f]), "slicing changed a body");
    size_t offset = 0;
    for (const auto& meta : frame.tensors) {
      // Validated frames materialise without any error: an exception here escapes.
      at::Tensor t = drpc::tensor_from_body(frame, meta, offset);
      FUZZ_CHECK(t.nbytes() == meta.nbytes, "tensor of " + drpc::describe_meta(meta) + " has the wrong size");
      FUZZ_CHECK(t.is_contiguous(), "tensor not contiguous");
      FUZZ_CHECK(t.nbytes() == 0 || std::memcmp(t.data_ptr(), body.data() + offset, t.nbytes()) == 0,
                 "tensor bytes differ from the frame's");
      offset += meta.nbytes;
    }
    FUZZ_CHECK(offset == body.size(), "tensors do not cover the body");
  }
  return 0;
}
