#include "rpc/value_codec.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace drpc {
namespace {

constexpr int kMaxDepth = 64;

// What a container reserves for the items its count claims, at most: each level checks its
// count against the bytes left, but nested levels share those bytes, so reserving each
// level's whole claim would multiply them (65 levels of 16 MiB worth of items).
size_t reservable(uint32_t count) { return std::min<uint32_t>(count, 256); }

enum Kind : uint8_t {
  kNone = 0,
  kFalse = 1,
  kTrue = 2,
  kInt = 3,
  kFloat = 4,
  kComplex = 5,
  kString = 6,
  kTensor = 7,
  kList = 8,
  kTuple = 9,
  kDict = 10,
  kRRef = 11,
};

// A list's element kind.
enum Elem : uint8_t { kAnyElem = 0, kIntElem = 1, kFloatElem = 2, kBoolElem = 3, kTensorElem = 4, kStringElem = 5 };

Elem elem_of(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::IntType: return kIntElem;
    case c10::TypeKind::FloatType: return kFloatElem;
    case c10::TypeKind::BoolType: return kBoolElem;
    case c10::TypeKind::TensorType: return kTensorElem;
    case c10::TypeKind::StringType: return kStringElem;
    default: return kAnyElem;
  }
}

void encode_items(c10::ArrayRef<c10::IValue> items, std::string* out, std::vector<at::Tensor>* tensors,
                  const ValuePath& path, const ValueHooks* hooks) {
  encode_count(items.size(), out);
  for (size_t i = 0; i < items.size(); ++i) encode_value(items[i], out, tensors, path.item(i), hooks);
}

}  // namespace

ValuePath ValuePath::item(size_t index) const {
  ValuePath child;
  child.parent_ = this;
  child.index_ = index;
  return child;
}

ValuePath ValuePath::key() const {
  ValuePath child;
  child.parent_ = this;
  child.part_ = ".key";
  return child;
}

ValuePath ValuePath::value_at(const c10::IValue& key) const {
  ValuePath child;
  child.parent_ = this;
  child.key_ = &key;
  return child;
}

std::string ValuePath::str() const {
  std::string text = parent_ ? parent_->str() : head_ ? *head_ : std::string();
  text += part_;
  if (name_) text += *name_;
  if (key_) text += "[" + key_->tagKind() + "]";
  if (index_ != kNoIndex) text += "[" + std::to_string(index_) + "]";
  return text;
}

void encode_count(size_t count, std::string* out) {
  if (count > UINT32_MAX) throw Error(ErrorKind::kBadArgument, "more than 2^32 items cannot travel");
  encode_fixed(static_cast<uint32_t>(count), out);
}

void encode_bytes(const std::string& bytes, std::string* out) {
  encode_count(bytes.size(), out);
  out->append(bytes);
}

