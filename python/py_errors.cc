#include "python/py_errors.h"

namespace drpc {
namespace python {

ErrorTypes& error_types() {
  static ErrorTypes* types = new ErrorTypes();
  return *types;
}

PyObject* error_type(ErrorKind kind) {
  auto& types = error_types();
  auto it = types.by_kind.find(error_kind_name(kind));
  if (it != types.by_kind.end()) return it->second;
  return types.base ? types.base : PyExc_RuntimeError;
}

py::object python_exception(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    py::object instance = py::reinterpret_borrow<py::object>(error_type(e.kind()))(e.message());
    return instance;
  } catch (const py::error_already_set& e) {
    return e.value();
  } catch (const c10::Error& e) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(e.what());
  } catch (...) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)("unknown C++ exception");
  }
}

Error python_function_error(const std::string& name, const std::string& where, py::error_already_set& e) {
  const auto& types = error_types();
  if (types.base && e.matches(types.base)) {
    const std::string kind = py::str(e.value().attr("kind"));
    for (int k = 0; k <= static_cast<int>(ErrorKind::kInternal); ++k) {
      if (kind == error_kind_name(static_cast<ErrorKind>(k))) {
        return Error(static_cast<ErrorKind>(k), py::str(e.value()).cast<std::string>());
      }
    }
  }
  const std::string type = py::str(e.type().attr("__name__"));
  const std::string message = py::str(e.value());
  return Error(ErrorKind::kRemote, name + " raised on " + where + ": " + type + ": " + message);
}

}  // namespace python
}  // namespace drpc
