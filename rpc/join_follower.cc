// A worker's own part in the job-wide join (see rpc/join_follower.h).

#include "rpc/join_follower.h"

#include <algorithm>
#include <utility>

#include "rpc/message.h"

namespace drpc {

JoinFollower::JoinFollower(int self, int world_size)
    : self_(self),
      sent_to_(world_size, 0),
      answered_from_(world_size, 0),
      dead_(world_size, false),
      leader_(world_size) {}

void JoinFollower::peer_dead(int rank, std::vector<JoinMessage>* out) {
  dead_.at(rank) = true;
  std::vector<JoinVerdictFor> verdicts;
  leader_.on_peer_dead(dead_, &verdicts);
  route(std::move(verdicts), out);
}

int JoinFollower::leader() const {
  for (int r = 0; r < static_cast<int>(dead_.size()); ++r) {
    if (!dead_[r]) return r;
  }
  return self_;
}

JoinFollower::Step JoinFollower::step(Call& call, bool idle, std::vector<JoinMessage>* out) {
  if (done_generation_ >= call.generation) return Step::kQuiet;
  auto retry = retry_.find(call.generation);
  if (retry != retry_.end() && retry->second > call.round) {
    call.round = retry->second;
    call.reported_to = -1;
  }
  const int leader = this->leader();
  if (call.reported_to == leader || !idle) return Step::kWait;
  rpc::JoinReport report;
  report.set_generation(call.generation);
  report.set_round(call.round);
  for (int64_t n : sent_to_) report.add_sent_to(n);
  for (int64_t n : answered_from_) report.add_answered_from(n);
  call.reported_to = leader;
  if (leader == self_) {
    on_report(self_, report, out);
  } else {
    out->push_back(JoinMessage{leader, kJoinReport, report.SerializeAsString()});
  }
  return Step::kReported;
}

bool JoinFollower::on_message(int source, int32_t type, const std::string& payload, std::vector<JoinMessage>* out) {
  if (type == kJoinReport) {
    rpc::JoinReport report;
    if (!report.ParseFromString(payload) || !JoinLeader::well_formed(report, static_cast<int>(dead_.size()))) {
      return false;
    }
    on_report(source, report, out);
    return true;
  }
  rpc::JoinVerdict verdict;
  if (!verdict.ParseFromString(payload)) return false;
  on_verdict(verdict);
  return true;
}

// The leader's part decides; a report and verdict may also be this worker's own (the
// leader joins too).
void JoinFollower::on_report(int source, const rpc::JoinReport& report, std::vector<JoinMessage>* out) {
  std::vector<JoinVerdictFor> verdicts;
  leader_.on_report(source, report, dead_, &verdicts);
  route(std::move(verdicts), out);
}

void JoinFollower::route(std::vector<JoinVerdictFor> verdicts, std::vector<JoinMessage>* out) {
  for (auto& v : verdicts) {
    if (v.dst == self_) {
      on_verdict(v.verdict);
    } else {
      out->push_back(JoinMessage{v.dst, kJoinVerdict, v.verdict.SerializeAsString()});
    }
  }
}

void JoinFollower::on_verdict(const rpc::JoinVerdict& verdict) {
  if (verdict.done()) {
    done_generation_ = std::max(done_generation_, verdict.generation());
  } else {
    int64_t& round = retry_[verdict.generation()];
    round = std::max(round, verdict.round());
  }
}

}  // namespace drpc
