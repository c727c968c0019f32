#pragma once

// Python code run from drpc's threads: a registered Python function serving a call on a
// handler thread, and a torch.futures.Future completed from a drpc future. Part of the
// _drpc extension module (python/drpc_module.cc).

#include <Python.h>
#include <pybind11/pybind11.h>

#include <string>

#include "drpc.h"
#include "python/py_objects.h"

namespace drpc {
namespace python {

namespace py = pybind11;

// Completes the Python future `target` (a torch.futures.Future; GIL held) with `future`'s
// outcome, on the thread that completes `future`, without the GIL unless the value holds
// RRefs or Python objects. Errors are drpc::Errors, raised as drpc's Python classes.
void complete_later(const FuturePtr& future, py::object target);

// Runs registered Python function `name` (`fn`) on a handler thread, taking the GIL. A
// function that returns a torch.futures.Future (as torch's @async_execution ones do) is
// answered when that completes, and frees the handler thread meanwhile. Its exceptions
// become drpc::Errors (python_function_error).
FuturePtr call_python(const std::string& name, const SharedObject& fn, CallArgs& call);

}  // namespace python
}  // namespace drpc
