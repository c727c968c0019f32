// FunctionRegistry's builtin operators: overloads chosen by the arguments, also when the
// choice is remembered for arguments of the same kinds.

#include "rpc/function_registry.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

namespace drpc {
namespace {

c10::IValue call(const FunctionRegistry& registry, const std::string& name, std::vector<c10::IValue> args,
                 std::vector<std::pair<std::string, c10::IValue>> kwargs = {}) {
  FuturePtr f = registry.call(name, CallArgs{std::move(args), std::move(kwargs)}, "here");
  f->wait();
  if (f->hasError()) std::rethrow_exception(f->exception_ptr());
  return f->value();
}

// Alternating argument kinds under one name pick each kind's overload every time: the
// remembered choice for one kind never serves another.
TEST(FunctionRegistryBuiltins, EachArgumentKindKeepsItsOwnOverload) {
  FunctionRegistry registry;
  const at::Tensor a = at::tensor({1.0, 2.0}), b = at::tensor({10.0, 20.0});
  for (int round = 0; round < 3; ++round) {
    EXPECT_TRUE(at::equal(call(registry, "aten::add", {a, b}).toTensor(), a + b));
    EXPECT_TRUE(at::equal(call(registry, "aten::add", {a, 3.5}).toTensor(), a + 3.5));    // Tensor, Scalar
    EXPECT_TRUE(at::equal(call(registry, "aten::add", {a, int64_t{2}}).toTensor(), a + 2));
    EXPECT_EQ(call(registry, "aten::add", {int64_t{2}, int64_t{3}}).toInt(), 5);           // int, int
    EXPECT_DOUBLE_EQ(call(registry, "aten::add", {1.5, 2.0}).toDouble(), 3.5);             // float, float
    EXPECT_EQ(call(registry, "aten::add", {std::string("a"), std::string("b")}).toStringRef(), "ab");
    EXPECT_TRUE(at::equal(call(registry, "aten::add", {a, b}, {{"alpha", int64_t{2}}}).toTensor(), a + 2 * b));
  }
}

// A choice that needed conversions (one int for an int[2] list) converts again each time.
TEST(FunctionRegistryBuiltins, ARememberedChoiceStillConvertsItsArguments) {
  FunctionRegistry registry;
  const at::Tensor x = at::arange(16, at::kFloat).reshape({1, 1, 4, 4});
  for (int round = 0; round < 3; ++round) {
    const at::Tensor y = call(registry, "aten::max_pool2d", {x, int64_t{2}}).toTensor();
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 1, 2, 2}));
    EXPECT_TRUE(at::equal(y, at::max_pool2d(x, {2, 2})));
  }
}

// Arguments that fit no overload are refused every time, also after the same name served
// other kinds; kinds that are not remembered (tuples) are resolved each time.
TEST(FunctionRegistryBuiltins, MisfitsAreRefusedEveryTime) {
  FunctionRegistry registry;
  const at::Tensor a = at::tensor({1.0, 2.0});
  for (int round = 0; round < 2; ++round) {
    EXPECT_TRUE(at::equal(call(registry, "aten::add", {a, a}).toTensor(), a + a));
    try {
      call(registry, "aten::add", {a, std::string("x")});
      ADD_FAILURE() << "aten::add(Tensor, str) ran";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
      EXPECT_NE(std::string(e.what()).find("no overload of aten::add takes (Tensor, str)"), std::string::npos)
          << e.what();
    }
    auto t = c10::ivalue::Tuple::create({a, a});
    EXPECT_THROW(call(registry, "aten::add", {t, a}), Error);
  }
}

}  // namespace
}  // namespace drpc
