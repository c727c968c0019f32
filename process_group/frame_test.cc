// The frame format: encoding round trips through the decoder, the checks on what arrives
// from the network, and in-place receives.

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <cstring>

#include "process_group/frame.h"
#include "process_group/transport.h"

namespace drpc {
namespace {

pg::TensorMeta meta(c10::ScalarType dtype, std::vector<int64_t> sizes, uint64_t nbytes) {
  pg::TensorMeta m;
  m.set_dtype(static_cast<int32_t>(dtype));
  for (auto s : sizes) m.add_sizes(s);
  m.set_nbytes(nbytes);
  return m;
}

// The error validate_frame throws, or kInternal with an empty message for none.
Error error_of(const pg::FrameHeader& header, size_t body) {
  try {
    validate_frame(header, body);
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::kInternal, "");
}

// [u32 header length][header][body], as the gRPC transport writes a frame.
std::string wire(const pg::FrameHeader& header, const std::string& body) {
  const std::string head = header.SerializeAsString();
  const uint32_t len = static_cast<uint32_t>(head.size());
  return std::string(reinterpret_cast<const char*>(&len), 4) + head + body;
}

Error decode_error(const std::string& bytes) {
  try {
    decode_wire_frames({ByteSpan{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}}, nullptr, 0);
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::kInternal, "");
}

ErrorKind kind_of(const pg::FrameHeader& header, size_t body) {
  try {
    validate_frame(header, body);
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kInternal;  // "no error"
}

TEST(Frame, HeadersThatLieAboutSizesAreProtocolErrors) {
  pg::FrameHeader ok;
  *ok.add_tensors() = meta(at::kFloat, {2, 3}, 24);
  EXPECT_EQ(kind_of(ok, 24), ErrorKind::kInternal);
  EXPECT_EQ(kind_of(ok, 23), ErrorKind::kProtocol);  // bytes missing

  pg::FrameHeader huge;  // a 1 TiB tensor in a 16-byte frame: rejected, never allocated
  *huge.add_tensors() = meta(at::kFloat, {int64_t{1} << 38}, uint64_t{1} << 40);
  EXPECT_EQ(kind_of(huge, 16), ErrorKind::kProtocol);

  pg::FrameHeader inconsistent;
  *inconsistent.add_tensors() = meta(at::kDouble, {4}, 16);  // 4 doubles are 32 bytes
  EXPECT_EQ(kind_of(inconsistent, 16), ErrorKind::kProtocol);

  pg::FrameHeader overflow;
  *overflow.add_tensors() = meta(at::kFloat, {int64_t{1} << 62, int64_t{1} << 62}, 0);
  EXPECT_EQ(kind_of(overflow, 0), ErrorKind::kProtocol);

  pg::FrameHeader negative;
  *negative.add_tensors() = meta(at::kFloat, {-1}, 0);
  EXPECT_EQ(kind_of(negative, 0), ErrorKind::kProtocol);

  pg::FrameHeader bad_dtype;
  *bad_dtype.add_tensors() = meta(static_cast<c10::ScalarType>(99), {1}, 4);
  EXPECT_EQ(kind_of(bad_dtype, 4), ErrorKind::kProtocol);
}

TEST(Frame, AZeroDimDoesNotHideAShapeLibtorchCannotIndex) {
  // 0 bytes, but at::empty would compute strides of 2^124 elements (overflowing int64).
  pg::FrameHeader header;
  *header.add_tensors() = meta(at::kFloat, {0, int64_t{1} << 62, int64_t{1} << 62}, 0);
  Error e = error_of(header, 0);
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_EQ(e.message(), "frame tensor 0: shape Float[0, 4611686018427387904, 4611686018427387904] has more "
                         "elements than int64 counts");

  pg::FrameHeader fine;  // large but countable empty shapes are tensors like any other
  *fine.add_tensors() = meta(at::kFloat, {0, int64_t{1} << 31, int64_t{1} << 31}, 0);
  EXPECT_EQ(kind_of(fine, 0), ErrorKind::kInternal);
}

TEST(Frame, TheTensorCountIsBoundedBeforeAnyIsMade) {
  pg::FrameHeader header;
  for (int i = 0; i <= kMaxFrameTensors; ++i) *header.add_tensors() = meta(at::kFloat, {0}, 0);
  Error e = error_of(header, 0);
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_EQ(e.message(), "frame lists 65537 tensors, more than the 65536 a frame may carry");
  header.mutable_tensors()->RemoveLast();
  EXPECT_EQ(kind_of(header, 0), ErrorKind::kInternal);

  // A sender learns it at once, instead of its peer closing the connection.
  std::vector<at::Tensor> many(kMaxFrameTensors + 1, at::empty({0}));
  pg::FrameHeader out;
  try {
    describe_tensors(many, &out);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kBadArgument);
    EXPECT_EQ(error.message(), "a frame carries at most 65536 tensors, got 65537");
  }
}

TEST(Frame, TheWireDecoderNamesAClaimItCannotHold) {
  pg::FrameHeader huge;  // 1 TiB claimed, 16 bytes sent: an error before any allocation
  huge.set_kind(pg::FrameHeader::MESSAGE);
  *huge.add_tensors() = meta(at::kFloat, {int64_t{1} << 38}, uint64_t{1} << 40);
  Error e = decode_error(wire(huge, std::string(16, 'x')));
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_EQ(e.message(), "frame tensor 0 claims 1099511627776 bytes but the message holds only 16 more");

  e = decode_error(std::string("\xff\xff\xff\x00" "abc", 7));  // a 16 MiB header in a 7-byte message
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_EQ(e.message(), "frame header length 16777215 exceeds the message (7 bytes)");

  e = decode_error(std::string("\x01\x00", 2));
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_EQ(e.message(), "frame shorter than its length prefix");

  e = decode_error(wire(huge, "").substr(0, 4) + std::string(wire(huge, "").size() - 4, '\x07'));
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_EQ(e.message(), "frame header is not a valid FrameHeader");
}

TEST(Frame, TheWireDecoderReadsFramesAcrossSlices) {
  pg::FrameHeader first;
  first.set_kind(pg::FrameHeader::P2P);
  first.set_tag(7);
  *first.add_tensors() = meta(at::kInt, {3}, 12);
  pg::FrameHeader second;
  second.set_kind(pg::FrameHeader::GOODBYE);
  const int32_t values[3] = {1, -2, 3};
  const std::string bytes = wire(first, std::string(reinterpret_cast<const char*>(values), 12)) + wire(second, "");
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  // Cut inside the length prefix, the header and the body.
  std::vector<ByteSpan> pieces = {{data, 2}, {data + 2, 5}, {data + 7, bytes.size() - 13}, {data + bytes.size() - 6, 6}};
  auto keepalive = std::make_shared<int>(0);
  std::vector<Frame> frames = decode_wire_frames(pieces, keepalive, 3);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].source, 3);
  EXPECT_EQ(frames[0].header.tag(), 7);
  EXPECT_EQ(frames[0].keepalive, keepalive);
  at::Tensor t = tensor_from_body(frames[0], frames[0].tensors[0], 0);
  EXPECT_TRUE(at::equal(t, at::tensor({1, -2, 3}, at::kInt)));
  EXPECT_EQ(frames[1].header.kind(), pg::FrameHeader::GOODBYE);
  EXPECT_EQ(frames[1].body_size(), 0u);
}

