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

// Where a value sits in a call ("aten::add: args[1][0]"), for the error that names it. The
// text is built only when an error needs it: a path is a few pointers into its parent and
// its strings, which must outlive it (it lives on the encoder's stack, for one call).
class ValuePath {
 public:
  ValuePath(const std::string& text) : head_(&text) {}  // NOLINT: a whole text is a path
  ValuePath(const char* text) : part_(text) {}          // NOLINT
  // "<head><part>", then "<name>" or "[<index>]" when given.
  ValuePath(const std::string& head, const char* part) : head_(&head), part_(part) {}
  ValuePath(const std::string& head, const char* part, const std::string& name)
      : head_(&head), part_(part), name_(&name) {}
  ValuePath(const std::string& head, const char* part, size_t index) : head_(&head), part_(part), index_(index) {}

  ValuePath item(size_t index) const;                 // "<this>[<index>]"
  ValuePath key() const;                              // "<this>.key"
  ValuePath value_at(const c10::IValue& key) const;  // "<this>[<key's kind>]"
  std::string str() const;

 private:
  ValuePath() = default;

  const ValuePath* parent_ = nullptr;
  const std::string* head_ = nullptr;
  const char* part_ = "";
  const std::string* name_ = nullptr;
  const c10::IValue* key_ = nullptr;
  size_t index_ = kNoIndex;
  static constexpr size_t kNoIndex = ~size_t{0};
};

// Encodes `value` into `out`; its tensors are appended to `tensors` (contiguous; a view
// contributes only its own elements) and referred to by index. Supports None, bool, int,
// double, complex, string, dense CPU tensors of every dtype, lists, tuples and dicts, nested.
// Throws Error(kBadArgument) naming what cannot travel and where (`path`, e.g. "args[1]").
void encode_value(const c10::IValue& value, rpc::Value* out, std::vector<at::Tensor>* tensors,
                  const ValuePath& path, const ValueHooks* hooks = nullptr);

// The inverse. Lists come back typed (int[], float[], bool[], Tensor[], str[]) when the
// sender's were. Throws Error(kProtocol) on malformed input (bad tensor index, nesting
// deeper than 64 levels, unknown kinds).
c10::IValue decode_value(const rpc::Value& in, const std::vector<at::Tensor>& tensors,
                         const ValueHooks* hooks = nullptr);

}  // namespace drpc
