// The optimizer protocol's spec: it crosses the wire by named fields, and a spec that is
// missing a field, has an unknown one or a mistyped one is refused, naming the field.

#include "dist_autograd/optimizer_protocol.h"

#include <gtest/gtest.h>

#include "rpc/value_codec.h"

namespace drpc {
namespace {

using optimizer_protocol::decode_spec;
using optimizer_protocol::encode_spec;

std::string error_of(const c10::IValue& value) {
  try {
    decode_spec(value);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    return e.what();
  }
  return "no error";
}

TEST(OptimizerProtocol, ASpecCrossesTheWireByNamedFields) {
  OptimizerSpec spec;
  spec.kind = "adam";
  spec.lr = 0.25;
  spec.beta1 = 0.5;
  spec.beta2 = 0.75;
  spec.eps = 1e-3;
  spec.weight_decay = 0.125;
  std::string wire;
  std::vector<at::Tensor> tensors;
  encode_value(encode_spec(spec), &wire, &tensors, "spec");
  const OptimizerSpec back = decode_spec(decode_value(wire, tensors));
  EXPECT_EQ(back.kind, "adam");
  EXPECT_EQ(back.lr, 0.25);
  EXPECT_EQ(back.momentum, 0);
  EXPECT_EQ(back.beta1, 0.5);
  EXPECT_EQ(back.beta2, 0.75);
  EXPECT_EQ(back.eps, 1e-3);
  EXPECT_EQ(back.weight_decay, 0.125);
}

TEST(OptimizerProtocol, ABadSpecIsRefusedNamingTheField) {
  auto spec = [] { return encode_spec(OptimizerSpec{}).toGenericDict(); };
  auto missing = spec();
  missing.erase("lr");
  EXPECT_NE(error_of(missing).find("no field 'lr'"), std::string::npos) << error_of(missing);
  auto unknown = spec();
  unknown.insert(std::string("nesterov"), true);
  EXPECT_NE(error_of(unknown).find("unknown optimizer spec field 'nesterov'"), std::string::npos);
  auto mistyped = spec();
  mistyped.insert_or_assign(std::string("momentum"), std::string("high"));
  EXPECT_NE(error_of(mistyped).find("'momentum' is a number"), std::string::npos) << error_of(mistyped);
  auto integer = spec();
  integer.insert_or_assign(std::string("lr"), int64_t{1});  // an int is a number too
  EXPECT_EQ(decode_spec(integer).lr, 1.0);
  EXPECT_NE(error_of(c10::IValue(int64_t{3})).find("dict"), std::string::npos);
}

}  // namespace
}  // namespace drpc
