#pragma once

#include <ATen/core/ivalue.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "rpc/rpc_agent.h"

namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace drpc {

// The arguments of one call, as they arrived.
struct CallArgs {
  std::vector<c10::IValue> args;
  std::vector<std::pair<std::string, c10::IValue>> kwargs;
};

// What a worker can be asked to run, by name:
//   "ns::op"              a builtin operator of libtorch's registry (aten::add, ...); the
//                         overload is chosen from the arguments, kwargs and defaults as
//                         TorchScript does
//   "torchscript:NAME"    forward() of the TorchScript module loaded as NAME
//   "torchscript:NAME:M"  its method M
//   anything else         a C++ function registered under that name
// Thread-safe: functions may be registered while others are called (Python modules
// register theirs when imported); a call sees a function once add() has returned.
class FunctionRegistry {
 public:
  using Function = std::function<c10::IValue(CallArgs& call)>;
  using AsyncFunction = std::function<FuturePtr(CallArgs& call)>;

  FunctionRegistry();
  ~FunctionRegistry();
  FunctionRegistry(const FunctionRegistry&) = delete;
  FunctionRegistry& operator=(const FunctionRegistry&) = delete;

  void add(const std::string& name, Function fn);
  void add_async(const std::string& name, AsyncFunction fn);
  // Loads a TorchScript file under `name`; throws kBadArgument if it cannot.
  void load_script(const std::string& name, const std::string& path);

  // Runs `name`; the future completes with the result or with an Error (kBadArgument for
  // unknown functions or arguments that do not fit, kRemote-worthy errors as thrown).
  // `where` names this worker in messages. Thread-safe.
  FuturePtr call(const std::string& name, CallArgs call, const std::string& where) const;

  // The registry that DRPC_REGISTER_FUNCTION fills, consulted after a worker's own.
  static FunctionRegistry& process_wide();

  // Runs the TorchScript method; used by the RRef layer on hosted modules too.
  static c10::IValue call_script(torch::jit::Module& module, const std::string& method, CallArgs& call);

 private:
  c10::IValue call_builtin(const std::string& name, CallArgs& call) const;

  struct BuiltinResolutions;
  const std::unique_ptr<BuiltinResolutions> builtins_;  // thread-safe on its own
  mutable std::mutex mu_;
  std::map<std::string, Function> functions_;
  std::map<std::string, AsyncFunction> async_functions_;
  std::map<std::string, std::shared_ptr<torch::jit::Module>> scripts_;
};

// --- typed C++ functions ----------------------------------------------------------------

namespace detail {

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, at::Tensor>) return "Tensor";
  else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_integral_v<T>) return "int";
  else if constexpr (std::is_same_v<T, std::string>) return "str";
  else if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) return "List[Tensor]";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "List[int]";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return "List[float]";
  else if constexpr (std::is_same_v<T, c10::IValue>) return "Any";
  else return "value";
}

template <typename T>
T from_ivalue(const c10::IValue& v, size_t index, const std::string& fn) {
  auto wrong = [&]() {
    return Error(ErrorKind::kBadArgument, fn + ": argument " + std::to_string(index) + " must be " +
                                              type_name<T>() + ", got " + v.type()->str());
  };
  if constexpr (std::is_same_v<T, c10::IValue>) {
    return v;
  } else if constexpr (std::is_same_v<T, at::Tensor>) {
    if (!v.isTensor()) throw wrong();
    return v.toTensor();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v.isBool()) throw wrong();
    return v.toBool();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (v.isDouble()) return static_cast<T>(v.toDouble());
    if (v.isInt()) return static_cast<T>(v.toInt());
    throw wrong();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.isInt()) throw wrong();
    return static_cast<T>(v.toInt());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.isString()) throw wrong();
    return v.toStringRef();
  } else {
    try {
      return v.to<T>();
    } catch (const std::exception&) {
      throw wrong();
    }
  }
}

