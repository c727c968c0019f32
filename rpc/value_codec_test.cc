#include "rpc/value_codec.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "common/error.h"

// The largest single allocation made through operator new, for the test that a hostile
// count cannot make the decoder reserve what the bytes do not hold.
static std::atomic<size_t> largest_new{0};

void* operator new(size_t size) {
  size_t seen = largest_new.load();
  while (size > seen && !largest_new.compare_exchange_weak(seen, size)) {
  }
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace drpc {
namespace {

c10::IValue round_trip(const c10::IValue& value, size_t* tensor_count = nullptr) {
  std::string encoded;
  std::vector<at::Tensor> tensors;
  encode_value(value, &encoded, &tensors, "value");
  if (tensor_count) *tensor_count = tensors.size();
  return decode_value(encoded, tensors);
}

// The error decoding `bytes` throws, or kInternal with an empty message for none.
Error decode_error(const std::string& bytes, const std::vector<at::Tensor>& tensors = {}) {
  try {
    decode_value(bytes, tensors);
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::kInternal, "");
}

std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

TEST(ValueCodec, Scalars) {
  EXPECT_TRUE(round_trip(c10::IValue()).isNone());
  EXPECT_EQ(round_trip(true).toBool(), true);
  EXPECT_EQ(round_trip(int64_t{-7}).toInt(), -7);
  EXPECT_EQ(round_trip(2.5).toDouble(), 2.5);
  EXPECT_EQ(round_trip(std::string("hé\0llo", 7)).toStringRef(), std::string("hé\0llo", 7));
  // Not UTF-8: a receiver parsing a proto3 `string` field would reject the whole message.
  const std::string binary("\xff\xfe\x80 raw", 7);
  EXPECT_EQ(round_trip(binary).toStringRef(), binary);
  EXPECT_EQ(round_trip(c10::List<std::string>({binary})).toList().get(0).toStringRef(), binary);
  EXPECT_EQ(round_trip(c10::complex<double>(1, -2)).toComplexDouble(), c10::complex<double>(1, -2));
}

TEST(ValueCodec, TensorsOfEveryDtypeKeepValuesShapeAndDtype) {
  for (auto dtype : {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble, at::kChar, at::kShort, at::kInt, at::kLong,
                     at::kByte, at::kBool, at::kComplexFloat}) {
    at::Tensor t = at::arange(12).reshape({3, 4}).to(dtype);
    at::Tensor back = round_trip(t).toTensor();
    EXPECT_EQ(back.scalar_type(), dtype);
    EXPECT_EQ(back.sizes(), t.sizes());
    EXPECT_TRUE(at::equal(back, t)) << c10::toString(dtype);
  }
  at::Tensor empty = at::empty({0, 3});
  EXPECT_EQ(round_trip(empty).toTensor().sizes(), empty.sizes());
}

TEST(ValueCodec, ViewsSendOnlyTheirOwnElements) {
  at::Tensor big = at::arange(100, at::kFloat);
  std::string encoded;
  std::vector<at::Tensor> tensors;
  encode_value(big.narrow(0, 10, 5), &encoded, &tensors, "v");
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].nbytes(), 5 * sizeof(float));
  at::Tensor transposed = big.reshape({10, 10}).t();
  EXPECT_TRUE(at::equal(round_trip(transposed).toTensor(), transposed));
}

TEST(ValueCodec, ContainersKeepTheirTypes) {
  c10::List<int64_t> ints({1, 2, 3});
  auto back = round_trip(ints);
  ASSERT_TRUE(back.isIntList());
  EXPECT_EQ(back.toIntVector(), std::vector<int64_t>({1, 2, 3}));
  EXPECT_TRUE(round_trip(c10::List<double>({1.5})).isDoubleList());
  EXPECT_TRUE(round_trip(c10::List<at::Tensor>({at::ones({1})})).isTensorList());
  EXPECT_TRUE(round_trip(c10::List<int64_t>()).isIntList());  // empty keeps its type

  auto tuple = c10::ivalue::Tuple::create({c10::IValue(int64_t{1}), c10::IValue("x"), c10::IValue(at::ones({2}))});
  auto t = round_trip(tuple).toTupleRef().elements();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[1].toStringRef(), "x");

  c10::Dict<std::string, at::Tensor> dict;
  dict.insert("w", at::full({2}, 3.0));
  auto d = round_trip(dict).toGenericDict();
  EXPECT_TRUE(at::equal(d.at("w").toTensor(), at::full({2}, 3.0)));

  c10::impl::GenericList nested(c10::AnyType::get());
  nested.push_back(c10::List<int64_t>({4}));
  nested.push_back(c10::IValue());
  auto n = round_trip(nested).toList();
  EXPECT_EQ(n.get(0).toIntVector(), std::vector<int64_t>({4}));
  EXPECT_TRUE(n.get(1).isNone());
}

