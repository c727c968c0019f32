#include "rpc/join_protocol.h"

#include <glog/logging.h>

namespace drpc {
namespace {

JoinVerdictFor verdict_for(int dst, int64_t generation, int64_t round, bool done) {
  JoinVerdictFor v{dst, {}};
  v.verdict.set_generation(generation);
  v.verdict.set_round(round);
  v.verdict.set_done(done);
  return v;
}

}  // namespace

bool JoinLeader::well_formed(const rpc::JoinReport& report, int world_size) {
  return report.sent_to_size() == world_size && report.answered_from_size() == world_size &&
         report.generation() > 0 && report.round() >= 0;
}

void JoinLeader::on_report(int source, const rpc::JoinReport& report, const std::vector<bool>& dead,
                           std::vector<JoinVerdictFor>* out) {
  Join& join = joins_[report.generation()];
  if (join.done) {  // a report sent again to a new leader after the verdict
    out->push_back(verdict_for(source, report.generation(), join.round, true));
    return;
  }
  if (report.round() < join.round) return;  // a verdict asking for a later round is on its way
  if (report.round() > join.round) {
    // Its last leader asked for this round: ask the others too (reports of older rounds
    // no longer count).
    join.round = report.round();
    join.reports.clear();
    for (int r = 0; r < world_size_; ++r) {
      if (!dead[r] && r != source) out->push_back(verdict_for(r, report.generation(), join.round, false));
    }
  }
  join.reports[source] = report;
  evaluate(report.generation(), join, dead, out);
}

void JoinLeader::on_peer_dead(const std::vector<bool>& dead, std::vector<JoinVerdictFor>* out) {
  for (auto& [generation, join] : joins_) evaluate(generation, join, dead, out);
}

void JoinLeader::evaluate(int64_t generation, Join& join, const std::vector<bool>& dead,
                          std::vector<JoinVerdictFor>* out) {
  if (join.done) return;
  for (int r = 0; r < world_size_; ++r) {
    if (!dead[r] && !join.reports.count(r)) return;
  }
  bool quiet = true;
  for (int i = 0; i < world_size_ && quiet; ++i) {
    for (int j = 0; j < world_size_ && quiet; ++j) {
      if (i == j || dead[i] || dead[j]) continue;
      quiet = join.reports[i].sent_to(j) == join.reports[j].answered_from(i);
    }
  }
  if (quiet) {
    join.done = true;
  } else {
    ++join.round;
    join.reports.clear();
  }
  VLOG(1) << "join " << generation << (quiet ? ": the job is quiet" : ": requests in flight, round ") << join.round;
  for (int r = 0; r < world_size_; ++r) {
    if (!dead[r]) out->push_back(verdict_for(r, generation, join.round, quiet));
  }
}

}  // namespace drpc
