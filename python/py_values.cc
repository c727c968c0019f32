#include "python/py_values.h"

#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>

#include "python/py_objects.h"

namespace drpc {
namespace python {
namespace {

[[noreturn]] void not_codable(py::handle obj, const std::string& path) {
  throw py::type_error(path + ": a value of type " + std::string(py::str(py::type::handle_of(obj).attr("__name__"))) +
                       " cannot be sent (drpc sends tensors, numbers, strings, bools, None, RRefs, and lists, "
                       "tuples and dicts of them; functions are sent by registered name)");
}

c10::TypePtr common_element_type(const std::vector<c10::IValue>& items) {
  if (items.empty()) return c10::AnyType::get();
  auto kind = items[0].type()->kind();
  for (const auto& item : items) {
    if (item.type()->kind() != kind) return c10::AnyType::get();
  }
  switch (kind) {
    case c10::TypeKind::IntType: return c10::IntType::get();
    case c10::TypeKind::FloatType: return c10::FloatType::get();
    case c10::TypeKind::BoolType: return c10::BoolType::get();
    case c10::TypeKind::StringType: return c10::StringType::get();
    case c10::TypeKind::TensorType: return c10::TensorType::get();
    default: return c10::AnyType::get();
  }
}

}  // namespace

c10::IValue to_ivalue(py::handle obj, const std::string& path, bool allow_objects) {
  if (obj.is_none()) return c10::IValue();
  if (PyBool_Check(obj.ptr())) return c10::IValue(obj.ptr() == Py_True);
  if (PyLong_Check(obj.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow) throw py::type_error(path + ": the int does not fit in 64 bits");
    return c10::IValue(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(obj.ptr())) return c10::IValue(PyFloat_AsDouble(obj.ptr()));
  if (PyUnicode_Check(obj.ptr())) return c10::IValue(obj.cast<std::string>());
  if (THPVariable_Check(obj.ptr())) return c10::IValue(THPVariable_Unpack(obj.ptr()));
  if (py::isinstance<RRefHandle>(obj)) return obj.cast<RRefHandle&>().rref.to_ivalue();
  if (PyTuple_Check(obj.ptr())) {
    std::vector<c10::IValue> items;
    size_t i = 0;
    for (auto item : obj) items.push_back(to_ivalue(item, path + "[" + std::to_string(i++) + "]", allow_objects));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (PyList_Check(obj.ptr())) {
    std::vector<c10::IValue> items;
    size_t i = 0;
    for (auto item : obj) items.push_back(to_ivalue(item, path + "[" + std::to_string(i++) + "]", allow_objects));
    // Typed where the elements agree, so builtins taking int[] or Tensor[] accept it.
    c10::impl::GenericList list(common_element_type(items));
    for (auto& item : items) list.push_back(std::move(item));
    return list;
  }
  if (PyDict_Check(obj.ptr())) {
    std::vector<std::pair<c10::IValue, c10::IValue>> entries;
    for (auto kv : obj.cast<py::dict>()) {
      c10::IValue key = to_ivalue(kv.first, path + ".key", false);
      const std::string key_text = key.isString() ? "'" + key.toStringRef() + "'" : std::string(py::repr(kv.first));
      entries.emplace_back(std::move(key), to_ivalue(kv.second, path + "[" + key_text + "]", allow_objects));
    }
    std::vector<c10::IValue> keys;
    for (auto& e : entries) keys.push_back(e.first);
    c10::TypePtr key_type = common_element_type(keys);
    if (!entries.empty() && key_type->kind() == c10::TypeKind::AnyType) {
      throw py::type_error(path + ": dict keys must all be of one type (str, int, float, bool or Tensor)");
    }
    if (entries.empty()) key_type = c10::StringType::get();
    c10::impl::GenericDict dict(key_type, c10::AnyType::get());
    for (auto& e : entries) dict.insert_or_assign(std::move(e.first), std::move(e.second));
    return dict;
  }
  if (allow_objects) {
    return c10::IValue(c10::intrusive_ptr<c10::ivalue::PyObjectHolder>(
        c10::make_intrusive<PyObjectValue>(py::reinterpret_borrow<py::object>(obj))));
  }
  not_codable(obj, path);
}

py::object to_python(const c10::IValue& v) {
  if (v.isNone()) return py::none();
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    return py::reinterpret_steal<py::object>(PyComplex_FromDoubles(c.real(), c.imag()));
  }
  if (v.isString()) return py::str(v.toStringRef());
  if (v.isTensor()) {
    if (!v.toTensor().defined()) return py::none();
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  }
  if (v.isList()) {
    py::list out;
    for (const c10::IValue& item : v.toListRef()) out.append(to_python(item));
    return out;
  }
  if (v.isTuple()) {
    const auto& elements = v.toTupleRef().elements();
    py::tuple out(elements.size());
    for (size_t i = 0; i < elements.size(); ++i) out[i] = to_python(elements[i]);
    return out;
  }
  if (v.isGenericDict()) {
    py::dict out;
    for (const auto& entry : v.toGenericDict()) out[to_python(entry.key())] = to_python(entry.value());
    return out;
  }
  if (v.isRRef()) return py::cast(RRefHandle{RRef::from_ivalue(v)});
  if (v.isPyObject()) return py::reinterpret_borrow<py::object>(v.toPyObject());
  throw py::type_error("drpc cannot give Python a value of type " + v.type()->str());
}

std::vector<c10::IValue> to_args(const py::tuple& args, const std::string& fn) {
  std::vector<c10::IValue> out;
  for (size_t i = 0; i < args.size(); ++i) {
    out.push_back(to_ivalue(args[i], fn + ": argument " + std::to_string(i), false));
  }
  return out;
}

Kwargs to_kwargs(const py::dict& kwargs, const std::string& fn) {
  Kwargs out;
  for (auto kv : kwargs) {
    const std::string name = kv.first.cast<std::string>();
    out.emplace_back(name, to_ivalue(kv.second, fn + ": argument '" + name + "'", false));
  }
  return out;
}

std::chrono::milliseconds to_timeout(double seconds) {
  if (seconds < 0) return kDefaultTimeout;
  if (seconds == 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000 + 0.5)));
}

}  // namespace python
}  // namespace drpc
