#include "rpc/value_codec.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"

namespace drpc {
namespace {

c10::IValue round_trip(const c10::IValue& value, size_t* tensor_count = nullptr) {
  rpc::Value encoded;
  std::vector<at::Tensor> tensors;
  encode_value(value, &encoded, &tensors, "value");
  if (tensor_count) *tensor_count = tensors.size();
  rpc::Value parsed;
  EXPECT_TRUE(parsed.ParseFromString(encoded.SerializeAsString()));
  return decode_value(parsed, tensors);
}

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
  rpc::Value encoded;
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

TEST(ValueCodec, MalformedInputIsAProtocolError) {
  rpc::Value bad;
  bad.set_tensor(3);
  try {
    decode_value(bad, {at::ones({1})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
    EXPECT_NE(std::string(e.what()).find("index 3"), std::string::npos) << e.what();
  }
  rpc::Value deep;
  rpc::Value* cur = &deep;
  for (int i = 0; i < 100; ++i) cur = cur->mutable_list()->add_items();
  cur->set_none(true);
  try {
    decode_value(deep, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
  }
  rpc::Value rref;
  rref.set_rref("x");
  EXPECT_THROW(decode_value(rref, {}), Error);
}

TEST(ValueCodec, WhatCannotTravelIsABadArgumentNamingWhere) {
  rpc::Value out;
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
