// The `_drpc` extension module: binds drpc's public C++ API (drpc.h) to Python, converting
// Python values to c10::IValues and back, drpc::Error to Python exceptions, and running
// Python functions registered by name on drpc's handler threads. The pure-Python package
// `drpc` (python/src/drpc) gives it torch.distributed.rpc's names.
//
// The GIL: released around every call that may block (so handler threads can run Python
// meanwhile), taken by handler and callback threads only to run Python code. Python
// objects that C++ keeps (registered functions, futures to complete) are held through
// shared_ptr<GilObject>, whose copies never touch Python reference counts off the GIL.

#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "drpc.h"

namespace py = pybind11;

namespace drpc {
namespace python {
namespace {

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

// The exception classes of the Python package, by kind, set once by the package at import.
// Leaked: they must outlive every thread that may raise them, up to interpreter exit.
struct ErrorTypes {
  PyObject* base = nullptr;
  std::map<std::string, PyObject*> by_kind;
};
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

// The Python exception for a C++ one (GIL held).
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

// --- values ------------------------------------------------------------------------------

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

[[noreturn]] void not_codable(py::handle obj, const std::string& path) {
  throw py::type_error(path + ": a value of type " + std::string(py::str(py::type::handle_of(obj).attr("__name__"))) +
                       " cannot be sent (drpc sends tensors, numbers, strings, bools, None, RRefs, and lists, "
                       "tuples and dicts of them; functions are sent by registered name)");
}

c10::IValue to_ivalue(py::handle obj, const std::string& path, bool allow_objects);

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

// -1 (or any negative): the job's default; 0: none; otherwise seconds, as torch takes them.
std::chrono::milliseconds to_timeout(double seconds) {
  if (seconds < 0) return kDefaultTimeout;
  if (seconds == 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000 + 0.5)));
}

// Completes the Python future `target` (a torch.futures.Future) with `future`'s outcome,
// on the thread that completes `future`.
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

// The drpc::Error for an exception a registered Python function raised (GIL held). A
// drpc error keeps its kind; anything else is a kRemote error worded as the function
// registry words C++ ones, "<fn> raised on <worker>: <Type>: <message>", which the
// caller's RemoteError parses.
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

PyObject* torch_future_type() {
  static PyObject* type = py::object(py::module::import("torch").attr("_C").attr("Future")).release().ptr();  // leaked
  return type;
}

// Runs a registered Python function on a handler thread. A function that returns a
// torch.futures.Future (as torch's @async_execution ones do) is answered when that
// completes, and frees the handler thread meanwhile.
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

WorkerInfo worker_by_rank(int rank) {
  for (const auto& w : get_worker_infos()) {
    if (w.id == rank) return w;
  }
  throw Error(ErrorKind::kBadArgument, "no worker has rank " + std::to_string(rank));
}

// C++ objects whose destructors may block on the network: drop them without the GIL.
template <typename T>
void reset_without_gil(std::unique_ptr<T>& object) {
  if (!object) return;
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    object.reset();
  } else {
    object.reset();
  }
}

// Counts shutdowns. A Context or DistributedOptimizer refers to the runtime it was made
// on, which shutdown destroys; Python objects easily outlive it, so one made before the
// latest shutdown is abandoned (leaked, small) rather than destroyed.
std::atomic<int64_t> shutdowns{0};

template <typename T>
void drop(std::unique_ptr<T>& object, int64_t generation) {
  if (generation != shutdowns.load()) {
    (void)object.release();
  } else {
    reset_without_gil(object);
  }
}

struct ContextHandle {
  std::unique_ptr<dist_autograd::Context> context;
  int64_t id = -1;
  int64_t generation = shutdowns.load();
  ~ContextHandle() { drop(context, generation); }
};

struct OptimizerHandle {
  std::unique_ptr<DistributedOptimizer> optimizer;
  int64_t generation = shutdowns.load();
  ~OptimizerHandle() { drop(optimizer, generation); }
};

}  // namespace
}  // namespace python
}  // namespace drpc

