// The frame format's checks on what arrives from the network, and in-place receives.

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

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

TEST(Frame, LargeTensorsInOneAlignedPieceAreUsedInPlace) {
  at::Tensor source = at::arange(1 << 16, at::kFloat);  // 256 KiB, 64-byte aligned storage
  Frame frame;
  frame.body.push_back(ByteSpan{static_cast<const uint8_t*>(source.data_ptr()), source.nbytes()});
  frame.keepalive = std::make_shared<at::Tensor>(source);
  at::Tensor received = tensor_from_body(frame, meta(at::kFloat, {1 << 16}, source.nbytes()), 0);
  EXPECT_EQ(received.data_ptr(), source.data_ptr());
  EXPECT_TRUE(at::equal(received, source));

  // Split in two pieces: copied, same values.
  Frame split;
  const auto* bytes = static_cast<const uint8_t*>(source.data_ptr());
  split.body.push_back(ByteSpan{bytes, 1000});
  split.body.push_back(ByteSpan{bytes + 1000, source.nbytes() - 1000});
  at::Tensor copied = tensor_from_body(split, meta(at::kFloat, {1 << 16}, source.nbytes()), 0);
  EXPECT_NE(copied.data_ptr(), source.data_ptr());
  EXPECT_TRUE(at::equal(copied, source));
}

}  // namespace
}  // namespace drpc