TEST(Frame, LargeTensorsInOneAlignedPieceAreUsedInPlace) {
  at::Tensor source = at::arange(1 << 16, at::kFloat);  // 256 KiB, 64-byte aligned storage
  Frame frame;
  frame.body.push_back(ByteSpan{static_cast<const uint8_t*>(source.data_ptr()), source.nbytes()});
  frame.keepalive = std::make_shared<at::Tensor>(source);
  at::Tensor received = tensor_from_body(frame, frame_tensor(meta(at::kFloat, {1 << 16}, source.nbytes())), 0);
  EXPECT_EQ(received.data_ptr(), source.data_ptr());
  EXPECT_TRUE(at::equal(received, source));

  // Split in two pieces: copied, same values.
  Frame split;
  const auto* bytes = static_cast<const uint8_t*>(source.data_ptr());
  split.body.push_back(ByteSpan{bytes, 1000});
  split.body.push_back(ByteSpan{bytes + 1000, source.nbytes() - 1000});
  at::Tensor copied = tensor_from_body(split, frame_tensor(meta(at::kFloat, {1 << 16}, source.nbytes())), 0);
  EXPECT_NE(copied.data_ptr(), source.data_ptr());
  EXPECT_TRUE(at::equal(copied, source));
}

TEST(Frame, LargeTensorsCopiedOutOfPiecesReuseThePoolsBuffers) {
  at::Tensor source = at::arange(1 << 19, at::kFloat);  // 2 MiB
  const auto* bytes = static_cast<const uint8_t*>(source.data_ptr());
  Frame split;  // in two pieces (as gRPC delivers a large message): copied out
  split.body.push_back(ByteSpan{bytes, 1000});
  split.body.push_back(ByteSpan{bytes + 1000, source.nbytes() - 1000});
  const FrameTensor m = frame_tensor(meta(at::kFloat, {1 << 19}, source.nbytes()));
  auto pool = std::make_shared<BufferPool>(64u << 20);
  void* first_buffer = nullptr;
  {
    at::Tensor received = tensor_from_body(split, m, 0, pool.get());
    EXPECT_TRUE(at::equal(received, source));
    first_buffer = received.data_ptr();
  }  // freed: its buffer goes back to the pool
  EXPECT_GE(pool->pooled_bytes(), source.nbytes());
  at::Tensor again = tensor_from_body(split, m, 0, pool.get());
  EXPECT_EQ(again.data_ptr(), first_buffer);
  EXPECT_EQ(pool->pooled_bytes(), 0u);
  EXPECT_TRUE(at::equal(again, source));
  // While one is in use, the next gets a buffer of its own.
  at::Tensor other = tensor_from_body(split, m, 0, pool.get());
  EXPECT_NE(other.data_ptr(), again.data_ptr());
  EXPECT_TRUE(at::equal(other, source));
  // A tensor may outlive the pool's owner: it holds the pool.
  pool.reset();
  EXPECT_TRUE(at::equal(other, source));
}

