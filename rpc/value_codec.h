#pragma once

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"

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

// The flat wire form of a value: a kind byte, then (all integers little-endian)
//   none, false, true: nothing;  int: i64;  float: f64;  complex: two f64;
//   str: [u32 length][bytes];  tensor: [u32 index into the message's tensors];
//   list: [u8 element kind][u32 count][items];  tuple: [u32 count][items];
//   dict: [u32 count][count x (key, value)];  rref: [u32 length][the RRef layer's bytes].
// A list's element kind (any, int, float, bool, Tensor, str) brings it back typed.

// Appends `value` to `out`; its tensors are appended to `tensors` (contiguous; a view
// contributes only its own elements) and referred to by index. Supports None, bool, int,
// double, complex, string, dense CPU tensors of every dtype, lists, tuples and dicts, nested.
// Throws Error(kBadArgument) naming what cannot travel and where (`path`, e.g. "args[1]").
void encode_value(const c10::IValue& value, std::string* out, std::vector<at::Tensor>* tensors,
                  const ValuePath& path, const ValueHooks* hooks = nullptr);

// The fields around values, for the formats built of them (calls, the agent's envelope):
// a fixed-width integer or float, a length-prefixed string ([u32 length][bytes]), a u32
// count (kBadArgument past 2^32).
template <typename T>
void encode_fixed(T value, std::string* out) {
  out->append(reinterpret_cast<const char*>(&value), sizeof value);  // little-endian hosts only
}
void encode_bytes(const std::string& bytes, std::string* out);
void encode_count(size_t count, std::string* out);

// Reads flat values and the fields around them from `size` bytes at `data` (which must
// outlive it), each bounded by what is left. Every read throws Error(kProtocol) naming what
// was cut short or malformed; nothing is allocated in proportion to a count before the
// bytes it promises are known to be there.
class ValueReader {
 public:
  ValueReader(const char* data, size_t size) : data_(data), left_(size) {}
  explicit ValueReader(const std::string& bytes) : ValueReader(bytes.data(), bytes.size()) {}

  // The next value; lists come back typed (int[], float[], bool[], Tensor[], str[]) when
  // the sender's were. Malformed: a bad tensor index, nesting deeper than 64 levels, an
  // unknown kind.
  c10::IValue value(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks = nullptr);
  // A fixed-width integer or float.
  template <typename T>
  T fixed(const char* what) {
    if (left_ < sizeof(T)) throw Error(ErrorKind::kProtocol, std::string(what) + " is cut short");
    T v;
    std::memcpy(&v, data_, sizeof v);
    data_ += sizeof v;
    left_ -= sizeof v;
    return v;
  }
  // A u32 count of items that take at least `min_item_bytes` each.
  uint32_t count(size_t min_item_bytes, const char* what);
  // A length-prefixed string.
  std::string bytes(const char* what);
  // Throws unless every byte was read.
  void expect_end(const char* what) const;
  // The bytes not read yet.
  size_t left() const { return left_; }

 private:
  c10::IValue value_at(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks, int depth);
  c10::IValue list(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks, int depth);
  c10::IValue dict(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks, int depth);

  const char* data_;
  size_t left_;
};

// The value of the whole of `bytes` (see ValueReader::value; trailing bytes are malformed).
c10::IValue decode_value(const std::string& bytes, const std::vector<at::Tensor>& tensors,
                         const ValueHooks* hooks = nullptr);

}  // namespace drpc