PYBIND11_MODULE(_drpc, m) {
  using namespace drpc;
  using namespace drpc::python;
  m.doc() = "drpc's C++ API; use the `drpc` package instead.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object exc = python_exception(std::current_exception());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  m.def("_set_error_types", [](py::object base, py::dict by_kind) {
    auto& types = error_types();
    types.base = base.release().ptr();
    for (auto kv : by_kind) {
      types.by_kind[kv.first.cast<std::string>()] = py::reinterpret_borrow<py::object>(kv.second).release().ptr();
    }
  });

  py::class_<WorkerInfo>(m, "WorkerInfo")
      .def_readonly("name", &WorkerInfo::name)
      .def_readonly("id", &WorkerInfo::id)
      .def("__eq__", [](const WorkerInfo& a, const WorkerInfo& b) { return a.name == b.name && a.id == b.id; })
      .def("__hash__", [](const WorkerInfo& w) { return std::hash<std::string>()(w.name); })
      .def("__repr__",
           [](const WorkerInfo& w) { return "WorkerInfo(id=" + std::to_string(w.id) + ", name=" + w.name + ")"; });

  m.def(
      "init_rpc",
      [](const std::string& name, int rank, int world_size, const std::string& master_addr, int master_port,
         double rpc_timeout, double init_timeout, int num_worker_threads, const std::string& token,
         const std::string& tls_cert, const std::string& tls_key, const std::string& tls_ca,
         const std::string& tls_server_name, double heartbeat_interval, int heartbeat_misses,
         const std::string& listen_host, const std::string& advertise_host, bool host_store) {
        Options options;
        options.master_addr = master_addr;
        options.master_port = master_port;
        options.rpc_timeout = to_timeout(rpc_timeout);
        if (options.rpc_timeout.count() < 0) options.rpc_timeout = Options().rpc_timeout;
        options.init_timeout = to_timeout(init_timeout);
        if (options.init_timeout.count() <= 0) options.init_timeout = Options().init_timeout;
        options.num_worker_threads = num_worker_threads;
        options.token = token;
        options.tls_cert_file = tls_cert;
        options.tls_key_file = tls_key;
        options.tls_ca_file = tls_ca;
        options.tls_server_name = tls_server_name;
        options.heartbeat_interval = std::chrono::milliseconds(static_cast<int64_t>(heartbeat_interval * 1000));
        options.heartbeat_misses = heartbeat_misses;
        options.listen_host = listen_host;
        options.advertise_host = advertise_host;
        options.host_store = host_store;
        py::gil_scoped_release nogil;
        init_rpc(name, rank, world_size, options);
      },
      py::arg("name"), py::arg("rank"), py::arg("world_size"), py::arg("master_addr"), py::arg("master_port"),
      py::arg("rpc_timeout"), py::arg("init_timeout"), py::arg("num_worker_threads"), py::arg("token"),
      py::arg("tls_cert"), py::arg("tls_key"), py::arg("tls_ca"), py::arg("tls_server_name"),
      py::arg("heartbeat_interval"), py::arg("heartbeat_misses"), py::arg("listen_host"),
      py::arg("advertise_host"), py::arg("host_store"));
  m.def("read_token", [](const std::string& file) { return read_token(file); }, py::arg("file") = "");
  m.def(
      "shutdown",
      [](bool graceful, double timeout) {
        ++shutdowns;  // first: what is dropped while it runs must not reach the runtime either
        py::gil_scoped_release nogil;
        shutdown(graceful, to_timeout(timeout < 0 ? 0 : timeout));
      },
      py::arg("graceful") = true, py::arg("timeout") = 0.0);
  m.def("is_initialized", []() {
    try {
      current_runtime();
      return true;
    } catch (const Error&) {
      return false;
    }
  });
  m.def("get_worker_info", []() { return get_worker_info(); });
  m.def("get_worker_info", [](const std::string& name) { return get_worker_info(name); });
  m.def("get_worker_info_by_rank", &worker_by_rank);
  m.def("get_worker_infos", []() { return get_worker_infos(); });
  m.def("set_rpc_timeout", [](double seconds) { set_rpc_timeout(to_timeout(seconds < 0 ? 0 : seconds)); });
  m.def("get_rpc_timeout", []() { return get_rpc_timeout().count() / 1000.0; });

  m.def("rpc_sync", [](const std::string& to, const std::string& fn, py::tuple args, py::dict kwargs, double timeout) {
    auto a = to_args(args, fn);
    auto k = to_kwargs(kwargs, fn);
    c10::IValue result;
    {
      py::gil_scoped_release nogil;
      result = rpc_sync(to, fn, std::move(a), std::move(k), to_timeout(timeout));
    }
    return to_python(result);
  });
  m.def("rpc_async", [](const std::string& to, const std::string& fn, py::tuple args, py::dict kwargs,
                        double timeout, py::object target) {
    auto a = to_args(args, fn);
    auto k = to_kwargs(kwargs, fn);
    FuturePtr future;
    {
      py::gil_scoped_release nogil;
      future = rpc_async(to, fn, std::move(a), std::move(k), to_timeout(timeout));
    }
    complete_later(future, std::move(target));
  });
  m.def("remote", [](const std::string& to, const std::string& fn, py::tuple args, py::dict kwargs, double timeout) {
    auto a = to_args(args, fn);
    auto k = to_kwargs(kwargs, fn);
    py::gil_scoped_release nogil;
    return RRefHandle{remote(to, fn, std::move(a), std::move(k), to_timeout(timeout))};
  });

  m.def("register_function", [](const std::string& name, py::object fn) {
    auto held = std::make_shared<GilObject>(std::move(fn));
    FunctionRegistry::process_wide().add_async(name,
                                               [name, held](CallArgs& call) { return call_python(name, held, call); });
  });

  py::class_<RRefHandle>(m, "RRef")
      .def(py::init([](py::object value) {
             c10::IValue v = to_ivalue(value, "RRef(value)", /*allow_objects=*/true);
             py::gil_scoped_release nogil;
             return RRefHandle{RRef::make_local(std::move(v))};
           }),
           py::arg("value"))
      .def("to_here",
           [](const RRefHandle& r, double timeout) {
             c10::IValue v;
             {
               py::gil_scoped_release nogil;
               v = r.rref.to_here(to_timeout(timeout));
             }
             return to_python(v);
           },
           py::arg("timeout") = -1.0)
      .def("local_value",
           [](const RRefHandle& r) {
             c10::IValue v;
             {
               py::gil_scoped_release nogil;
               v = r.rref.local_value();
             }
             return to_python(v);
           })
      .def("owner", [](const RRefHandle& r) { return WorkerInfo{r.rref.owner_name(), r.rref.owner()}; })
      .def("owner_name", [](const RRefHandle& r) { return r.rref.owner_name(); })
      .def("is_owner", [](const RRefHandle& r) { return r.rref.is_owner(); })
      .def("confirmed_by_owner", [](const RRefHandle& r) { return r.rref.confirmed_by_owner(); })
      .def("_rpc_sync",
           [](const RRefHandle& r, const std::string& fn, py::tuple args, py::dict kwargs, double timeout) {
             auto a = to_args(args, fn);
             auto k = to_kwargs(kwargs, fn);
             c10::IValue result;
             {
               py::gil_scoped_release nogil;
               result = r.rref.rpc_sync(fn, std::move(a), std::move(k), to_timeout(timeout));
             }
             return to_python(result);
           })
      .def("_rpc_async",
           [](const RRefHandle& r, const std::string& fn, py::tuple args, py::dict kwargs, double timeout,
              py::object target) {
             auto a = to_args(args, fn);
             auto k = to_kwargs(kwargs, fn);
             FuturePtr future;
             {
               py::gil_scoped_release nogil;
               future = r.rref.rpc_async(fn, std::move(a), std::move(k), to_timeout(timeout));
             }
             complete_later(future, std::move(target));
           })
      .def("_remote",
           [](const RRefHandle& r, const std::string& fn, py::tuple args, py::dict kwargs, double timeout) {
             auto a = to_args(args, fn);
             auto k = to_kwargs(kwargs, fn);
             py::gil_scoped_release nogil;
             return RRefHandle{r.rref.remote(fn, std::move(a), std::move(k), to_timeout(timeout))};
           })
      .def("_id", [](const RRefHandle& r) { return r.rref.impl().id_string(); });

  py::class_<ContextHandle>(m, "AutogradContext")
      .def(py::init([]() {
        auto c = std::make_unique<ContextHandle>();
        py::gil_scoped_release nogil;
        c->context = std::make_unique<dist_autograd::Context>();
        c->id = c->context->id();
        return c;
      }))
      .def_readonly("id", &ContextHandle::id)
      .def("close", [](ContextHandle& c) { drop(c.context, c.generation); });

  m.def(
      "backward",
      [](int64_t context_id, std::vector<at::Tensor> roots, bool retain_graph) {
        py::gil_scoped_release nogil;
        dist_autograd::backward(context_id, roots, retain_graph);
      },
      py::arg("context_id"), py::arg("roots"), py::arg("retain_graph") = false);
  m.def("get_gradients", [](int64_t context_id) {
    c10::Dict<at::Tensor, at::Tensor> grads;
    {
      py::gil_scoped_release nogil;
      grads = dist_autograd::get_gradients(context_id);
    }
    py::dict out;
    for (const auto& entry : grads) {
      out[py::reinterpret_steal<py::object>(THPVariable_Wrap(entry.key()))] =
          py::reinterpret_steal<py::object>(THPVariable_Wrap(entry.value()));
    }
    return out;
  });

  py::class_<OptimizerHandle>(m, "DistributedOptimizer")
      .def(py::init([](const std::string& kind, double lr, double momentum, double weight_decay, double beta1,
                       double beta2, double eps, const std::vector<RRefHandle>& params) {
        OptimizerSpec spec;
        spec.kind = kind;
        spec.lr = lr;
        spec.momentum = momentum;
        spec.weight_decay = weight_decay;
        spec.beta1 = beta1;
        spec.beta2 = beta2;
        spec.eps = eps;
        std::vector<RRef> rrefs;
        for (const auto& p : params) rrefs.push_back(p.rref);
        auto o = std::make_unique<OptimizerHandle>();
        py::gil_scoped_release nogil;
        o->optimizer = std::make_unique<DistributedOptimizer>(spec, rrefs);
        return o;
      }))
      .def("step", [](OptimizerHandle& o, int64_t context_id) {
        if (!o.optimizer) throw Error(ErrorKind::kShutdown, "the optimizer was closed");
        if (o.generation != shutdowns.load()) throw Error(ErrorKind::kShutdown, "drpc was shut down");
        py::gil_scoped_release nogil;
        o.optimizer->step(context_id);
      })
      .def("close", [](OptimizerHandle& o) { drop(o.optimizer, o.generation); });
}
