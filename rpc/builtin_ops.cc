// Calling libtorch's builtin operators by qualified name, choosing the overload from the
// arguments as TorchScript does.

#include <ATen/core/function_schema.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <optional>
#include <unordered_map>

#include "rpc/function_registry.h"

namespace drpc {
namespace {

// Whether `value` can be passed as `type`; with `convert`, also after the conversions
// Python users expect (int where float is wanted). May rewrite `value`.
// Whether `value` is a `type`, told from their kinds alone for the common cases (building
// a tensor's type computes its sizes and strides); nullopt when that takes the full type.
std::optional<bool> is_subtype_by_kind(const c10::IValue& value, const c10::Type& type) {
  using K = c10::TypeKind;
  const K kind = type.kind();
  const bool scalar_param = kind == K::IntType || kind == K::FloatType || kind == K::BoolType ||
                            kind == K::NumberType || kind == K::StringType;
  if (value.isTensor()) {
    if (kind == K::TensorType) return true;
    if (scalar_param) return false;
  } else if (value.isInt() || value.isDouble() || value.isBool() || value.isString()) {
    if (kind == K::TensorType) return false;
    if (kind == K::IntType) return value.isInt();
    if (kind == K::FloatType) return value.isDouble();
    if (kind == K::BoolType) return value.isBool();
    if (kind == K::NumberType) return value.isInt() || value.isDouble();
    if (kind == K::StringType) return value.isString();
  }
  return std::nullopt;
}

bool fits(c10::IValue& value, const c10::TypePtr& type, bool convert) {
  const std::optional<bool> by_kind = is_subtype_by_kind(value, *type);
  if (by_kind ? *by_kind : value.type()->isSubtypeOf(*type)) return true;
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

// What overload resolution depends on, for the argument kinds it can be cached for:
// appends one letter per value and returns false for any other kind (a tuple, a dict, a
// generic list, ...), which is then resolved afresh each time.
bool append_kind(const c10::IValue& v, std::string* key) {
  char k = 0;
  if (v.isTensor()) k = 'T';
  else if (v.isInt()) k = 'i';
  else if (v.isDouble()) k = 'd';
  else if (v.isBool()) k = 'b';
  else if (v.isString()) k = 's';
  else if (v.isNone()) k = 'n';
  else if (v.isIntList()) k = 'I';
  else if (v.isDoubleList()) k = 'D';
  else if (v.isBoolList()) k = 'B';
  else if (v.isTensorList()) k = 'L';
  if (!k) return false;
  *key += k;
  return true;
}

// "name(kinds;kwarg=kind...)", or "" if the call cannot be cached.
std::string resolution_key(const std::string& name, const CallArgs& call) {
  std::string key = name;
  key += '(';
  for (const auto& a : call.args) {
    if (!append_kind(a, &key)) return "";
  }
  for (const auto& [k, v] : call.kwargs) {
    key += ';' + k + '=';
    if (!append_kind(v, &key)) return "";
  }
  return key;
}

std::string describe_args(const CallArgs& call) {
  std::string out;
  for (const auto& a : call.args) out += (out.empty() ? "" : ", ") + a.type()->str();
  for (const auto& [k, v] : call.kwargs) out += (out.empty() ? "" : ", ") + k + "=" + v.type()->str();
  return "(" + out + ")";
}

}  // namespace

// The overloads chosen so far, by name and argument kinds: the first that fits stays the
// first for arguments of the same kinds, so later calls bind it directly. Invalidated per
// entry when operators are registered under that name afterwards (TorchScript, extensions).
struct FunctionRegistry::BuiltinResolutions {
  struct Chosen {
    std::shared_ptr<torch::jit::Operator> op;
    bool convert = false;
    size_t overloads = 0;  // how many the name had when it was chosen
  };
  std::mutex mu;
  std::unordered_map<std::string, Chosen> chosen;
};

FunctionRegistry::FunctionRegistry() : builtins_(std::make_unique<BuiltinResolutions>()) {}
FunctionRegistry::~FunctionRegistry() = default;

namespace {

c10::IValue run(const torch::jit::Operator& op, torch::jit::Stack& stack) {
  op.getOperation()(stack);
  const size_t n = op.schema().returns().size();
  if (n == 0) return c10::IValue();
  if (n == 1) return stack.back();
  std::vector<c10::IValue> results(stack.end() - n, stack.end());
  return c10::ivalue::Tuple::create(std::move(results));
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
  const std::string key = resolution_key(name, call);
  if (!key.empty()) {
    BuiltinResolutions::Chosen chosen;
    {
      std::lock_guard<std::mutex> lock(builtins_->mu);
      auto it = builtins_->chosen.find(key);
      if (it != builtins_->chosen.end() && it->second.overloads == ops.size()) chosen = it->second;
    }
    if (chosen.op) {
      if (auto stack = bind(chosen.op->schema(), call, chosen.convert)) return run(*chosen.op, *stack);
    }
  }
  for (bool convert : {false, true}) {
    for (const auto& op : ops) {
      const c10::FunctionSchema& schema = op->schema();
      if (writes_out_argument(schema)) continue;
      auto stack = bind(schema, call, convert);
      if (!stack) continue;
      if (!key.empty()) {
        std::lock_guard<std::mutex> lock(builtins_->mu);
        builtins_->chosen[key] = BuiltinResolutions::Chosen{op, convert, ops.size()};
      }
      return run(*op, *stack);
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
