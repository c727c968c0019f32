#include "rpc/call_codec.h"

#include "common/error.h"

namespace drpc {

void encode_call(const std::string& fn, const std::vector<c10::IValue>& args, const Kwargs& kwargs,
                 const ValueHooks& hooks, rpc::Call* call, std::vector<at::Tensor>* tensors) {
  call->set_function(fn);
  for (size_t i = 0; i < args.size(); ++i) {
    encode_value(args[i], call->add_args(), tensors, ValuePath(fn, ": args", i), &hooks);
  }
  for (const auto& [name, value] : kwargs) {
    rpc::Kwarg* kw = call->add_kwargs();
    kw->set_name(name);
    encode_value(value, kw->mutable_value(), tensors, ValuePath(fn, ": kwarg ", name), &hooks);
  }
}

void decode_call(const rpc::Call& call, const std::vector<at::Tensor>& tensors, const ValueHooks& hooks,
                 std::vector<c10::IValue>* args, Kwargs* kwargs) {
  for (const auto& v : call.args()) args->push_back(decode_value(v, tensors, &hooks));
  for (const auto& kw : call.kwargs()) kwargs->emplace_back(kw.name(), decode_value(kw.value(), tensors, &hooks));
}

Message encode_result(int32_t type, const c10::IValue& value, const ValuePath& what, const ValueHooks& hooks) {
  Message reply{type, "", {}};
  rpc::Value encoded;
  encode_value(value, &encoded, &reply.tensors, what, &hooks);
  reply.payload = encoded.SerializeAsString();
  return reply;
}

c10::IValue decode_result(const Message& reply, const ValueHooks& hooks, const char* what) {
  rpc::Value value;
  if (!value.ParseFromString(reply.payload)) throw Error(ErrorKind::kProtocol, std::string("malformed ") + what);
  return decode_value(value, reply.tensors, &hooks);
}

}  // namespace drpc
