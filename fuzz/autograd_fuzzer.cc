// Distributed autograd (dist_autograd/container.cc) on hostile messages from a peer, in a
// real job (see world.h): backward and release messages, and any message carrying an
// autograd context (recorded by the receive interceptor), get a reply or an error, never
// a crash or a hang.

#include <cstdint>

#include "fuzz/world.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  drpc::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  drpc::fuzz::run_message_input(data, size, [](const drpc::rpc::Envelope& e) {
    return e.type() == drpc::kAutogradBackward || e.type() == drpc::kAutogradRelease || e.extensions().count(drpc::kAutogradExtension) > 0;
  });
  return 0;
}
