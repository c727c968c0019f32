#include "rpc/envelope.h"

#include "common/error_wire.h"
#include "rpc/rpc_agent.h"

namespace drpc {

std::string encode_with(rpc::Envelope& envelope, Message& message) {
  // Upper layers' headers travel opaquely.
  for (const auto& [id, bytes] : message.extensions) (*envelope.mutable_extensions())[id] = bytes;
  envelope.set_payload(std::move(message.payload));
  return envelope.SerializeAsString();
}

std::string encode_request(int64_t id, const std::string& label, bool profiled, Message& message) {
  rpc::Envelope envelope;
  envelope.set_type(message.type);
  envelope.set_id(id);
  envelope.set_what(label);
  if (profiled) envelope.set_profile(true);
  return encode_with(envelope, message);
}

std::string encode_control(int32_t type, std::string payload) {
  rpc::Envelope envelope;
  envelope.set_type(type);
  envelope.set_payload(std::move(payload));
  return envelope.SerializeAsString();
}

rpc::Envelope reply_envelope(int64_t id, c10::ivalue::Future& done, const Extensions& request_extensions,
                             Message* reply) {
  rpc::Envelope envelope;
  envelope.set_id(id);
  envelope.set_is_response(true);
  if (done.hasError()) {
    put_error(done.exception_ptr(), &envelope);
    return envelope;
  }
  try {
    *reply = message_from_ivalue(done.value());
    envelope.set_type(reply->type);
    reply->extensions.insert(request_extensions.begin(), request_extensions.end());  // keeps its own
  } catch (const Error&) {
    put_error(std::current_exception(), &envelope);
  }
  return envelope;
}

Message take_message(rpc::Envelope& envelope, std::vector<at::Tensor> tensors) {
  Message message{envelope.type(), std::move(*envelope.mutable_payload()), std::move(tensors)};
  for (auto& [id, bytes] : *envelope.mutable_extensions()) message.extensions.emplace(id, std::move(bytes));
  return message;
}

void put_error(const std::exception_ptr& error, rpc::Envelope* envelope) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& err) {
    envelope->set_error_kind(to_wire(err.kind()));
    envelope->set_error(err.message());
  } catch (const std::exception& err) {
    envelope->set_error_kind(to_wire(ErrorKind::kRemote));
    envelope->set_error(err.what());
  }
}

ErrorKind kind_of(const rpc::Envelope& envelope) { return from_wire(envelope.error_kind()); }

int64_t tensor_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return n;
}

}  // namespace drpc
