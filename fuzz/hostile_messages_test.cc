// What the fuzzers found in the handlers, pinned down: a peer's hostile message gets an
// error of the right kind naming the problem, and the worker keeps serving.

#include <gtest/gtest.h>

#include <mutex>

#include "fuzz/world.h"

namespace drpc {
namespace fuzz {
namespace {

using std::chrono::milliseconds;

// Found by rref_fuzzer: a remote call repeating an existing RRef's id completed the
// owner's value twice, and the exception escaped a handler thread (std::terminate).
TEST(HostileMessages, ARepeatedRemoteCallIsAProtocolErrorAndTheOwnerLivesOn) {
  std::mutex mu;
  Message creation;  // the remote call that created rank 1's parameter on worker0
  World world([&](const WorkerInfo&, const Message& m) {
    std::lock_guard<std::mutex> lock(mu);
    if (m.type == kRRefRemoteCall && creation.payload.empty()) creation = m;
  });
  world.build_state();
  Message again;
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_FALSE(creation.payload.empty());
    again = creation;
  }
  RpcAgent& peer = world.agent(1);
  FuturePtr reply = peer.send(peer.worker(0), again, milliseconds(10000), "repeated remote call");
  reply->wait();
  ASSERT_TRUE(reply->hasError());
  try {
    std::rethrow_exception(reply->exception_ptr());
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kProtocol);
    EXPECT_NE(e.message().find("remote call for RRef 1:0, which already has a value"), std::string::npos)
        << e.message();
  }
  // worker0 still serves.
  RRef fresh = world.rref(1).remote(peer.worker(0), "fuzz.param", {}, {}, milliseconds(10000));
  EXPECT_TRUE(fresh.to_here(milliseconds(10000)).isTensor());
}

}  // namespace
}  // namespace fuzz
}  // namespace drpc
