// The value codec (rpc/value_codec.cc) on hostile bytes: they decode or are a kProtocol
// error; what decodes can be sent again (the encoder takes every value the decoder makes)
// and a second trip changes nothing.

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>

#include <cstdint>

#include "common/error.h"
#include "fuzz/check.h"
#include "rpc/value_codec.h"

namespace {

using drpc::Error;
using drpc::ErrorKind;

// The tensors a message brought with it (indices 0..3).
const std::vector<at::Tensor>& arrived() {
  static const std::vector<at::Tensor> tensors = {at::ones({2, 3}), at::arange(4, at::kLong),
                                                  at::ones({}, at::kBool), at::empty({0}, at::kDouble)};
  return tensors;
}

std::string encode(const c10::IValue& value, std::vector<at::Tensor>* tensors) {
  std::string out;
  try {
    drpc::encode_value(value, &out, tensors, "decoded");
  } catch (const Error& e) {
    FUZZ_CHECK(false, "a decoded value cannot be sent: " + std::string(e.what()));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string value(reinterpret_cast<const char*>(data), size);
  c10::IValue decoded;
  try {
    decoded = drpc::decode_value(value, arrived());
  } catch (const Error& e) {
    FUZZ_CHECK(e.kind() == ErrorKind::kProtocol, e.what());
    return 0;
  }
  std::vector<at::Tensor> tensors;
  const std::string once = encode(decoded, &tensors);
  c10::IValue again;
  try {
    again = drpc::decode_value(once, tensors);
  } catch (const Error& e) {
    FUZZ_CHECK(false, "an encoded value does not decode: " + std::string(e.what()));
  }
  std::vector<at::Tensor> tensors_again;
  FUZZ_CHECK(encode(again, &tensors_again) == once, "a second trip changed the value");
  FUZZ_CHECK(tensors_again.size() == tensors.size(), "a second trip changed the tensor count");
  return 0;
}