void encode_value(const c10::IValue& value, std::string* out, std::vector<at::Tensor>* tensors,
                  const ValuePath& path, const ValueHooks* hooks) {
  if (hooks && hooks->encode_custom) {
    std::string bytes;
    if (hooks->encode_custom(value, &bytes)) {
      encode_fixed(kRRef, out);
      encode_bytes(bytes, out);
      return;
    }
  }
  if (value.isNone()) {
    encode_fixed(kNone, out);
  } else if (value.isBool()) {
    encode_fixed(value.toBool() ? kTrue : kFalse, out);
  } else if (value.isInt()) {
    encode_fixed(kInt, out);
    encode_fixed(value.toInt(), out);
  } else if (value.isDouble()) {
    encode_fixed(kFloat, out);
    encode_fixed(value.toDouble(), out);
  } else if (value.isComplexDouble()) {
    const auto c = value.toComplexDouble();
    encode_fixed(kComplex, out);
    encode_fixed(c.real(), out);
    encode_fixed(c.imag(), out);
  } else if (value.isString()) {
    encode_fixed(kString, out);
    encode_bytes(value.toStringRef(), out);
  } else if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) {
      encode_fixed(kNone, out);
    } else {
      if (!t.device().is_cpu() || t.layout() != c10::kStrided || t.is_quantized()) {
        throw Error(ErrorKind::kBadArgument, path.str() + ": only dense CPU tensors can be sent, got " + t.toString());
      }
      encode_fixed(kTensor, out);
      encode_count(tensors->size(), out);
      // Not detached: distributed autograd's interceptor records the tensors that
      // require grad (and detaches them) before the message leaves.
      tensors->push_back(t.contiguous());
    }
  } else if (value.isList()) {
    encode_fixed(kList, out);
    encode_fixed(elem_of(value.toList().elementType()), out);
    encode_items(value.toListRef(), out, tensors, path, hooks);
  } else if (value.isTuple()) {
    encode_fixed(kTuple, out);
    encode_items(value.toTupleRef().elements().asArrayRef(), out, tensors, path, hooks);
  } else if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    encode_fixed(kDict, out);
    encode_count(dict.size(), out);
    for (const auto& entry : dict) {
      encode_value(entry.key(), out, tensors, path.key(), hooks);
      encode_value(entry.value(), out, tensors, path.value_at(entry.key()), hooks);
    }
  } else {
    throw Error(ErrorKind::kBadArgument, path.str() + ": a value of type " + value.type()->str() +
                                             " cannot be sent (the wire carries data, never code or objects)");
  }
}

uint32_t ValueReader::count(size_t min_item_bytes, const char* what) {
  const uint32_t n = fixed<uint32_t>(what);
  if (left_ / std::max<size_t>(min_item_bytes, 1) < n) {
    throw Error(ErrorKind::kProtocol, std::string(what) + " claims " + std::to_string(n) + " items but " +
                                          std::to_string(left_) + " bytes are left");
  }
  return n;
}

std::string ValueReader::bytes(const char* what) {
  const uint32_t n = fixed<uint32_t>(what);
  if (left_ < n) {
    throw Error(ErrorKind::kProtocol, std::string(what) + " claims " + std::to_string(n) + " bytes but " +
                                          std::to_string(left_) + " are left");
  }
  std::string out(data_, n);
  data_ += n;
  left_ -= n;
  return out;
}

void ValueReader::expect_end(const char* what) const {
  if (left_ != 0) throw Error(ErrorKind::kProtocol, std::to_string(left_) + " byte(s) after " + what);
}

c10::IValue ValueReader::value(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks) {
  return value_at(tensors, hooks, 0);
}

namespace {

// A list of `n` items of one kind, each checked with `is` ("a <name> list holds another kind").
template <typename T, typename Next>
c10::IValue typed_list(uint32_t n, Next next, bool (c10::IValue::*is)() const, const char* name) {
  c10::List<T> out;
  out.reserve(reservable(n));
  for (uint32_t i = 0; i < n; ++i) {
    c10::IValue v = next();
    if (!(v.*is)()) throw Error(ErrorKind::kProtocol, std::string("a ") + name + " list holds another kind of value");
    out.push_back(std::move(v).to<T>());
  }
  return out;
}

}  // namespace

c10::IValue ValueReader::list(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks, int depth) {
  const uint8_t elem = fixed<uint8_t>("a list's element kind");
  const uint32_t n = count(1, "a list");
  auto next = [&] { return value_at(tensors, hooks, depth + 1); };
  switch (elem) {
    case kIntElem: return typed_list<int64_t>(n, next, &c10::IValue::isInt, "int");
    case kFloatElem: return typed_list<double>(n, next, &c10::IValue::isDouble, "float");
    case kBoolElem: return typed_list<bool>(n, next, &c10::IValue::isBool, "bool");
    case kTensorElem: return typed_list<at::Tensor>(n, next, &c10::IValue::isTensor, "Tensor");
    case kStringElem: return typed_list<std::string>(n, next, &c10::IValue::isString, "str");
    case kAnyElem: {
      c10::impl::GenericList out(c10::AnyType::get());
      out.reserve(reservable(n));
      for (uint32_t i = 0; i < n; ++i) out.push_back(next());
      return out;
    }
    default:
      throw Error(ErrorKind::kProtocol, "a list of unknown element kind " + std::to_string(elem));
  }
}

