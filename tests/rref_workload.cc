#include "tests/rref_workload.h"

#include <ATen/ATen.h>

#include <thread>

#include "drpc.h"

DRPC_REGISTER_FUNCTION("test.rref_sum", [](c10::IValue rref) {
  return drpc::RRef::from_ivalue(rref).to_here().toTensor().sum().item<double>();
});
DRPC_REGISTER_FUNCTION("test.rref_counts", []() {
  drpc::RRefCounts c = drpc::current_runtime().rref_counts();
  return std::vector<int64_t>{c.owners, c.owner_values, c.users, c.pending_children, c.pending_users};
});

namespace drpc {
namespace testing {
namespace {

std::string name(int r) { return "worker" + std::to_string(r); }

}  // namespace

void exchange_rrefs(int rank, int world_size, int rounds, int per_round,
                    const std::function<void(bool, const std::string&)>& check) {
  const std::string next = name((rank + 1) % world_size), after = name((rank + 2) % world_size);
  for (int round = 0; round < rounds; ++round) {
    std::vector<RRef> held;
    for (int i = 0; i < per_round; ++i) held.push_back(remote(next, "aten::ones", {c10::List<int64_t>({i + 1})}));
    double expected = 0;
    std::vector<FuturePtr> sums;
    for (int i = 0; i < per_round; ++i) {
      expected += i + 1;
      sums.push_back(rpc_async(after, "test.rref_sum", {held[i].to_ivalue()}));
    }
    double total = 0;
    for (auto& v : wait_all(sums)) total += v.toDouble();
    check(total == expected, "sums through a third worker in round " + std::to_string(round));
    // Still held here: the owner must not have freed any of them.
    for (int i = 0; i < per_round; i += 7) {
      check(held[i].to_here().toTensor().numel() == i + 1, "a held RRef's value is alive");
    }
  }
}

bool every_worker_released(int world_size, std::chrono::milliseconds timeout) {
  // Deletions travel asynchronously: poll, bounded, until every worker is empty.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    bool empty = true;
    for (int r = 0; r < world_size; ++r) {
      for (auto v : rpc_sync(name(r), "test.rref_counts").toIntVector()) empty = empty && v == 0;
    }
    if (empty) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace testing
}  // namespace drpc
