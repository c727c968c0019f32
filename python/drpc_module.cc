// The `_drpc` extension module: binds drpc's public C++ API (drpc.h) to Python. Its parts:
// python/py_values.h (Python values <-> c10::IValues), python/py_errors.h (drpc::Error <->
// Python exceptions), python/py_functions.h (Python functions registered by name, run on
// drpc's handler threads) and python/py_objects.h (Python objects held from C++). The
// pure-Python package `drpc` (python/src/drpc) gives it torch.distributed.rpc's names.
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
#include <memory>
#include <string>
#include <vector>

#include "drpc.h"
#include "python/py_errors.h"
#include "python/py_functions.h"
#include "python/py_objects.h"
#include "python/py_values.h"

namespace py = pybind11;

namespace drpc {
namespace python {
namespace {

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

  // Global: a drpc error also surfaces through torch's own bindings, as when a
  // torch.futures.Future that rpc_async completed with one is waited on.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object exc = python_exception(std::current_exception());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
  // Local: torch's functions keep torch's own translation of its errors.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
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
         const std::string& listen_host, const std::string& advertise_host, bool host_store,
         const std::string& data_plane, int64_t shm_arena_mb) {
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
        options.data_plane = data_plane;
        options.shm_arena_mb = shm_arena_mb;
        py::gil_scoped_release nogil;
        init_rpc(name, rank, world_size, options);
      },
      py::arg("name"), py::arg("rank"), py::arg("world_size"), py::arg("master_addr"), py::arg("master_port"),
      py::arg("rpc_timeout"), py::arg("init_timeout"), py::arg("num_worker_threads"), py::arg("token"),
      py::arg("tls_cert"), py::arg("tls_key"), py::arg("tls_ca"), py::arg("tls_server_name"),
      py::arg("heartbeat_interval"), py::arg("heartbeat_misses"), py::arg("listen_host"),
      py::arg("advertise_host"), py::arg("host_store"), py::arg("data_plane") = "",
      py::arg("shm_arena_mb") = 512);
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
