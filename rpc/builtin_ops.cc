// Calling libtorch's builtin operators by qualified name, choosing the overload from the
// arguments as TorchScript does.

#include <ATen/core/function_schema.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <optional>

#include "rpc/function_registry.h"

namespace drpc {
namespace {

// Whether `value` can be passed as `type`; with `convert`, also after the conversions
// Python users expect (int where float is wanted). May rewrite `value`.
bool fits(c10::IValue& value, const c10::TypePtr& type, bool convert) {
  if (value.type()->isSubtypeOf(*type)) return true;
  if (!convert) return false;
  if (auto optional = type->cast<c10::OptionalType>()) {
    return value.isNone() || fits(value, optional->getElementType(), convert);
  }
  if (type->kind() == c10::TypeKind::FloatType && value.isInt()) {
    value = static_cast<double>(value.toInt());
    return true;
  }
  if (type->kind() == c10::TypeKind::ListType && value.isInt()) {
    // "int[2] stride=2": a single int stands for the whole list, as in Python.
    auto list = type->cast<c10::ListType>();
    if (list->getElementType()->kind() == c10::TypeKind::IntType) {
      value = c10::List<int64_t>({value.toInt()});
      return true;
    }
  }
  return false;
}

bool writes_out_argument(const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    if (arg.kwarg_only() && arg.alias_info() && arg.alias_info()->isWrite()) return true;
  }
  return false;
}

// The stack for `schema`, or nullopt if the arguments do not fit it.
std::optional<torch::jit::Stack> bind(const c10::FunctionSchema& schema, const CallArgs& call, bool convert) {
  const auto& params = schema.arguments();
  if (schema.is_vararg() || call.args.size() > params.size()) return std::nullopt;
  torch::jit::Stack stack;
  size_t kwargs_used = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& param = params[i];
    c10::IValue value;
    if (i < call.args.size()) {
      if (param.kwarg_only()) return std::nullopt;
      value = call.args[i];
    } else {
      auto kw = std::find_if(call.kwargs.begin(), call.kwargs.end(),
                             [&](const auto& kv) { return kv.first == param.name(); });
      if (kw != call.kwargs.end()) {
        value = kw->second;
        ++kwargs_used;
      } else if (param.default_value()) {
        value = *param.default_value();
      } else {
        return std::nullopt;
      }
    }
    if (!fits(value, param.type(), convert)) return std::nullopt;
    stack.push_back(std::move(value));
  }
  if (kwargs_used != call.kwargs.size()) return std::nullopt;
  return stack;
}

std::string describe_args(const CallArgs& call) {
  std::string out;
  for (const auto& a : call.args) out += (out.empty() ? "" : ", ") + a.type()->str();
  for (const auto& [k, v] : call.kwargs) out += (out.empty() ? "" : ", ") + k + "=" + v.type()->str();
  return "(" + out + ")";
}

}  // namespace

c10::IValue FunctionRegistry::call_builtin(const std::string& name, CallArgs& call) const {
  c10::Symbol symbol;
  try {
    symbol = c10::Symbol::fromQualString(name);
  } catch (const c10::Error&) {
    throw Error(ErrorKind::kBadArgument, "'" + name + "' is not an operator name");
  }
  const auto& ops = torch::jit::getAllOperatorsFor(symbol);
  if (ops.empty()) throw Error(ErrorKind::kBadArgument, "unknown function '" + name + "'");
  for (bool convert : {false, true}) {
    for (const auto& op : ops) {
      const c10::FunctionSchema& schema = op->schema();
      if (writes_out_argument(schema)) continue;
      auto stack = bind(schema, call, convert);
      if (!stack) continue;
      op->getOperation()(*stack);
      const size_t n = schema.returns().size();
      if (n == 0) return c10::IValue();
      if (n == 1) return stack->back();
      std::vector<c10::IValue> results(stack->end() - n, stack->end());
      return c10::ivalue::Tuple::create(std::move(results));
    }
  }
  std::string candidates;
  for (const auto& op : ops) {
    if (!writes_out_argument(op->schema())) candidates += "\n  " + c10::toString(op->schema());
  }
  throw Error(ErrorKind::kBadArgument,
              "no overload of " + name + " takes " + describe_args(call) + "; candidates:" + candidates);
}

}  // namespace drpc
