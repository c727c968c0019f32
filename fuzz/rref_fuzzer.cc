// The RRef protocol's handlers (rref/rref_context.cc: remote call, fetch, user delete,
// fork request, child accept, apply, control batch, and child accepts riding on any other
// message) on hostile messages from a peer, in a real job (see world.h): whatever arrives
// gets a reply or an error, never a crash or a hang.

#include <cstdint>

#include "fuzz/world.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  drpc::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  drpc::fuzz::run_message_input(data, size, [](const drpc::rpc::Envelope& e) {
    return (e.type() >= drpc::kRRefRemoteCall && e.type() <= drpc::kRRefControlBatch) ||
           e.extensions().count(drpc::kRRefCarriedControls) > 0;
  });
  return 0;
}
