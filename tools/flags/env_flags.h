#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace drpc {
namespace flags {

// The torch and Kubernetes names a flag also reads, after its DRPC_* variable:
//   rank        RANK, then JOB_COMPLETION_INDEX (a Kubernetes Indexed Job's pod index)
//   world_size  WORLD_SIZE
//   master_addr MASTER_ADDR
//   master_port MASTER_PORT
//   local_rank  LOCAL_RANK
using Aliases = std::map<std::string, std::vector<std::string>>;
const Aliases& torch_aliases();

// "DRPC_" + the flag's name in upper case: rank -> DRPC_RANK, rpc_timeout_ms -> DRPC_RPC_TIMEOUT_MS.
std::string env_name(const std::string& flag);

// For every gflags flag of this program (gflags' own --help, --flagfile, ... excepted) not
// given on the command line: the value of its DRPC_* variable, else of its aliases (in
// order), else the default. Empty variables count as unset. Call right after
// gflags::ParseCommandLineFlags. Values are checked as strictly as gflags checks the command
// line (an integer flag refuses "29500x", "", "1e3" and values out of range); throws
// drpc::Error(kBadArgument) naming the variable and the flag, e.g.
//   "MASTER_PORT='29500x' (for --master_port) is not a valid int32".
void from_environment(const Aliases& aliases = torch_aliases());

// Where `flag`'s value came from, for messages: "--rank", "DRPC_RANK", "RANK", or
// "--rank (default)".
std::string source(const std::string& flag);

// Strict integer parsing for values that are not gflags flags: all of `text` (no
// whitespace or trailing characters) must be a base-10 integer in [lo, hi]. Throws
// drpc::Error(kBadArgument) "`what`: 'TEXT' is not an integer" / "... is out of range [lo, hi]".
int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi);

// Throws drpc::Error(kBadArgument) "`source(flag)`=VALUE: must be in [lo, hi]" unless
// lo <= value <= hi: range checks with a message naming where the value came from.
void check_range(const std::string& flag, int64_t value, int64_t lo, int64_t hi);

}  // namespace flags
}  // namespace drpc
