#include "python/py_functions.h"

#include <torch/csrc/jit/python/pybind_utils.h>

#include "python/py_errors.h"
#include "python/py_values.h"

namespace drpc {
namespace python {
namespace {

PyObject* torch_future_type() {
  static PyObject* type = py::object(py::module::import("torch").attr("_C").attr("Future")).release().ptr();  // leaked
  return type;
}

// Whether torch's conversion of `value` to Python (when the future's value is asked for)
// gives what to_python does: data only, no RRef, no Python object, no wrapped number.
bool torch_converts_alike(const c10::IValue& value) {
  if (value.isNone() || value.isBool() || value.isInt() || value.isDouble() || value.isComplexDouble() ||
      value.isString()) {
    return true;
  }
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    return !tensor.defined() || !tensor.unsafeGetTensorImpl()->is_wrapped_number();
  }
  if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) {
      if (!torch_converts_alike(item)) return false;
    }
    return true;
  }
  if (value.isTuple()) {
    const auto& tuple = value.toTupleRef();
    if (tuple.type() && tuple.type()->schema()) return false;  // a NamedTuple: torch makes a namedtuple
    for (const c10::IValue& item : tuple.elements()) {
      if (!torch_converts_alike(item)) return false;
    }
    return true;
  }
  if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      if (!torch_converts_alike(entry.key()) || !torch_converts_alike(entry.value())) return false;
    }
    return true;
  }
  return false;
}

// The error a Python waiter sees: drpc's own, or one of kind Internal naming the C++ one
// (the module's exception translator raises drpc's Python class for it).
std::exception_ptr as_drpc_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
    return error;
  } catch (const c10::Error& e) {
    return std::make_exception_ptr(Error(ErrorKind::kInternal, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(Error(ErrorKind::kInternal, e.what()));
  } catch (...) {
    return std::make_exception_ptr(Error(ErrorKind::kInternal, "unknown C++ exception"));
  }
}

}  // namespace

void complete_later(const FuturePtr& future, py::object target) {
  // The Python future's own C++ future: completing that needs no GIL, and the waiting
  // Python thread converts the value itself when it asks for it. Taking the GIL on every
  // completion, from as many threads as calls complete on, cost more than the call did.
  auto wrapper = target.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>();
  c10::intrusive_ptr<c10::ivalue::Future> python_side = wrapper->fut;
  future->addCallback([python_side](c10::ivalue::Future& done) {
    try {
      if (done.hasError()) {
        python_side->setError(as_drpc_error(done.exception_ptr()));
      } else if (torch_converts_alike(done.constValue())) {
        python_side->markCompleted(done.constValue());
      } else {
        // RRefs and Python objects: made into Python here, where the GIL is taken anyway.
        if (!Py_IsInitialized()) return;
        py::gil_scoped_acquire gil;
        c10::IValue value;
        try {
          value = c10::IValue(c10::intrusive_ptr<c10::ivalue::PyObjectHolder>(
              c10::make_intrusive<PyObjectValue>(to_python(done.constValue()))));
        } catch (const std::exception& e) {  // a Python error, or a value to_python has no form for
          python_side->setError(std::make_exception_ptr(
              Error(ErrorKind::kBadArgument, std::string("the call's result cannot be made into Python: ") + e.what())));
          return;
        }
        python_side->markCompleted(std::move(value));
      }
    } catch (const std::exception& e) {
      // The user completed the future themselves (set_result): theirs stands.
      LOG(WARNING) << "drpc: a future's outcome was dropped: " << e.what();
    }
  });
}

FuturePtr call_python(const std::string& name, const SharedObject& fn, CallArgs& call) {
  if (!Py_IsInitialized()) throw Error(ErrorKind::kShutdown, "the Python interpreter has exited");
  const std::string where = get_worker_info().name;
  py::gil_scoped_acquire gil;
  auto out = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  try {
    py::tuple args(call.args.size());
    for (size_t i = 0; i < call.args.size(); ++i) args[i] = to_python(call.args[i]);
    py::dict kwargs;
    for (const auto& kv : call.kwargs) kwargs[py::str(kv.first)] = to_python(kv.second);
    py::object result = fn->get()(*args, **kwargs);
    if (!py::isinstance(result, py::handle(torch_future_type()))) {
      out->markCompleted(to_ivalue(result, name + ": the result", /*allow_objects=*/true));
      return out;
    }
    result.attr("add_done_callback")(py::cpp_function([name, where, out](py::object done) {
      c10::IValue value;
      std::exception_ptr error;
      try {
        value = to_ivalue(done.attr("value")(), name + ": the result", /*allow_objects=*/true);
      } catch (py::error_already_set& e) {
        error = std::make_exception_ptr(python_function_error(name, where, e));
      } catch (const std::exception& e) {  // a result that cannot be converted
        error = std::make_exception_ptr(Error(ErrorKind::kRemote, name + " raised on " + where + ": " + e.what()));
      }
      // Completing sends the reply: no GIL needed, and none held while the network works.
      py::gil_scoped_release nogil;
      if (error) {
        out->setError(error);
      } else {
        out->markCompleted(std::move(value));
      }
    }));
    return out;
  } catch (py::error_already_set& e) {
    throw python_function_error(name, where, e);
  }
}

}  // namespace python
}  // namespace drpc
