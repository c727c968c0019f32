#pragma once

// An RRef's or a fork's id (its creating worker and a counter there), its wire form, and
// the protocol's control messages, which name them.

#include <cstdint>
#include <string>
#include <tuple>

#include "rref/proto/rref.pb.h"

namespace drpc {
namespace rref_internal {

struct Id {
  int worker = -1;
  int64_t local = -1;
  bool operator<(const Id& o) const { return std::tie(worker, local) < std::tie(o.worker, o.local); }
  bool operator==(const Id& o) const { return worker == o.worker && local == o.local; }
  std::string str() const { return std::to_string(worker) + ":" + std::to_string(local); }
};

// A control message of the protocol, to worker `to`.
struct Control {
  int to = -1;
  int32_t type = 0;  // kRRefForkRequest, kRRefChildAccept, kRRefUserDelete
  Id rref, fork;
};

inline Id from_proto(const rref::Id& p) { return Id{p.worker(), p.local()}; }
inline void to_proto(const Id& id, rref::Id* p) {
  p->set_worker(id.worker);
  p->set_local(id.local);
}
// Appends `c` to a batch of controls (kRRefControlBatch, or controls riding on a message).
inline void add_to_batch(const Control& c, rref::ControlBatch* batch) {
  auto* item = batch->add_items();
  item->set_type(c.type);
  to_proto(c.rref, item->mutable_control()->mutable_rref());
  to_proto(c.fork, item->mutable_control()->mutable_fork());
}

}  // namespace rref_internal
}  // namespace drpc
