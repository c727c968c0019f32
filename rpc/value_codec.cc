#include "rpc/value_codec.h"

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>

#include "common/error.h"

namespace drpc {
namespace {

constexpr int kMaxDepth = 64;

rpc::List::Elem elem_of(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::IntType: return rpc::List::INT;
    case c10::TypeKind::FloatType: return rpc::List::DOUBLE;
    case c10::TypeKind::BoolType: return rpc::List::BOOL;
    case c10::TypeKind::TensorType: return rpc::List::TENSOR;
    case c10::TypeKind::StringType: return rpc::List::STRING;
    default: return rpc::List::ANY;
  }
}

void encode_list(c10::ArrayRef<c10::IValue> items, rpc::List* out, std::vector<at::Tensor>* tensors,
                 const ValuePath& path, const ValueHooks* hooks) {
  for (size_t i = 0; i < items.size(); ++i) encode_value(items[i], out->add_items(), tensors, path.item(i), hooks);
}

c10::IValue decode_at(const rpc::Value& in, const std::vector<at::Tensor>& tensors, const ValueHooks* hooks,
                      int depth);

c10::IValue decode_list(const rpc::List& list, const std::vector<at::Tensor>& tensors, const ValueHooks* hooks,
                        int depth) {
  auto items = [&](auto convert) {
    for (const auto& item : list.items()) convert(decode_at(item, tensors, hooks, depth + 1));
  };
  auto expect = [](bool ok, const char* what) {
    if (!ok) throw Error(ErrorKind::kProtocol, std::string("a ") + what + " list holds another kind of value");
  };
  switch (list.elem()) {
    case rpc::List::INT: {
      c10::List<int64_t> out;
      items([&](c10::IValue v) { expect(v.isInt(), "int"); out.push_back(v.toInt()); });
      return out;
    }
    case rpc::List::DOUBLE: {
      c10::List<double> out;
      items([&](c10::IValue v) { expect(v.isDouble(), "float"); out.push_back(v.toDouble()); });
      return out;
    }
    case rpc::List::BOOL: {
      c10::List<bool> out;
      items([&](c10::IValue v) { expect(v.isBool(), "bool"); out.push_back(v.toBool()); });
      return out;
    }
    case rpc::List::TENSOR: {
      c10::List<at::Tensor> out;
      items([&](c10::IValue v) { expect(v.isTensor(), "Tensor"); out.push_back(v.toTensor()); });
      return out;
    }
    case rpc::List::STRING: {
      c10::List<std::string> out;
      items([&](c10::IValue v) { expect(v.isString(), "str"); out.push_back(v.toStringRef()); });
      return out;
    }
    default: {
      c10::impl::GenericList out(c10::AnyType::get());
      items([&](c10::IValue v) { out.push_back(std::move(v)); });
      return out;
    }
  }
}

c10::IValue decode_at(const rpc::Value& in, const std::vector<at::Tensor>& tensors, const ValueHooks* hooks,
                      int depth) {
  if (depth > kMaxDepth) throw Error(ErrorKind::kProtocol, "value nested deeper than 64 levels");
  switch (in.kind_case()) {
    case rpc::Value::kNone: return c10::IValue();
    case rpc::Value::kBoolean: return in.boolean();
    case rpc::Value::kInteger: return in.integer();
    case rpc::Value::kReal: return in.real();
    case rpc::Value::kComplex: return c10::complex<double>(in.complex().real(), in.complex().imag());
    case rpc::Value::kText: return in.text();
    case rpc::Value::kTensor: {
      const int index = in.tensor();
      if (index < 0 || index >= static_cast<int>(tensors.size())) {
        throw Error(ErrorKind::kProtocol, "tensor index " + std::to_string(index) + " out of range (" +
                                              std::to_string(tensors.size()) + " tensors arrived)");
      }
      return tensors[index];
    }
    case rpc::Value::kList: return decode_list(in.list(), tensors, hooks, depth);
    case rpc::Value::kTuple: {
      std::vector<c10::IValue> items;
      for (const auto& item : in.tuple().items()) items.push_back(decode_at(item, tensors, hooks, depth + 1));
      return c10::ivalue::Tuple::create(std::move(items));
    }
    case rpc::Value::kDict: {
      const auto& dict = in.dict();
      if (dict.keys_size() != dict.values_size()) throw Error(ErrorKind::kProtocol, "dict with unpaired keys");
      std::vector<c10::IValue> keys, values;
      for (int i = 0; i < dict.keys_size(); ++i) {
        keys.push_back(decode_at(dict.keys(i), tensors, hooks, depth + 1));
        values.push_back(decode_at(dict.values(i), tensors, hooks, depth + 1));
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
    case rpc::Value::kRref:
      if (!hooks || !hooks->decode_custom) throw Error(ErrorKind::kProtocol, "an RRef arrived but RRefs are not enabled");
      return hooks->decode_custom(in.rref());
    default:
      throw Error(ErrorKind::kProtocol, "value of unknown kind " + std::to_string(in.kind_case()));
  }
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

void encode_value(const c10::IValue& value, rpc::Value* out, std::vector<at::Tensor>* tensors,
                  const ValuePath& path, const ValueHooks* hooks) {
  if (hooks && hooks->encode_custom) {
    std::string bytes;
    if (hooks->encode_custom(value, &bytes)) {
      out->set_rref(std::move(bytes));
      return;
    }
  }
  if (value.isNone()) {
    out->set_none(true);
  } else if (value.isBool()) {
    out->set_boolean(value.toBool());
  } else if (value.isInt()) {
    out->set_integer(value.toInt());
  } else if (value.isDouble()) {
    out->set_real(value.toDouble());
  } else if (value.isComplexDouble()) {
    const auto c = value.toComplexDouble();
    out->mutable_complex()->set_real(c.real());
    out->mutable_complex()->set_imag(c.imag());
  } else if (value.isString()) {
    out->set_text(value.toStringRef());
  } else if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) {
      out->set_none(true);
    } else {
      if (!t.device().is_cpu() || t.layout() != c10::kStrided || t.is_quantized()) {
        throw Error(ErrorKind::kBadArgument, path.str() + ": only dense CPU tensors can be sent, got " + t.toString());
      }
      out->set_tensor(static_cast<int32_t>(tensors->size()));
      // Not detached: distributed autograd's interceptor records the tensors that
      // require grad (and detaches them) before the message leaves.
      tensors->push_back(t.contiguous());
    }
  } else if (value.isList()) {
    rpc::List* l = out->mutable_list();
    l->set_elem(elem_of(value.toList().elementType()));
    encode_list(value.toListRef(), l, tensors, path, hooks);
  } else if (value.isTuple()) {
    encode_list(value.toTupleRef().elements().asArrayRef(), out->mutable_tuple(), tensors, path, hooks);
  } else if (value.isGenericDict()) {
    rpc::Dict* d = out->mutable_dict();
    for (const auto& entry : value.toGenericDict()) {
      encode_value(entry.key(), d->add_keys(), tensors, path.key(), hooks);
      encode_value(entry.value(), d->add_values(), tensors, path.value_at(entry.key()), hooks);
    }
  } else {
    throw Error(ErrorKind::kBadArgument, path.str() + ": a value of type " + value.type()->str() +
                                             " cannot be sent (the wire carries data, never code or objects)");
  }
}

c10::IValue decode_value(const rpc::Value& in, const std::vector<at::Tensor>& tensors, const ValueHooks* hooks) {
  return decode_at(in, tensors, hooks, 0);
}

}  // namespace drpc
