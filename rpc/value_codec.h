#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <vector>

#include "rpc/proto/rpc.pb.h"

namespace drpc {

// How values the RPC layer does not know itself (RRefs) cross the wire: the RRef layer
// supplies these. Either may be empty.
struct ValueHooks {
  // Returns true and fills `bytes` if it encodes `value`.
  std::function<bool(const c10::IValue& value, std::string* bytes)> encode_custom;
  // Turns bytes written by encode_custom back into a value.
  std::function<c10::IValue(const std::string& bytes)> decode_custom;
};

// Encodes `value` into `out`; its tensors are appended to `tensors` (contiguous; a view
// contributes only its own elements) and referred to by index. Supports None, bool, int,
// double, complex, string, dense CPU tensors of every dtype, lists, tuples and dicts, nested.
// Throws Error(kBadArgument) naming what cannot travel and where (`path`, e.g. "args[1]").
void encode_value(const c10::IValue& value, rpc::Value* out, std::vector<at::Tensor>* tensors,
                  const std::string& path, const ValueHooks* hooks = nullptr);

// The inverse. Lists come back typed (int[], float[], bool[], Tensor[], str[]) when the
// sender's were. Throws Error(kProtocol) on malformed input (bad tensor index, nesting
// deeper than 64 levels, unknown kinds).
c10::IValue decode_value(const rpc::Value& in, const std::vector<at::Tensor>& tensors,
                         const ValueHooks* hooks = nullptr);

}  // namespace drpc
