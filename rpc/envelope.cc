#include "rpc/envelope.h"

#include "common/error_wire.h"
#include "rpc/rpc_agent.h"
#include "rpc/value_codec.h"

namespace drpc {

namespace {

constexpr uint8_t kEnvelopeFlags =
    kEnvelopeResponse | kEnvelopeProfile | kEnvelopeError | kEnvelopeExtensions | kEnvelopeProfileSpans;

}  // namespace

std::string encode_envelope(rpc::Envelope& envelope) {
  const bool error = envelope.error_kind() != drpc::wire::ERROR_KIND_NONE || !envelope.error().empty();
  const uint8_t flags = (envelope.is_response() ? kEnvelopeResponse : 0) | (envelope.profile() ? kEnvelopeProfile : 0) |
                        (error ? kEnvelopeError : 0) | (envelope.extensions().empty() ? 0 : kEnvelopeExtensions) |
                        (envelope.has_profile_spans() ? kEnvelopeProfileSpans : 0);
  size_t size = 1 + 4 + 8 + 4 + envelope.what().size() + envelope.payload().size();
  if (error) size += 4 + 4 + envelope.error().size();
  for (const auto& [id, bytes] : envelope.extensions()) size += 4 + 4 + bytes.size();
  const std::string spans = envelope.has_profile_spans() ? envelope.profile_spans().SerializeAsString() : "";
  size += envelope.extensions().empty() ? 0 : 4;
  size += envelope.has_profile_spans() ? 4 + spans.size() : 0;
  std::string out;
  out.reserve(size);
  encode_fixed(flags, &out);
  encode_fixed(envelope.type(), &out);
  encode_fixed(envelope.id(), &out);
  encode_bytes(envelope.what(), &out);
  if (error) {
    encode_fixed(static_cast<int32_t>(envelope.error_kind()), &out);
    encode_bytes(envelope.error(), &out);
  }
  if (!envelope.extensions().empty()) {
    encode_count(envelope.extensions().size(), &out);
    for (const auto& [id, bytes] : envelope.extensions()) {
      encode_fixed(id, &out);
      encode_bytes(bytes, &out);
    }
  }
  if (envelope.has_profile_spans()) encode_bytes(spans, &out);
  out += envelope.payload();
  envelope.clear_payload();
  return out;
}

bool decode_envelope(std::string bytes, rpc::Envelope* envelope, std::string* problem) {
  ValueReader in(bytes);
  // What a field cut short means, for the part being read.
  const char* part = "an envelope shorter than its fixed fields";
  try {
    const auto flags = in.fixed<uint8_t>("flags");
    envelope->set_type(in.fixed<int32_t>("type"));
    envelope->set_id(in.fixed<int64_t>("id"));
    std::string what = in.bytes("what");
    if (flags & ~kEnvelopeFlags) {
      *problem = "an envelope with unknown flags " + std::to_string(flags);
      return false;
    }
    envelope->set_is_response(flags & kEnvelopeResponse);
    envelope->set_profile(flags & kEnvelopeProfile);
    if (!what.empty()) envelope->set_what(std::move(what));  // an empty field allocates nothing, as in a parse
    if (flags & kEnvelopeError) {
      part = "an envelope whose error ends early";
      envelope->set_error_kind(static_cast<drpc::wire::ErrorKind>(in.fixed<int32_t>("error kind")));
      envelope->set_error(in.bytes("error"));
    }
    if (flags & kEnvelopeExtensions) {
      part = "an envelope whose extensions end early";
      const uint32_t count = in.count(8, "extensions");
      for (uint32_t i = 0; i < count; ++i) {
        const auto extension = in.fixed<int32_t>("extension id");
        (*envelope->mutable_extensions())[extension] = in.bytes("extension");
      }
    }
    if (flags & kEnvelopeProfileSpans) {
      part = "an envelope with malformed profile spans";
      if (!envelope->mutable_profile_spans()->ParseFromString(in.bytes("profile spans"))) {
        *problem = part;
        return false;
      }
    }
  } catch (const Error&) {
    *problem = part;
    return false;
  }
  bytes.erase(0, bytes.size() - in.left());  // the payload, in the buffer it arrived in
  envelope->set_payload(std::move(bytes));
  return true;
}

std::string encode_with(rpc::Envelope& envelope, Message& message) {
  // Upper layers' headers travel opaquely.
  for (const auto& [id, bytes] : message.extensions) (*envelope.mutable_extensions())[id] = bytes;
  envelope.set_payload(std::move(message.payload));
  return encode_envelope(envelope);
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
  return encode_envelope(envelope);
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
