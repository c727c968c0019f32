// The call protocol's wire form: a request's function, arguments and keyword arguments
// (tensors beside them) come back as sent; what cannot travel is named; malformed bytes
// are a protocol error naming what was read.

#include "rpc/call_codec.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"

namespace drpc {
namespace {

TEST(CallCodec, ACallRoundTripsWithItsTensorsBesideIt) {
  std::string call;
  std::vector<at::Tensor> tensors;
  const at::Tensor t = at::arange(6, at::kFloat).reshape({2, 3});
  encode_call("my.fn", {t, int64_t{3}, std::string("s")}, {{"scale", 2.5}, {"w", t * 2}}, ValueHooks{}, &call,
              &tensors);
  EXPECT_EQ(call_function(call), "my.fn");
  EXPECT_EQ(tensors.size(), 2u);  // out of band, not inside the call's bytes
  EXPECT_LT(call.size(), 100u);
  std::string fn;
  std::vector<c10::IValue> args;
  Kwargs kwargs;
  decode_call(call, tensors, ValueHooks{}, &fn, &args, &kwargs);
  EXPECT_EQ(fn, "my.fn");
  ASSERT_EQ(args.size(), 3u);
  EXPECT_TRUE(at::equal(args[0].toTensor(), t));
  EXPECT_EQ(args[1].toInt(), 3);
  EXPECT_EQ(args[2].toStringRef(), "s");
  ASSERT_EQ(kwargs.size(), 2u);
  EXPECT_EQ(kwargs[0].first, "scale");
  EXPECT_EQ(kwargs[0].second.toDouble(), 2.5);
  EXPECT_EQ(kwargs[1].first, "w");
  EXPECT_TRUE(at::equal(kwargs[1].second.toTensor(), t * 2));
}

TEST(CallCodec, AnArgumentThatCannotTravelIsNamed) {
  std::string call;
  std::vector<at::Tensor> tensors;
  const c10::IValue device(c10::Device(c10::kCPU));
  try {
    encode_call("my.fn", {int64_t{1}}, {{"where", device}}, ValueHooks{}, &call, &tensors);
    FAIL() << "a device travelled";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    EXPECT_NE(std::string(e.what()).find("my.fn: kwarg where"), std::string::npos) << e.what();
  }
}

// The path is built only for the error, from pieces on the encoder's stack: every level
// of a nested argument must still be in it.
TEST(CallCodec, ANestedArgumentIsNamedByEveryLevel) {
  std::string call;
  std::vector<at::Tensor> tensors;
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("k", c10::IValue(c10::Device(c10::kCPU)));
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(c10::IValue(int64_t{0}));
  list.push_back(c10::ivalue::Tuple::create({c10::IValue("x"), c10::IValue(dict)}));
  try {
    encode_call("my.fn", {int64_t{1}, c10::IValue(list)}, {}, ValueHooks{}, &call, &tensors);
    FAIL() << "a device travelled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.fn: args[1][1][1][String]: a value of type Device"), std::string::npos)
        << e.what();
  }
  try {
    encode_result(0, c10::IValue(c10::Device(c10::kCPU)), ValuePath(std::string("my.fn"), ": result"), ValueHooks{});
    FAIL() << "a device travelled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.fn: result: a value of type Device"), std::string::npos) << e.what();
  }
}

TEST(CallCodec, AResultRoundTripsAndMalformedBytesAreAProtocolErrorNamingTheReply) {
  const Message reply = encode_result(7, c10::IValue(at::ones({4})), "fn: result", ValueHooks{});
  EXPECT_EQ(reply.type, 7);
  EXPECT_TRUE(at::equal(decode_result(reply, ValueHooks{}).toTensor(), at::ones({4})));
  Message bad{7, std::string("\xff\xff\xff", 3), {}};
  try {
    decode_result(bad, ValueHooks{}, "to_here reply");
    FAIL() << "malformed bytes decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
    EXPECT_EQ(e.message(), "malformed to_here reply: value of unknown kind 255");
  }
}

TEST(CallCodec, MalformedCallsAreProtocolErrors) {
  std::string call;
  std::vector<at::Tensor> tensors;
  encode_call("my.fn", {int64_t{1}}, {{"k", 2.0}}, ValueHooks{}, &call, &tensors);
  // Every cut is refused, and so is a byte past the end.
  for (size_t cut = 0; cut < call.size(); ++cut) {
    std::string fn;
    std::vector<c10::IValue> args;
    Kwargs kwargs;
    EXPECT_THROW(decode_call(call.substr(0, cut), tensors, ValueHooks{}, &fn, &args, &kwargs), Error) << cut;
  }
  std::string fn;
  std::vector<c10::IValue> args;
  Kwargs kwargs;
  try {
    decode_call(call + "x", tensors, ValueHooks{}, &fn, &args, &kwargs);
    FAIL() << "a call with a trailing byte decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
    EXPECT_EQ(e.message(), "1 byte(s) after the call");
  }
  EXPECT_THROW(call_function("ab"), Error);
}

}  // namespace
}  // namespace drpc
