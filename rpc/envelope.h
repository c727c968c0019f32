#pragma once

// The agent's wire format: how a Message travels as an rpc::Envelope (the header) beside
// its tensors, and how a handler's result or exception becomes a reply envelope. Part of
// the agent's implementation (rpc/process_group_agent.cc, rpc/request_server.cc).
//
// An envelope travels flat, its payload last and never copied into a nested field (the
// process group puts the whole header after its own flat one, see
// process_group/transport.h), all integers little-endian:
//   [u8 flags][i32 type][i64 id][u32 length][what]
//   flags & kEnvelopeError:        [i32 error kind][u32 length][error]
//   flags & kEnvelopeExtensions:   [u32 count], per extension [i32 id][u32 length][bytes]
//   flags & kEnvelopeProfileSpans: [u32 length][rpc::Profile]
//   then the payload, to the end.
// kEnvelopeResponse and kEnvelopeProfile are the two booleans.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "common/error.h"
#include "rpc/message.h"
#include "rpc/proto/rpc.pb.h"

namespace drpc {

constexpr uint8_t kEnvelopeResponse = 1;
constexpr uint8_t kEnvelopeProfile = 2;
constexpr uint8_t kEnvelopeError = 4;
constexpr uint8_t kEnvelopeExtensions = 8;
constexpr uint8_t kEnvelopeProfileSpans = 16;

// `envelope` in the flat format above; its payload is moved out.
std::string encode_envelope(rpc::Envelope& envelope);

// Reads a flat envelope from `bytes` (whose buffer becomes its payload). Returns false, with
// `problem` set, when the bytes are not one: unknown flags, or a field past their end.
bool decode_envelope(std::string bytes, rpc::Envelope* envelope, std::string* problem);

// The serialized header of request `id`: `message`'s type, payload (moved out) and
// extensions, the caller's `label` for the callee's metrics, and whether it is `profiled`.
std::string encode_request(int64_t id, const std::string& label, bool profiled, Message& message);

// The header of a message outside the call protocol (the join's): type and payload only.
std::string encode_control(int32_t type, std::string payload);

// Moves `message`'s payload and extensions into `envelope` and serializes it.
std::string encode_with(rpc::Envelope& envelope, Message& message);

// The reply to request `id` whose handler's future is `done`: its value's type in the
// envelope and the value (with `request_extensions` it does not set itself) in `reply`,
// or its error. A result that is not a Message is the handler's bug, told to its caller.
rpc::Envelope reply_envelope(int64_t id, c10::ivalue::Future& done, const Extensions& request_extensions,
                             Message* reply);

// Moves the envelope's payload and extensions into a Message with `tensors`.
Message take_message(rpc::Envelope& envelope, std::vector<at::Tensor> tensors);

// An exception as an error reply: drpc's Errors keep their kind, anything else is kRemote.
void put_error(const std::exception_ptr& error, rpc::Envelope* envelope);

// The error kind a reply carries (kNone... as from_wire maps it).
ErrorKind kind_of(const rpc::Envelope& envelope);

// Bytes of the defined tensors, for the byte metrics.
int64_t tensor_bytes(const std::vector<at::Tensor>& tensors);

}  // namespace drpc