TEST(ValueCodec, TheSameTensorTwiceTravelsTwice) {
  at::Tensor t = at::ones({2});
  size_t count = 0;
  round_trip(c10::ivalue::Tuple::create({c10::IValue(t), c10::IValue(t)}), &count);
  EXPECT_EQ(count, 2u);
}

TEST(ValueCodec, ScalarsAndContainersAreAKindByteAndTheirBytes) {
  std::string encoded;
  std::vector<at::Tensor> tensors;
  encode_value(c10::ivalue::Tuple::create({c10::IValue(int64_t{5}), c10::IValue(at::ones({2})), c10::IValue("ab")}),
               &encoded, &tensors, "v");
  // tuple, count 3; int 5; tensor 0; str "ab".
  const int64_t five = 5;
  EXPECT_EQ(encoded, std::string(1, '\x09') + u32(3) + '\x03' + std::string(reinterpret_cast<const char*>(&five), 8) +
                         '\x07' + u32(0) + '\x06' + u32(2) + "ab");
}

TEST(ValueCodec, MalformedInputIsAProtocolErrorNamingWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "a value is cut short"},
      {std::string(1, '\x03') + "1234", "an int is cut short"},
      {std::string(1, '\x07') + u32(3), "tensor index 3 out of range (1 tensors arrived)"},
      {std::string(1, '\x06') + u32(100) + "abc", "a str claims 100 bytes but 3 are left"},
      {std::string(1, '\x09') + u32(0xffffffff), "a tuple claims 4294967295 items but 0 bytes are left"},
      {std::string(1, '\x0a') + u32(2) + std::string(2, '\0'), "a dict claims 2 items but 2 bytes are left"},
      {std::string(1, '\x08') + '\x01' + u32(1) + '\x02', "a int list holds another kind of value"},
      {std::string(1, '\x08') + '\x09' + u32(0), "a list of unknown element kind 9"},
      {std::string(1, '\x0a') + u32(1) + '\x00' + '\x00', "unsupported dict key"},
      {std::string(1, '\x0a') + u32(2) + '\x03' + std::string(8, '\0') + '\x00' + '\x06' + u32(0) + '\x00',
       "dict keys of mixed kinds"},
      {std::string(1, '\x0b') + u32(1) + "x", "an RRef arrived but RRefs are not enabled"},
      {std::string(1, '\x63'), "value of unknown kind 99"},
      {std::string(2, '\x00'), "1 byte(s) after the value"},
  };
  for (const auto& [bytes, message] : cases) {
    const Error e = decode_error(bytes, {at::ones({1})});
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol) << message;
    EXPECT_EQ(e.message(), message);
  }
  // A list in a list 100 deep.
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += std::string(1, '\x08') + '\x00' + u32(1);
  deep += '\x00';
  EXPECT_EQ(decode_error(deep).message(), "value nested deeper than 64 levels");
}

// Every level of a nested list checks its count against the bytes left, which the levels
// share: reserving each level's whole claim would multiply them.
TEST(ValueCodec, NestedCountsCannotMakeTheDecoderReserveMoreThanTheBytesHold) {
  const int levels = 64;
  const size_t padding = 1 << 20;
  std::string bytes;
  for (int i = 0; i < levels; ++i) {
    const size_t left_after = (levels - i - 1) * 6 + 1 + padding;
    bytes += std::string(1, '\x08') + '\x00' + u32(static_cast<uint32_t>(left_after));
  }
  bytes += '\x63';  // the innermost list's first item: a kind that does not exist
  bytes += std::string(padding, '\0');
  largest_new = 0;
  const Error e = decode_error(bytes);
  EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  EXPECT_EQ(e.message(), "value of unknown kind 99");
  EXPECT_LT(largest_new.load(), size_t{64} << 10) << "a count's claim was reserved";
}

TEST(ValueCodec, WhatCannotTravelIsABadArgumentNamingWhere) {
  std::string out;
  std::vector<at::Tensor> tensors;
  at::Tensor sparse = at::ones({2, 2}).to_sparse();
  try {
    encode_value(c10::List<at::Tensor>({at::ones({1}), sparse}), &out, &tensors, "args[0]");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    EXPECT_NE(std::string(e.what()).find("args[0][1]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace drpc
