// The protocol's control messages as the receiving side sees them (see context_impl.h):
// user deletes, fork requests and child accepts, alone, batched, or riding on another
// message, checked and applied to the ledger; and, on the sending side, the child
// accepts put on messages that leave anyway.

#include <glog/logging.h>

#include "common/error_wire.h"
#include "rref/context_impl.h"

namespace drpc {
namespace rref_internal {
namespace {

FuturePtr completed_message(Message m) {
  auto f = make_message_future();
  f->markCompleted(message_to_ivalue(std::move(m)));
  return f;
}

rref::Control parse_control(const Message& m, const char* what) {
  rref::Control control;
  if (!control.ParseFromString(m.payload)) throw Error(ErrorKind::kProtocol, std::string("malformed ") + what);
  return control;
}

// A peer's batch of controls. Throws kProtocol when the bytes are not one, or hold more
// than kMaxControlBatch items: a peer cannot make this worker apply (and answer) millions
// of items on its network thread.
rref::ControlBatch parse_control_batch(const std::string& bytes) {
  rref::ControlBatch batch;
  if (!batch.ParseFromString(bytes)) throw Error(ErrorKind::kProtocol, "malformed RRef control batch");
  if (batch.items_size() > kMaxControlBatch) {
    throw Error(ErrorKind::kProtocol, "an RRef control batch of " + std::to_string(batch.items_size()) +
                                          " items (at most " + std::to_string(kMaxControlBatch) + ")");
  }
  return batch;
}

// A user that passes an RRef to its owner in a call gets the owner's child accept back on
// the call's reply, not in a message of its own (and one answering it): two messages
// fewer per such call (RRefOptions::accept_carry_window).
//
// Controls ride only on messages the network cannot refuse: a payload far below the
// 16 MiB a frame's header may have, and tensors well within a frame's limits (65536
// tensors, 64 dimensions each), so that the header stays under 9 MiB. A refused carrier
// would take its controls with it, and the parent would keep its reference until shutdown.
constexpr size_t kCarrierPayloadLimit = 8u << 20;
constexpr size_t kCarrierMaxTensors = 1024;
constexpr int64_t kCarrierMaxDims = 64;

bool can_carry(const Message& m) {
  if (m.payload.size() > kCarrierPayloadLimit || m.tensors.size() > kCarrierMaxTensors) return false;
  for (const auto& t : m.tensors) {
    if (t.defined() && t.dim() > kCarrierMaxDims) return false;
  }
  return true;
}

}  // namespace

// --- the handlers of control messages ----------------------------------------------------------

FuturePtr ContextImpl::on_user_delete(const WorkerInfo& from, Message m) {
  apply_control(from, kRRefUserDelete, parse_control(m, "delete"));
  return completed_message(Message{kRRefUserDelete, "", {}});
}

FuturePtr ContextImpl::on_fork_request(const WorkerInfo& from, Message m) {
  apply_control(from, kRRefForkRequest, parse_control(m, "fork request"));
  return completed_message(Message{kRRefForkRequest, "", {}});
}

FuturePtr ContextImpl::on_child_accept(const WorkerInfo& from, Message m) {
  apply_control(from, kRRefChildAccept, parse_control(m, "child accept"));
  return completed_message(Message{kRRefChildAccept, "", {}});
}

// Each control as if it had come alone, in order; one failing does not stop the others.
FuturePtr ContextImpl::on_control_batch(const WorkerInfo& from, Message m) {
  const rref::ControlBatch batch = parse_control_batch(m.payload);
  rref::ControlOutcomes outcomes;
  for (const auto& item : batch.items()) {
    auto* outcome = outcomes.add_outcomes();
    try {
      apply_control(from, item.type(), item.control());
    } catch (const Error& e) {
      outcome->set_error_kind(to_wire(e.kind()));
      outcome->set_error(e.message());
    } catch (const std::exception& e) {  // the items before it were applied: this one alone failed
      outcome->set_error_kind(to_wire(ErrorKind::kInternal));
      outcome->set_error(e.what());
    }
  }
  return completed_message(Message{kRRefControlBatch, outcomes.SerializeAsString(), {}});
}

void ContextImpl::apply_control(const WorkerInfo& from, int32_t type, const rref::Control& control) {
  Outcome outcome;
  switch (type) {
    case kRRefUserDelete: {
      std::lock_guard<std::mutex> lock(mu_);
      outcome = apply_locked(ledger_.user_deleted(from_proto(control.rref()), from_proto(control.fork())));
      break;
    }
    case kRRefForkRequest: {
      auto owner = get_or_create_owner(from_proto(control.rref()), from);
      std::lock_guard<std::mutex> lock(mu_);
      add_fork_locked(owner, from_proto(control.fork()), from.id);  // idempotent
      return;
    }
    case kRRefChildAccept: {
      std::lock_guard<std::mutex> lock(mu_);
      outcome = apply_locked(ledger_.child_accepted(from_proto(control.fork())));
      break;
    }
    default:
      throw Error(ErrorKind::kProtocol, "RRef control of unknown type " + std::to_string(type));
  }
  finish(std::move(outcome));
}

// --- controls riding on other messages --------------------------------------------------------

void ContextImpl::carry_controls(const WorkerInfo& to, Message& m) {
  if (to.id == self().id || !controls_->has_carried() || !can_carry(m)) return;
  const std::vector<Control> carried = controls_->take_carried(to.id);
  if (carried.empty()) return;
  rref::ControlBatch wire;
  for (const Control& c : carried) add_to_batch(c, &wire);
  m.extensions[kRRefCarriedControls] = wire.SerializeAsString();
}

void ContextImpl::apply_carried_controls(const WorkerInfo& from, Message& m) {
  auto it = m.extensions.find(kRRefCarriedControls);
  if (it == m.extensions.end()) return;
  const std::string bytes = std::move(it->second);
  m.extensions.erase(it);  // the handler and the caller never see it
  rref::ControlBatch batch;
  try {
    batch = parse_control_batch(bytes);
  } catch (const Error& e) {
    LOG(WARNING) << self().name << ": dropped RRef controls riding on a message from " << from.name << ": "
                 << e.message();
    return;
  }
  for (const auto& item : batch.items()) {
    if (item.type() != kRRefChildAccept) {  // only accepts ride: anything else was not sent by drpc
      LOG(WARNING) << self().name << ": dropped an RRef control of type " << item.type() << " riding on a message from "
                   << from.name;
      continue;
    }
    try {
      apply_control(from, item.type(), item.control());
    } catch (const std::exception& e) {
      LOG(WARNING) << self().name << ": RRef control from " << from.name << ": " << e.what();
    }
  }
}

}  // namespace rref_internal
}  // namespace drpc