// Collects encode_frame's pieces as a transport would: copies in buffers of their own,
// tensors in place (kept alive here).
class CollectedPieces final : public FramePieces {
 public:
  void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) override {
    copies_.push_back(std::make_unique<uint8_t[]>(size));
    fill(copies_.back().get());
    pieces.push_back(ByteSpan{copies_.back().get(), size});
    in_place.push_back(false);
  }
  void add_tensor(const at::Tensor& tensor) override {
    tensors_.push_back(tensor);
    pieces.push_back(ByteSpan{static_cast<const uint8_t*>(tensor.data_ptr()), tensor.nbytes()});
    in_place.push_back(true);
  }

  std::vector<ByteSpan> pieces;
  std::vector<bool> in_place;

 private:
  std::vector<std::unique_ptr<uint8_t[]>> copies_;
  std::vector<at::Tensor> tensors_;
};

pg::FrameHeader described(pg::FrameHeader::Kind kind, int64_t tag, const std::vector<at::Tensor>& tensors) {
  pg::FrameHeader header;
  header.set_kind(kind);
  header.set_tag(tag);
  describe_tensors(tensors, &header);
  return header;
}

TEST(Frame, EncodedFramesDecodeToTheSameHeadersAndTensors) {
  // Small, empty, large (in place) and small-after-large (copied) tensors of several
  // dtypes, then a tensor-less frame, all in one message as an outbox batches them.
  const std::vector<at::Tensor> tensors = {
      at::arange(5, at::kInt),
      at::empty({0, 3}, at::kFloat),
      at::arange(3, at::kDouble),
      at::arange(1 << 14, at::kFloat),  // 64 KiB: past kInlineTensorBytes
      at::ones({2, 2}, at::kBool),
      at::arange(1 << 13, at::kLong),  // 64 KiB
  };
  const pg::FrameHeader first = described(pg::FrameHeader::P2P, 11, tensors);
  pg::FrameHeader second;
  second.set_kind(pg::FrameHeader::GOODBYE);
  CollectedPieces out;
  encode_frame(first, tensors, out);
  encode_frame(second, {}, out);

  // The head holds the prefix, header and the three leading small tensors; then the large
  // one in place, the small one copied, the last large one in place; then the goodbye.
  ASSERT_EQ(out.pieces.size(), 5u);
  EXPECT_EQ(out.in_place, (std::vector<bool>{false, true, false, true, false}));
  EXPECT_EQ(out.pieces[0].size, 4 + first.ByteSizeLong() + 20 + 0 + 24);
  EXPECT_EQ(out.pieces[1].data, tensors[3].data_ptr());
  EXPECT_EQ(out.pieces[2].size, 4u);

  std::vector<Frame> frames = decode_wire_frames(out.pieces, nullptr, 2);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].source, 2);
  EXPECT_EQ(frames[0].header.SerializeAsString(), first.SerializeAsString());
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const FrameTensor& m = frames[0].tensors[i];
    at::Tensor t = tensor_from_body(frames[0], m, offset);
    EXPECT_TRUE(at::equal(t, tensors[i])) << "tensor " << i;
    EXPECT_EQ(t.sizes(), tensors[i].sizes()) << "tensor " << i;
    offset += m.nbytes;
  }
  EXPECT_EQ(offset, frames[0].body_size());
  EXPECT_EQ(frames[1].header.kind(), pg::FrameHeader::GOODBYE);
  EXPECT_EQ(frames[1].body_size(), 0u);
}

