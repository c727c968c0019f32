#pragma once

// Python objects held from C++: GilObject (a reference any thread may drop), the RRef
// handle the module gives Python, and PyObjectValue (a Python object inside an IValue).
// Part of the _drpc extension module (python/drpc_module.cc).

#include <Python.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "drpc.h"

namespace drpc {
namespace python {

namespace py = pybind11;

// A Python object owned from C++ code that may drop it on any thread.
class GilObject {
 public:
  explicit GilObject(py::object object) : object_(object.release().ptr()) {}
  ~GilObject() {
    // After the interpreter is gone there is nothing left to release.
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    Py_XDECREF(object_);
  }
  GilObject(const GilObject&) = delete;
  GilObject& operator=(const GilObject&) = delete;
  py::handle get() const { return py::handle(object_); }

 private:
  PyObject* object_;
};
using SharedObject = std::shared_ptr<GilObject>;

struct RRefHandle {
  RRef rref;
  // Dropping the last reference tells the RRef context (under its lock), whose other
  // threads may meanwhile free owner values holding Python objects and so wait for the
  // GIL: let go of it first.
  ~RRefHandle() {
    if (rref.defined() && Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      rref = RRef();
    }
  }
};

// A Python object inside an IValue: what a Python function returns that is not data (a
// module, an instance of the user's class). It stays where it was made: as the value of
// an RRef on its owner; the codec refuses to send it.
class PyObjectValue final : public c10::ivalue::PyObjectHolder {
 public:
  explicit PyObjectValue(py::object object) : object_(std::make_shared<GilObject>(std::move(object))) {}
  PyObject* getPyObject() override { return object_->get().ptr(); }
  c10::InferredType tryToInferType() override { return c10::InferredType("a Python object"); }
  c10::IValue toIValue(const c10::TypePtr& type, c10::optional<int32_t>) override {
    throw Error(ErrorKind::kBadArgument, "a Python object cannot be used as " + type->str());
  }
  std::string toStr() override {
    py::gil_scoped_acquire gil;
    return py::repr(object_->get());
  }
  std::vector<at::Tensor> extractTensors() override { return {}; }

 private:
  SharedObject object_;
};

}  // namespace python
}  // namespace drpc
