#pragma once

// The RRef workload that worker-process tests share (rpc_worker, chaos_worker): RRefs
// created on one worker, shared with a third, dropped; then every worker must be empty.

#include <chrono>
#include <functional>
#include <string>

namespace drpc {
namespace testing {

// In each of `rounds`, this worker (rank of world_size) creates `per_round` RRefs on the
// next worker and has the one after sum them through to_here; `check(ok, what)` records
// each result (and that held values stay alive while held).
void exchange_rrefs(int rank, int world_size, int rounds, int per_round,
                    const std::function<void(bool, const std::string&)>& check);

// Waits (up to `timeout`) until no worker owns or references an RRef; false if some
// still did then. Every worker must call it after a barrier.
bool every_worker_released(int world_size, std::chrono::milliseconds timeout);

}  // namespace testing
}  // namespace drpc
