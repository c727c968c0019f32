#pragma once

// Python values as c10::IValues and back, by the value codec's rules: tensors, numbers,
// strings, bools, None, RRefs, and lists, tuples and dicts of them; anything else is a
// TypeError naming the argument (or, where allowed, a Python object kept in place). Part
// of the _drpc extension module (python/drpc_module.cc). GIL held for all of them.

#include <Python.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <string>
#include <vector>

#include "drpc.h"

namespace drpc {
namespace python {

namespace py = pybind11;

// `obj` as an IValue; `path` names it in errors ("f: argument 0[2]"). With `allow_objects`,
// what is not data becomes a PyObjectValue (an RRef's value on its owner).
c10::IValue to_ivalue(py::handle obj, const std::string& path, bool allow_objects);

// A value as a Python object. Throws py::type_error for a kind Python cannot get.
py::object to_python(const c10::IValue& v);

// A call's positional and keyword arguments for function `fn`.
std::vector<c10::IValue> to_args(const py::tuple& args, const std::string& fn);
Kwargs to_kwargs(const py::dict& kwargs, const std::string& fn);

// -1 (or any negative): the job's default; 0: none; otherwise seconds, as torch takes them.
std::chrono::milliseconds to_timeout(double seconds);

}  // namespace python
}  // namespace drpc