template <typename F>
struct fn_traits : fn_traits<decltype(&F::operator())> {};
template <typename C, typename R, typename... A>
struct fn_traits<R (C::*)(A...) const> {
  using result = R;
  using args = std::tuple<std::decay_t<A>...>;
};
template <typename C, typename R, typename... A>
struct fn_traits<R (C::*)(A...)> : fn_traits<R (C::*)(A...) const> {};
template <typename R, typename... A>
struct fn_traits<R (*)(A...)> {
  using result = R;
  using args = std::tuple<std::decay_t<A>...>;
};

template <typename Args, size_t... I>
std::string signature(std::index_sequence<I...>) {
  std::string out;
  ((out += (I ? ", " : "") + std::string(type_name<std::tuple_element_t<I, Args>>())), ...);
  return "(" + out + ")";
}

template <typename Args, typename F, size_t... I>
auto invoke_with(F& f, CallArgs& call, const std::string& name, std::index_sequence<I...>) {
  (void)name;
  return f(from_ivalue<std::tuple_element_t<I, Args>>(call.args[I], I, name)...);
}

// Calls `f` with `call`'s positional arguments converted to its parameter types.
template <typename F>
auto invoke(F& f, CallArgs& call, const std::string& name) {
  using Args = typename fn_traits<F>::args;
  constexpr size_t n = std::tuple_size_v<Args>;
  if (!call.kwargs.empty()) {
    throw Error(ErrorKind::kBadArgument, name + " takes no keyword arguments (got '" + call.kwargs[0].first + "')");
  }
  if (call.args.size() != n) {
    throw Error(ErrorKind::kBadArgument, name + " takes " + std::to_string(n) + " arguments " +
                                             signature<Args>(std::make_index_sequence<n>()) + ", " +
                                             std::to_string(call.args.size()) + " given");
  }
  return invoke_with<Args>(f, call, name, std::make_index_sequence<n>());
}

template <typename F>
FunctionRegistry::Function wrap(std::string name, F f) {
  return [name, f](CallArgs& call) mutable -> c10::IValue {
    using R = typename fn_traits<F>::result;
    if constexpr (std::is_void_v<R>) {
      invoke(f, call, name);
      return c10::IValue();
    } else {
      return c10::IValue(invoke(f, call, name));
    }
  };
}

template <typename F>
FunctionRegistry::AsyncFunction wrap_async(std::string name, F f) {
  return [name, f](CallArgs& call) mutable -> FuturePtr { return invoke(f, call, name); };
}

template <bool Async>
struct Registrar {
  template <typename F>
  Registrar(const char* name, F f) {
    if constexpr (Async) {
      FunctionRegistry::process_wide().add_async(name, wrap_async(name, std::move(f)));
    } else {
      FunctionRegistry::process_wide().add(name, wrap(name, std::move(f)));
    }
  }
};

}  // namespace detail

#define DRPC_CONCAT_INNER(a, b) a##b
#define DRPC_CONCAT(a, b) DRPC_CONCAT_INNER(a, b)

// Registers a C++ callable (a lambda or function) under NAME for every worker of this
// binary. Its parameters (Tensor, float, int, bool, str, lists, c10::IValue) are checked
// against what arrives, and its result (or void) is sent back.
#define DRPC_REGISTER_FUNCTION(NAME, ...) \
  static ::drpc::detail::Registrar<false> DRPC_CONCAT(drpc_registrar_, __COUNTER__)(NAME, __VA_ARGS__)

// The same for a callable returning a c10::intrusive_ptr<c10::ivalue::Future>: the reply
// goes out when the future completes, and no thread waits for it meanwhile.
#define DRPC_REGISTER_ASYNC_FUNCTION(NAME, ...) \
  static ::drpc::detail::Registrar<true> DRPC_CONCAT(drpc_registrar_, __COUNTER__)(NAME, __VA_ARGS__)

}  // namespace drpc
