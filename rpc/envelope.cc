#include "rpc/envelope.h"

#include <cstring>

#include "common/error_wire.h"
#include "rpc/rpc_agent.h"

namespace drpc {

namespace {

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);  // little-endian hosts only
}

void put_bytes(std::string& out, const std::string& bytes) {
  put(out, static_cast<uint32_t>(bytes.size()));
  out += bytes;
}

// Reads the flat fields in order, each bounded by what is left.
class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}

  template <typename T>
  bool get(T* value) {
    if (bytes_.size() - at_ < sizeof(T)) return false;
    std::memcpy(value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  // A length-prefixed field, as a pointer into the bytes and its size.
  bool get_bytes(const char** data, size_t* size) {
    uint32_t length = 0;
    if (!get(&length) || bytes_.size() - at_ < length) return false;
    *data = bytes_.data() + at_;
    *size = length;
    at_ += length;
    return true;
  }
  size_t at() const { return at_; }

 private:
  const std::string& bytes_;
  size_t at_ = 0;
};

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
  put(out, flags);
  put(out, envelope.type());
  put(out, envelope.id());
  put_bytes(out, envelope.what());
  if (error) {
    put(out, static_cast<int32_t>(envelope.error_kind()));
    put_bytes(out, envelope.error());
  }
  if (!envelope.extensions().empty()) {
    put(out, static_cast<uint32_t>(envelope.extensions().size()));
    for (const auto& [id, bytes] : envelope.extensions()) {
      put(out, id);
      put_bytes(out, bytes);
    }
  }
  if (envelope.has_profile_spans()) put_bytes(out, spans);
  out += envelope.payload();
  envelope.clear_payload();
  return out;
}

bool decode_envelope(std::string bytes, rpc::Envelope* envelope, std::string* problem) {
  Reader in(bytes);
  uint8_t flags = 0;
  int32_t type = 0;
  int64_t id = 0;
  const char* data = nullptr;
  size_t size = 0;
  if (!in.get(&flags) || !in.get(&type) || !in.get(&id) || !in.get_bytes(&data, &size)) {
    *problem = "an envelope shorter than its fixed fields";
    return false;
  }
  if (flags & ~kEnvelopeFlags) {
    *problem = "an envelope with unknown flags " + std::to_string(flags);
    return false;
  }
  envelope->set_type(type);
  envelope->set_id(id);
  envelope->set_is_response(flags & kEnvelopeResponse);
  envelope->set_profile(flags & kEnvelopeProfile);
  if (size > 0) envelope->set_what(data, size);  // an empty field allocates nothing, as in a parse
  if (flags & kEnvelopeError) {
    int32_t kind = 0;
    if (!in.get(&kind) || !in.get_bytes(&data, &size)) {
      *problem = "an envelope whose error ends early";
      return false;
    }
    envelope->set_error_kind(static_cast<drpc::wire::ErrorKind>(kind));
    envelope->set_error(data, size);
  }
  if (flags & kEnvelopeExtensions) {
    uint32_t count = 0;
    if (!in.get(&count)) {
      *problem = "an envelope whose extensions end early";
      return false;
    }
    for (uint32_t i = 0; i < count; ++i) {  // each takes at least 8 bytes: bounded by the size
      int32_t extension = 0;
      if (!in.get(&extension) || !in.get_bytes(&data, &size)) {
        *problem = "an envelope whose extensions end early";
        return false;
      }
      (*envelope->mutable_extensions())[extension].assign(data, size);
    }
  }
  if (flags & kEnvelopeProfileSpans) {
    if (!in.get_bytes(&data, &size) || !envelope->mutable_profile_spans()->ParseFromArray(data, static_cast<int>(size))) {
      *problem = "an envelope with malformed profile spans";
      return false;
    }
  }
  bytes.erase(0, in.at());  // the payload, in the buffer it arrived in
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
