#include "process_group/testing/thread_group.h"

#include <exception>
#include <stdexcept>
#include <thread>

namespace drpc {
namespace testing {

ThreadGroup make_thread_group(int world_size, const GrpcProcessGroupOptions& options) {
  ThreadGroup group;
  group.store = create_in_memory_store();
  group.ranks.resize(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        group.ranks[r] = create_grpc_group_endpoints(*group.store, r, world_size, options);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return group;
}

std::vector<std::string> run_on_ranks(ThreadGroup& group,
                                      const std::function<void(ProcessGroup&)>& fn) {
  return run_on_ranks(group, [&](ProcessGroup& g, MessagePort&) { fn(g); });
}

std::vector<std::string> run_on_ranks(ThreadGroup& group,
                                      const std::function<void(ProcessGroup&, MessagePort&)>& fn) {
  std::vector<std::string> failures(group.ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < group.ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*group.ranks[r].group, *group.ranks[r].messages);
      } catch (const std::exception& e) {
        failures[r] = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> out;
  for (auto& f : failures) {
    if (!f.empty()) out.push_back(f);
  }
  return out;
}

}  // namespace testing
}  // namespace drpc
