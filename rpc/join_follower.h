#pragma once

// A worker's own part in the job-wide join (RpcAgent::join): its counts of requests sent
// and answered, the peers known gone, the rounds of its join() calls, and where reports and
// verdicts go (to the leader, the lowest live rank, or into this worker when it leads; the
// leader's decisions are JoinLeader's, rpc/join_protocol.h). No I/O and no lock of its
// own: the agent (rpc/process_group_agent.cc) calls it under its lock, waits, and sends
// the messages it returns.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rpc/join_protocol.h"

namespace drpc {

// A join message to send: `type` is kJoinReport or kJoinVerdict (rpc/message.h).
struct JoinMessage {
  int dst;
  int32_t type;
  std::string payload;
};

class JoinFollower {
 public:
  JoinFollower(int self, int world_size);
  JoinFollower(const JoinFollower&) = delete;
  JoinFollower& operator=(const JoinFollower&) = delete;

  // A request this worker sent to, or answered for, peer `rank` (not itself).
  void request_sent(int rank) { ++sent_to_.at(rank); }
  void request_answered(int rank) { ++answered_from_.at(rank); }

  // Peer `rank` is gone: no join waits for it; if it led, the next live rank leads.
  // Appends the verdicts that are now due.
  void peer_dead(int rank, std::vector<JoinMessage>* out);
  const std::vector<bool>& dead() const { return dead_; }
  int leader() const;

  // One join() call's progress.
  struct Call {
    int64_t generation = 0;
    int64_t round = 0;
    int reported_to = -1;  // the leader this round's report went to
  };
  Call begin() { return Call{++generation_}; }

  enum class Step { kQuiet, kReported, kWait };
  // What `call` does now, with this worker `idle` (no call pending, no request being
  // served): the job is quiet; or a report went out (appended to `out`, or handled here
  // when this worker leads): step again; or it waits for a verdict, a death or idleness.
  Step step(Call& call, bool idle, std::vector<JoinMessage>* out);

  // A join report or verdict (`type`) from `source`; appends what must be sent. False
  // (and nothing changes) when the payload is malformed.
  bool on_message(int source, int32_t type, const std::string& payload, std::vector<JoinMessage>* out);

 private:
  void on_report(int source, const rpc::JoinReport& report, std::vector<JoinMessage>* out);
  void route(std::vector<JoinVerdictFor> verdicts, std::vector<JoinMessage>* out);
  void on_verdict(const rpc::JoinVerdict& verdict);

  const int self_;
  std::vector<int64_t> sent_to_;        // requests sent, by rank (not to oneself)
  std::vector<int64_t> answered_from_;  // requests answered, by rank (not from oneself)
  std::vector<bool> dead_;              // peers known gone
  int64_t generation_ = 0;              // calls of join() so far
  int64_t done_generation_ = 0;         // the last join the leader declared done
  std::map<int64_t, int64_t> retry_;    // generation -> round a verdict asked for
  JoinLeader leader_;                   // the joins this worker led or leads
};

}  // namespace drpc