TEST(Frame, MessageFramesTravelWithAFlatHeader) {
  const std::vector<at::Tensor> tensors = {
      at::arange(5, at::kInt),
      at::empty({0, 3}, at::kFloat),
      at::scalar_tensor(2.5, at::kDouble),  // no dims
      at::arange(1 << 14, at::kFloat),  // 64 KiB: in place
      at::ones({2, 2}, at::kBool),
  };
  const std::string payload("the agent's header, \0 and all", 29);
  pg::FrameHeader header;
  header.set_kind(pg::FrameHeader::MESSAGE);
  header.set_payload(payload);
  CollectedPieces out;
  encode_frame(header, tensors, out);
  encode_frame(header, {}, out);  // and one without tensors

  // [word][u32 count][per tensor: dtype, dims, sizes][payload], then the leading small tensors.
  const size_t flat_size = 4 + (2 + 8) + (2 + 16) + 2 + (2 + 8) + (2 + 16) + payload.size();
  ASSERT_EQ(out.pieces.size(), 4u);
  uint32_t word = 0;
  std::memcpy(&word, out.pieces[0].data, 4);
  EXPECT_EQ(word, kFlatMessageBit | flat_size);
  EXPECT_EQ(out.pieces[0].size, 4 + flat_size + 20 + 0 + 8);
  EXPECT_EQ(out.pieces[1].data, tensors[3].data_ptr());

  // Decoded whole and cut into pieces at every byte of the first header.
  std::string bytes;
  for (const auto& piece : out.pieces) bytes.append(reinterpret_cast<const char*>(piece.data), piece.size);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t cut = 0; cut <= 4 + flat_size; cut += 7) {
    std::vector<ByteSpan> pieces = {{data, cut}, {data + cut, bytes.size() - cut}};
    std::vector<Frame> frames = decode_wire_frames(pieces, nullptr, 1);
    ASSERT_EQ(frames.size(), 2u);
    for (const Frame& frame : frames) {
      EXPECT_EQ(frame.header.kind(), pg::FrameHeader::MESSAGE);
      EXPECT_EQ(frame.header.payload(), payload);
      EXPECT_EQ(frame.header.tensors_size(), 0);
    }
    ASSERT_EQ(frames[0].tensors.size(), tensors.size());
    EXPECT_TRUE(frames[1].tensors.empty());
    size_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const FrameTensor& m = frames[0].tensors[i];
      EXPECT_EQ(m.dtype, static_cast<int32_t>(tensors[i].scalar_type())) << "tensor " << i;
      EXPECT_EQ(m.nbytes, tensors[i].nbytes()) << "tensor " << i;
      at::Tensor t = tensor_from_body(frames[0], m, offset);
      EXPECT_EQ(t.sizes(), tensors[i].sizes()) << "tensor " << i;
      EXPECT_TRUE(at::equal(t, tensors[i])) << "tensor " << i;
      offset += m.nbytes;
    }
    EXPECT_EQ(offset, frames[0].body_size());
  }
}

