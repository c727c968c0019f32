#pragma once

// How a call this worker made ends, on the caller's side: with its reply (a value or the
// callee's error) or without one (its deadline, its peer gone, a send failure, shutdown).
// Each ending counts in the metrics, closes a profiled call's spans and completes the
// call's future, with an error text that names the call and the peer. Part of the agent's
// implementation (rpc/process_group_agent.cc), which decides which ending a call gets.

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "rpc/pending_calls.h"
#include "rpc/proto/rpc.pb.h"
#include "rpc/rpc_agent.h"

namespace drpc {

class CallEndings {
 public:
  // `workers` names the peers by rank; `self` is this worker's rank.
  CallEndings(std::vector<WorkerInfo> workers, int self);
  CallEndings(const CallEndings&) = delete;
  CallEndings& operator=(const CallEndings&) = delete;

  // Before any call ends; either may be null. They must outlive this object's use.
  void set_instruments(Metrics* metrics, Tracer* tracer);

  // Each ends `call` (already out of the pending table) and completes its future. Thread-safe.
  void replied(PendingCall& call, const rpc::Envelope& envelope, Message reply, int64_t receipt_ns);
  void timed_out(PendingCall& call);
  void peer_gone(PendingCall& call, const std::string& reason);
  // kBadArgument when the message itself was refused (too large), else kPeerUnavailable.
  void not_sent(PendingCall& call, const std::exception_ptr& why);
  void shut_down(PendingCall& call);

 private:
  void failed(PendingCall& call, ErrorKind kind, const std::string& text);
  void record(const PendingCall& call, const rpc::Profile* profile, int64_t end_ns, const char* error);

  const std::vector<WorkerInfo> workers_;
  const int self_;
  Metrics* metrics_ = nullptr;
  Tracer* tracer_ = nullptr;
};

}  // namespace drpc
