#pragma once

#include <functional>
#include <string>
#include <vector>

#include "process_group/message_port.h"
#include "process_group/process_group.h"

namespace drpc {
namespace testing {

// One behaviour every ProcessGroup, with the MessagePort over the same transport, must
// show. `run` is called on every rank of a group, concurrently, in the same order of cases
// everywhere; it throws std::runtime_error describing the first wrong value it sees.
struct ConformanceCase {
  std::string name;
  int min_world_size;
  std::function<void(ProcessGroup& group, MessagePort& messages)> run;
};

// `large_bytes`: the size of the "several MiB" tensors (smaller under sanitizers).
std::vector<ConformanceCase> conformance_cases(int64_t large_bytes = 3 << 20);

// Runs every case that fits `group` (and `messages`, its port); returns "case: error"
// lines for the failures.
std::vector<std::string> run_conformance(ProcessGroup& group, MessagePort& messages, int64_t large_bytes = 3 << 20);

}  // namespace testing
}  // namespace drpc
