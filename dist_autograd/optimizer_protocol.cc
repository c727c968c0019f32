#include "dist_autograd/optimizer_protocol.h"

#include <ATen/core/Dict.h>

#include <map>
#include <set>

namespace drpc {
namespace optimizer_protocol {
namespace {

const std::set<std::string>& spec_fields() {
  static const std::set<std::string> fields = {"kind", "lr", "momentum", "beta1", "beta2", "eps", "weight_decay"};
  return fields;
}

}  // namespace

c10::IValue encode_spec(const OptimizerSpec& spec) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert(std::string("kind"), spec.kind);
  dict.insert(std::string("lr"), spec.lr);
  dict.insert(std::string("momentum"), spec.momentum);
  dict.insert(std::string("beta1"), spec.beta1);
  dict.insert(std::string("beta2"), spec.beta2);
  dict.insert(std::string("eps"), spec.eps);
  dict.insert(std::string("weight_decay"), spec.weight_decay);
  return dict;
}

OptimizerSpec decode_spec(const c10::IValue& value) {
  if (!value.isGenericDict()) {
    throw Error(ErrorKind::kBadArgument, std::string("an optimizer spec is a dict of its fields, not ") + value.tagKind());
  }
  std::map<std::string, c10::IValue> fields;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) throw Error(ErrorKind::kBadArgument, "an optimizer spec's keys are field names");
    const std::string name = entry.key().toStringRef();
    if (!spec_fields().count(name)) throw Error(ErrorKind::kBadArgument, "unknown optimizer spec field '" + name + "'");
    fields[name] = entry.value();
  }
  auto field = [&](const std::string& name) -> const c10::IValue& {
    auto it = fields.find(name);
    if (it == fields.end()) throw Error(ErrorKind::kBadArgument, "the optimizer spec has no field '" + name + "'");
    return it->second;
  };
  auto number = [&](const std::string& name) {
    const c10::IValue& v = field(name);
    if (!v.isDouble() && !v.isInt()) {
      throw Error(ErrorKind::kBadArgument, "optimizer spec field '" + name + "' is a number, not " + v.tagKind());
    }
    return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
  };
  OptimizerSpec spec;
  const c10::IValue& kind = field("kind");
  if (!kind.isString()) throw Error(ErrorKind::kBadArgument, "optimizer spec field 'kind' is a string");
  spec.kind = kind.toStringRef();
  spec.lr = number("lr");
  spec.momentum = number("momentum");
  spec.beta1 = number("beta1");
  spec.beta2 = number("beta2");
  spec.eps = number("eps");
  spec.weight_decay = number("weight_decay");
  return spec;
}

}  // namespace optimizer_protocol

RemoteOptimizers::RemoteOptimizers(Call call, const OptimizerSpec& spec, const std::vector<RRef>& params)
    : call_(std::move(call)) {
  std::map<std::string, c10::impl::GenericList> by_owner;
  for (const auto& p : params) {
    auto it = by_owner.find(p.owner_name());
    if (it == by_owner.end()) it = by_owner.emplace(p.owner_name(), c10::impl::GenericList(c10::AnyType::get())).first;
    it->second.push_back(p.to_ivalue());
  }
  const c10::IValue encoded = optimizer_protocol::encode_spec(spec);
  std::vector<std::pair<std::string, FuturePtr>> created;
  for (auto& [owner, list] : by_owner) {
    created.emplace_back(owner, call_(owner, optimizer_protocol::kCreate, {encoded, list}));
  }
  std::exception_ptr first_error;
  for (auto& [owner, future] : created) {
    future->wait();
    if (future->hasError()) {
      if (!first_error) first_error = future->exception_ptr();
    } else {
      optimizers_.emplace_back(owner, future->value().toInt());
    }
  }
  if (first_error) {
    release_all();  // the ones that were created go again
    std::rethrow_exception(first_error);
  }
}

RemoteOptimizers::~RemoteOptimizers() { release_all(); }

void RemoteOptimizers::release_all() {
  std::vector<FuturePtr> released;
  for (const auto& [owner, id] : optimizers_) {
    try {
      released.push_back(call_(owner, optimizer_protocol::kRelease, {id}));
    } catch (const std::exception&) {
      // stopped: nothing to release
    }
  }
  optimizers_.clear();
  for (auto& f : released) f->wait();  // errors (a gone owner) leave nothing to release
}

void RemoteOptimizers::step(int64_t context_id) {
  std::vector<FuturePtr> steps;
  for (const auto& [owner, id] : optimizers_) steps.push_back(call_(owner, optimizer_protocol::kStep, {id, context_id}));
  for (auto& f : steps) f->wait();
  for (auto& f : steps) {
    if (f->hasError()) std::rethrow_exception(f->exception_ptr());
  }
}

}  // namespace drpc
