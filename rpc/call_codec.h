#pragma once

// The call protocol's wire form, in one place for every layer that sends calls (the
// Runtime's rpc_sync/rpc_async, the RRef layer's remote and RRef method calls): a request
// names a function and carries its positional and keyword arguments, a reply carries one
// value, both flat (value_codec.h); tensors travel beside them, in the Message. RRefs
// inside values cross through `hooks`.
//
// A call: [u32 length][function][u32 count][args][u32 count][count x ([u32 length][name][value])].

#include <ATen/core/ivalue.h>

#include <string>
#include <utility>
#include <vector>

#include "rpc/message.h"
#include "rpc/value_codec.h"

namespace drpc {

using Kwargs = std::vector<std::pair<std::string, c10::IValue>>;

// Appends the call to `out` (and the arguments' tensors to `tensors`). Throws
// Error(kBadArgument) naming the argument that cannot travel ("fn: args[1]", "fn: kwarg scale").
void encode_call(const std::string& fn, const std::vector<c10::IValue>& args, const Kwargs& kwargs,
                 const ValueHooks& hooks, std::string* out, std::vector<at::Tensor>* tensors);

// The function a call names, read without its arguments. Throws Error(kProtocol) when the
// bytes are too short to name one.
std::string call_function(const std::string& call);

// The function and arguments of `call` (all its bytes), whose tensors are `tensors`. Throws
// Error(kProtocol) on malformed input.
void decode_call(const std::string& call, const std::vector<at::Tensor>& tensors, const ValueHooks& hooks,
                 std::string* fn, std::vector<c10::IValue>* args, Kwargs* kwargs);

// A reply of `type` carrying `value`; `what` names it in errors ("fn: result").
Message encode_result(int32_t type, const c10::IValue& value, const ValuePath& what, const ValueHooks& hooks);

// The value of a reply made by encode_result. Throws Error(kProtocol) naming `what` ("to_here
// reply") when its bytes are not one.
c10::IValue decode_result(const Message& reply, const ValueHooks& hooks, const char* what = "reply");

}  // namespace drpc