c10::IValue ValueReader::dict(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks, int depth) {
  const uint32_t n = count(2, "a dict");
  std::vector<c10::IValue> keys, values;
  keys.reserve(reservable(n));
  values.reserve(reservable(n));
  for (uint32_t i = 0; i < n; ++i) {
    keys.push_back(value_at(tensors, hooks, depth + 1));
    values.push_back(value_at(tensors, hooks, depth + 1));
  }
  c10::TypePtr key_type = c10::StringType::get();
  if (!keys.empty()) {
    if (keys[0].isInt()) key_type = c10::IntType::get();
    else if (keys[0].isDouble()) key_type = c10::FloatType::get();
    else if (keys[0].isTensor()) key_type = c10::TensorType::get();
    else if (keys[0].isBool()) key_type = c10::BoolType::get();
    else if (!keys[0].isString()) throw Error(ErrorKind::kProtocol, "unsupported dict key");
  }
  c10::TypePtr value_type = c10::AnyType::get();
  if (!values.empty() && std::all_of(values.begin(), values.end(), [](const c10::IValue& v) { return v.isTensor(); })) {
    value_type = c10::TensorType::get();
  }
  c10::impl::GenericDict out(key_type, value_type);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].type()->kind() != key_type->kind()) throw Error(ErrorKind::kProtocol, "dict keys of mixed kinds");
    out.insert_or_assign(std::move(keys[i]), std::move(values[i]));
  }
  return out;
}

c10::IValue ValueReader::value_at(const std::vector<at::Tensor>& tensors, const ValueHooks* hooks, int depth) {
  if (depth > kMaxDepth) throw Error(ErrorKind::kProtocol, "value nested deeper than 64 levels");
  const uint8_t kind = fixed<uint8_t>("a value");
  switch (kind) {
    case kNone: return c10::IValue();
    case kFalse: return false;
    case kTrue: return true;
    case kInt: return fixed<int64_t>("an int");
    case kFloat: return fixed<double>("a float");
    case kComplex: {
      const double real = fixed<double>("a complex");
      return c10::complex<double>(real, fixed<double>("a complex"));
    }
    case kString: return bytes("a str");
    case kTensor: {
      const uint32_t index = fixed<uint32_t>("a tensor index");
      if (index >= tensors.size()) {
        throw Error(ErrorKind::kProtocol, "tensor index " + std::to_string(index) + " out of range (" +
                                              std::to_string(tensors.size()) + " tensors arrived)");
      }
      return tensors[index];
    }
    case kList: return list(tensors, hooks, depth);
    case kTuple: {
      const uint32_t n = count(1, "a tuple");
      std::vector<c10::IValue> items;
      items.reserve(reservable(n));
      for (uint32_t i = 0; i < n; ++i) items.push_back(value_at(tensors, hooks, depth + 1));
      return c10::ivalue::Tuple::create(std::move(items));
    }
    case kDict: return dict(tensors, hooks, depth);
    case kRRef: {
      std::string rref = bytes("an RRef");
      if (!hooks || !hooks->decode_custom) throw Error(ErrorKind::kProtocol, "an RRef arrived but RRefs are not enabled");
      return hooks->decode_custom(rref);
    }
    default:
      throw Error(ErrorKind::kProtocol, "value of unknown kind " + std::to_string(kind));
  }
}

c10::IValue decode_value(const std::string& bytes, const std::vector<at::Tensor>& tensors, const ValueHooks* hooks) {
  ValueReader in(bytes);
  c10::IValue value = in.value(tensors, hooks);
  in.expect_end("the value");
  return value;
}

}  // namespace drpc
