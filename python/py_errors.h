#pragma once

// drpc's errors as Python exceptions and back: the package's exception classes by kind
// (set once at import), the Python exception for a C++ one, and the drpc::Error for what a
// registered Python function raised. Part of the _drpc extension module.

#include <Python.h>
#include <pybind11/pybind11.h>

#include <exception>
#include <map>
#include <string>

#include "drpc.h"

namespace drpc {
namespace python {

namespace py = pybind11;

// The exception classes of the Python package, by kind, set once by the package at import.
// Leaked: they must outlive every thread that may raise them, up to interpreter exit.
struct ErrorTypes {
  PyObject* base = nullptr;
  std::map<std::string, PyObject*> by_kind;
};
ErrorTypes& error_types();

// The package's class for `kind` (its base class, or RuntimeError, before import set them).
PyObject* error_type(ErrorKind kind);

// The Python exception for a C++ one (GIL held).
py::object python_exception(std::exception_ptr error);

// The drpc::Error for an exception a registered Python function `name` raised on worker
// `where` (GIL held). A drpc error keeps its kind; anything else is a kRemote error worded
// as the function registry words C++ ones, "<fn> raised on <worker>: <Type>: <message>",
// which the caller's RemoteError parses.
Error python_function_error(const std::string& name, const std::string& where, py::error_already_set& e);

}  // namespace python
}  // namespace drpc
