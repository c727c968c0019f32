#pragma once

// The leader's side of the job-wide join (RpcAgent::join): no I/O and no lock of its own.
// Every idle worker reports, per peer, how many requests it sent and how many replies it
// answered; the leader (the lowest live rank) declares the job quiet when every live
// worker reported the same round and every request between live workers that one counted
// as sent the other counted as answered, and otherwise asks everyone for another round.
// The agent (rpc/process_group_agent.cc) validates reports, calls this under its lock and
// sends the verdicts it returns.

#include <cstdint>
#include <map>
#include <vector>

#include "rpc/proto/rpc.pb.h"

namespace drpc {

struct JoinVerdictFor {
  int dst;
  rpc::JoinVerdict verdict;
};

class JoinLeader {
 public:
  explicit JoinLeader(int world_size) : world_size_(world_size) {}

  // A report is usable when it counts every rank of the job and names a real join.
  static bool well_formed(const rpc::JoinReport& report, int world_size);

  // `report` (well formed) from `source`; `dead[r]` says rank r is gone. Appends the
  // verdicts to send (to `source` alone for a join already declared quiet; to every live
  // worker once the round is decided or a later round began).
  void on_report(int source, const rpc::JoinReport& report, const std::vector<bool>& dead,
                 std::vector<JoinVerdictFor>* out);

  // A worker died: the reports in hand for every join may now be complete.
  void on_peer_dead(const std::vector<bool>& dead, std::vector<JoinVerdictFor>* out);

 private:
  struct Join {
    int64_t round = 0;
    bool done = false;
    std::map<int, rpc::JoinReport> reports;  // by rank, for `round`
  };

  void evaluate(int64_t generation, Join& join, const std::vector<bool>& dead, std::vector<JoinVerdictFor>* out);

  const int world_size_;
  std::map<int64_t, Join> joins_;  // by generation: the joins this worker led or leads
};

}  // namespace drpc
