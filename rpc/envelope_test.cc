// The agent's flat envelope: what it writes reads back the same, and bytes that are not an
// envelope are refused with a reason, never read past their end.

#include "rpc/envelope.h"

#include <gtest/gtest.h>

#include <string>

namespace drpc {
namespace {

rpc::Envelope full_envelope() {
  rpc::Envelope e;
  e.set_type(-7);
  e.set_id(int64_t{1} << 40);
  e.set_is_response(true);
  e.set_profile(true);
  e.set_error_kind(drpc::wire::TIMEOUT);
  e.set_error(std::string("not \0 utf-8 \xff", 13));
  e.set_what("aten::add");
  (*e.mutable_extensions())[200] = std::string("ctx\0", 4);
  (*e.mutable_extensions())[-3] = "";
  rpc::Span* span = e.mutable_profile_spans()->add_spans();
  span->set_name("call");
  span->set_duration_ns(42);
  e.mutable_profile_spans()->set_arrival_ns(5);
  e.set_payload(std::string("payload \0 bytes", 15));
  return e;
}

void expect_same(const rpc::Envelope& a, const rpc::Envelope& b) {
  EXPECT_EQ(a.type(), b.type());
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.is_response(), b.is_response());
  EXPECT_EQ(a.profile(), b.profile());
  EXPECT_EQ(a.error_kind(), b.error_kind());
  EXPECT_EQ(a.error(), b.error());
  EXPECT_EQ(a.what(), b.what());
  EXPECT_EQ(a.payload(), b.payload());
  ASSERT_EQ(a.extensions().size(), b.extensions().size());
  for (const auto& [id, bytes] : a.extensions()) EXPECT_EQ(b.extensions().at(id), bytes) << "extension " << id;
  EXPECT_EQ(a.has_profile_spans(), b.has_profile_spans());
  EXPECT_EQ(a.profile_spans().SerializeAsString(), b.profile_spans().SerializeAsString());
}

TEST(Envelope, EveryFieldReadsBackAsWritten) {
  const rpc::Envelope original = full_envelope();
  rpc::Envelope sent = original;
  const std::string bytes = encode_envelope(sent);
  EXPECT_TRUE(sent.payload().empty());  // moved out
  rpc::Envelope received;
  std::string problem;
  ASSERT_TRUE(decode_envelope(bytes, &received, &problem)) << problem;
  expect_same(original, received);
}

TEST(Envelope, ARequestIsItsFixedFieldsItsLabelAndItsPayload) {
  Message message{3, "the call", {}};
  const std::string bytes = encode_request(9, "f", false, message);
  // [flags][type][id][length]["f"]["the call"]: the payload follows unwrapped.
  EXPECT_EQ(bytes.size(), 1 + 4 + 8 + 4 + 1 + 8u);
  EXPECT_EQ(bytes.substr(bytes.size() - 8), "the call");
  rpc::Envelope received;
  std::string problem;
  ASSERT_TRUE(decode_envelope(bytes, &received, &problem)) << problem;
  EXPECT_EQ(received.type(), 3);
  EXPECT_EQ(received.id(), 9);
  EXPECT_FALSE(received.is_response());
  EXPECT_EQ(received.what(), "f");
  EXPECT_EQ(received.payload(), "the call");
  EXPECT_EQ(received.error_kind(), drpc::wire::ERROR_KIND_NONE);
  EXPECT_TRUE(received.error().empty());
}

TEST(Envelope, BytesCutBeforeThePayloadAreRefused) {
  rpc::Envelope e = full_envelope();
  const size_t payload_size = e.payload().size();
  const std::string bytes = encode_envelope(e);
  for (size_t cut = 0; cut < bytes.size() - payload_size; ++cut) {
    rpc::Envelope received;
    std::string problem;
    EXPECT_FALSE(decode_envelope(bytes.substr(0, cut), &received, &problem)) << "cut at " << cut;
    EXPECT_FALSE(problem.empty()) << "cut at " << cut;
  }
}

TEST(Envelope, UnknownFlagsAndHugeCountsAreRefused) {
  Message message{1, "", {}};
  std::string bytes = encode_request(1, "", false, message);
  rpc::Envelope received;
  std::string problem;
  bytes[0] = static_cast<char>(0x80);
  EXPECT_FALSE(decode_envelope(bytes, &received, &problem));
  EXPECT_EQ(problem, "an envelope with unknown flags 128");

  // Four billion extensions claimed in a few bytes: refused when the bytes run out.
  bytes[0] = static_cast<char>(kEnvelopeExtensions);
  const uint32_t count = 0xffffffff;
  bytes.append(reinterpret_cast<const char*>(&count), 4);
  bytes.append(std::string(8, '\0'));  // one empty extension 0
  EXPECT_FALSE(decode_envelope(bytes, &received, &problem));
  EXPECT_EQ(problem, "an envelope whose extensions end early");
}

}  // namespace
}  // namespace drpc
