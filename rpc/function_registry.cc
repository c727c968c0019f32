#include "rpc/function_registry.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

namespace drpc {
namespace {

const char kScriptPrefix[] = "torchscript:";

FuturePtr completed(c10::IValue value) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  future->markCompleted(std::move(value));
  return future;
}

FuturePtr failed(std::exception_ptr error) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  future->setError(std::move(error));
  return future;
}

}  // namespace

// The constructor and destructor are in builtin_ops.cc, beside BuiltinResolutions.

FunctionRegistry& FunctionRegistry::process_wide() {
  static FunctionRegistry* registry = new FunctionRegistry();  // never destroyed: used by static registrars
  return *registry;
}

void FunctionRegistry::add(const std::string& name, Function fn) {
  std::lock_guard<std::mutex> lock(mu_);
  functions_[name] = std::move(fn);
}

void FunctionRegistry::add_async(const std::string& name, AsyncFunction fn) {
  std::lock_guard<std::mutex> lock(mu_);
  async_functions_[name] = std::move(fn);
}

void FunctionRegistry::load_script(const std::string& name, const std::string& path) {
  std::shared_ptr<torch::jit::Module> module;
  try {
    module = std::make_shared<torch::jit::Module>(torch::jit::load(path));
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::kBadArgument, "cannot load TorchScript '" + path + "': " + e.what_without_backtrace());
  }
  std::lock_guard<std::mutex> lock(mu_);
  scripts_[name] = std::move(module);
}

c10::IValue FunctionRegistry::call_script(torch::jit::Module& module, const std::string& method, CallArgs& call) {
  auto m = module.find_method(method);
  if (!m) throw Error(ErrorKind::kBadArgument, "the TorchScript module has no method '" + method + "'");
  torch::jit::Kwargs kwargs(call.kwargs.begin(), call.kwargs.end());
  return (*m)(call.args, kwargs);
}

FuturePtr FunctionRegistry::call(const std::string& name, CallArgs call, const std::string& where) const {
  try {
    Function fn;
    AsyncFunction async_fn;
    std::shared_ptr<torch::jit::Module> script;
    std::string method = "forward";
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = functions_.find(name); it != functions_.end()) fn = it->second;
      if (auto it = async_functions_.find(name); it != async_functions_.end()) async_fn = it->second;
      if (name.rfind(kScriptPrefix, 0) == 0) {
        std::string rest = name.substr(sizeof(kScriptPrefix) - 1);
        const size_t colon = rest.find(':');
        if (colon != std::string::npos) {
          method = rest.substr(colon + 1);
          rest = rest.substr(0, colon);
        }
        auto it = scripts_.find(rest);
        if (it == scripts_.end()) {
          throw Error(ErrorKind::kBadArgument, "no TorchScript module '" + rest + "' is loaded on " + where);
        }
        script = it->second;
      }
    }
    if (this != &process_wide() && !fn && !async_fn && !script) {
      const FunctionRegistry& global = process_wide();
      std::lock_guard<std::mutex> lock(global.mu_);
      if (auto it = global.functions_.find(name); it != global.functions_.end()) fn = it->second;
      if (auto it = global.async_functions_.find(name); it != global.async_functions_.end()) async_fn = it->second;
    }
    if (async_fn) return async_fn(call);
    if (fn) return completed(fn(call));
    if (script) return completed(call_script(*script, method, call));
    if (name.find("::") != std::string::npos) return completed(call_builtin(name, call));
    throw Error(ErrorKind::kBadArgument, "unknown function '" + name + "' on " + where);
  } catch (const Error&) {
    return failed(std::current_exception());
  } catch (const c10::Error& e) {
    return failed(std::make_exception_ptr(
        Error(ErrorKind::kRemote, name + " raised on " + where + ": " + e.what_without_backtrace())));
  } catch (const std::exception& e) {
    return failed(std::make_exception_ptr(Error(ErrorKind::kRemote, name + " raised on " + where + ": " + e.what())));
  }
}

}  // namespace drpc
