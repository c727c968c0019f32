#include "common/error_wire.h"

#include <gtest/gtest.h>

namespace drpc {
namespace {

// The numbers are the wire format: pinned here, so reordering the proto enum (or the C++
// one) fails a test instead of silently changing what peers of other builds understand.
TEST(ErrorWire, NumbersArePinnedAndRoundTrip) {
  const std::vector<std::pair<ErrorKind, int>> pinned = {
      {ErrorKind::kTimeout, 1},  {ErrorKind::kPeerUnavailable, 2}, {ErrorKind::kRemote, 3},
      {ErrorKind::kBadArgument, 4}, {ErrorKind::kMismatch, 5},     {ErrorKind::kShutdown, 6},
      {ErrorKind::kProtocol, 7}, {ErrorKind::kUnauthenticated, 8}, {ErrorKind::kInternal, 9},
  };
  for (const auto& [kind, number] : pinned) {
    EXPECT_EQ(static_cast<int>(to_wire(kind)), number) << error_kind_name(kind);
    EXPECT_EQ(from_wire(number), kind) << number;
  }
}

TEST(ErrorWire, UnknownNumbersBecomeInternal) {
  for (int number : {-1, 10, 1000, 0x7fffffff}) EXPECT_EQ(from_wire(number), ErrorKind::kInternal) << number;
}

}  // namespace
}  // namespace drpc