// A flat MESSAGE frame: `count`, then each tensor as (dtype, dims, sizes), then `payload`.
std::string flat_message(uint32_t count, const std::vector<std::pair<uint8_t, std::vector<int64_t>>>& shapes,
                         const std::string& payload, const std::string& body, int64_t cut_header = 0) {
  std::string head(reinterpret_cast<const char*>(&count), 4);
  for (const auto& [dtype, sizes] : shapes) {
    head += static_cast<char>(dtype);
    head += static_cast<char>(sizes.size());
    for (int64_t size : sizes) head.append(reinterpret_cast<const char*>(&size), 8);
  }
  head += payload;
  head.resize(head.size() - cut_header);
  const uint32_t word = kFlatMessageBit | static_cast<uint32_t>(head.size());
  return std::string(reinterpret_cast<const char*>(&word), 4) + head + body;
}

TEST(Frame, MalformedFlatMessageHeadersAreProtocolErrors) {
  const uint8_t kFloat = static_cast<uint8_t>(at::kFloat);
  const std::string eight(8, 'x');
  EXPECT_EQ(decode_error(flat_message(1, {{kFloat, {2}}}, "p", eight)).kind(), ErrorKind::kInternal);  // well formed
  const std::vector<std::pair<std::string, std::string>> cases = {
      {flat_message(0, {}, "", "", 4), "message header shorter than its tensor count"},
      {flat_message(kMaxFrameTensors + 1, {}, "", ""), "frame lists 65537 tensors, more than the 65536 a frame may carry"},
      {flat_message(2, {{kFloat, {2}}}, "", eight), "message header ends inside tensor 1"},
      {flat_message(1000, {}, "abc", ""), "message header lists 1000 tensors in 3 bytes"},
      {flat_message(1, {{kFloat, {2, 3}}}, "", eight, 1), "message header ends inside tensor 0's shape"},
      {flat_message(1, {{99, {2}}}, "", eight), "frame tensor 0: unknown dtype 99"},
      {flat_message(1, {{kFloat, std::vector<int64_t>(65, 1)}}, "", "x"), "frame tensor 0: more than 64 dims"},
      {flat_message(1, {{kFloat, {-1}}}, "", ""), "frame tensor 0: negative size"},
      {flat_message(1, {{kFloat, {int64_t{1} << 62, int64_t{1} << 62}}}, "", ""), "frame tensor 0: size overflows"},
      {flat_message(1, {{kFloat, {3}}}, "", eight), "frame tensor 0 claims 12 bytes but the message holds only 8 more"},
  };
  for (const auto& [bytes, message] : cases) {
    const Error e = decode_error(bytes);
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol) << message;
    EXPECT_EQ(e.message(), message);
  }
}

TEST(Frame, AMessageWithAHeaderPastTheLimitIsRefusedAtTheSender) {
  pg::FrameHeader header;
  header.set_kind(pg::FrameHeader::MESSAGE);
  header.set_payload(std::string(kMaxFrameHeaderBytes, 'p'));
  CollectedPieces out;
  try {
    encode_frame(header, {}, out);
    ADD_FAILURE() << "encoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    EXPECT_EQ(e.message(), "a frame's header is at most 16777216 bytes, this one 16777220");
  }
  EXPECT_TRUE(out.pieces.empty());
}

TEST(Frame, AFrameWithoutTensorsIsItsLengthPrefixAndHeader) {
  pg::FrameHeader hello;
  hello.set_kind(pg::FrameHeader::HELLO);
  hello.set_rank(3);
  hello.set_group("g");
  CollectedPieces out;
  encode_frame(hello, {}, out);
  ASSERT_EQ(out.pieces.size(), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.pieces[0].data), out.pieces[0].size), wire(hello, ""));
}

}  // namespace
}  // namespace drpc
