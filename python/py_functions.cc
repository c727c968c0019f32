#include "python/py_functions.h"

#include "python/py_errors.h"
#include "python/py_values.h"

namespace drpc {
namespace python {
namespace {

PyObject* torch_future_type() {
  static PyObject* type = py::object(py::module::import("torch").attr("_C").attr("Future")).release().ptr();  // leaked
  return type;
}

}  // namespace

void complete_later(const FuturePtr& future, py::object target) {
  auto held = std::make_shared<GilObject>(std::move(target));
  future->addCallback([held](c10::ivalue::Future& done) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    try {
      if (done.hasError()) {
        held->get().attr("set_exception")(python_exception(done.exception_ptr()));
      } else {
        py::object value;
        try {
          value = to_python(done.value());
        } catch (py::error_already_set& e) {
          held->get().attr("set_exception")(e.value());
          return;
        }
        held->get().attr("set_result")(value);
      }
    } catch (py::error_already_set& e) {
      // A then-callback of the user's raised; torch's future reports that itself.
      e.discard_as_unraisable("drpc future callback");
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
