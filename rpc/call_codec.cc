#include "rpc/call_codec.h"

#include <algorithm>

#include "common/error.h"

namespace drpc {

void encode_call(const std::string& fn, const std::vector<c10::IValue>& args, const Kwargs& kwargs,
                 const ValueHooks& hooks, std::string* out, std::vector<at::Tensor>* tensors) {
  encode_bytes(fn, out);
  encode_count(args.size(), out);
  for (size_t i = 0; i < args.size(); ++i) encode_value(args[i], out, tensors, ValuePath(fn, ": args", i), &hooks);
  encode_count(kwargs.size(), out);
  for (const auto& [name, value] : kwargs) {
    encode_bytes(name, out);
    encode_value(value, out, tensors, ValuePath(fn, ": kwarg ", name), &hooks);
  }
}

std::string call_function(const std::string& call) {
  ValueReader in(call);
  return in.bytes("a call's function");
}

void decode_call(const std::string& call, const std::vector<at::Tensor>& tensors, const ValueHooks& hooks,
                 std::string* fn, std::vector<c10::IValue>* args, Kwargs* kwargs) {
  ValueReader in(call);
  *fn = in.bytes("a call's function");
  const uint32_t n_args = in.count(1, "a call's arguments");
  args->reserve(args->size() + std::min<uint32_t>(n_args, 64));  // not what a hostile count claims
  for (uint32_t i = 0; i < n_args; ++i) args->push_back(in.value(tensors, &hooks));
  const uint32_t n_kwargs = in.count(5, "a call's keyword arguments");
  for (uint32_t i = 0; i < n_kwargs; ++i) {
    std::string name = in.bytes("a keyword argument's name");
    kwargs->emplace_back(std::move(name), in.value(tensors, &hooks));
  }
  in.expect_end("the call");
}

Message encode_result(int32_t type, const c10::IValue& value, const ValuePath& what, const ValueHooks& hooks) {
  Message reply{type, "", {}};
  encode_value(value, &reply.payload, &reply.tensors, what, &hooks);
  return reply;
}

c10::IValue decode_result(const Message& reply, const ValueHooks& hooks, const char* what) {
  try {
    return decode_value(reply.payload, reply.tensors, &hooks);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kProtocol) throw;
    throw Error(ErrorKind::kProtocol, std::string("malformed ") + what + ": " + e.message());
  }
}

}  // namespace drpc
