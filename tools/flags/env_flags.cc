#include "tools/flags/env_flags.h"

#include <gflags/gflags.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace drpc {
namespace flags {
namespace {

std::mutex g_mu;
std::map<std::string, std::string>& sources() {  // guarded by g_mu
  static auto* s = new std::map<std::string, std::string>;
  return *s;
}

// gflags' own flags (--help, --flagfile, --fromenv, ...) are not settings of the program.
bool is_gflags_own(const gflags::CommandLineFlagInfo& info) {
  return info.filename.find("gflags") != std::string::npos;
}

}  // namespace

const Aliases& torch_aliases() {
  static const auto* aliases = new Aliases{
      {"rank", {"RANK", "JOB_COMPLETION_INDEX"}},
      {"world_size", {"WORLD_SIZE"}},
      {"master_addr", {"MASTER_ADDR"}},
      {"master_port", {"MASTER_PORT"}},
      {"local_rank", {"LOCAL_RANK"}},
  };
  return *aliases;
}

std::string env_name(const std::string& flag) {
  std::string name = "DRPC_";
  for (char c : flag) name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

void from_environment(const Aliases& aliases) {
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  for (const auto& info : all) {
    if (is_gflags_own(info)) continue;
    if (!info.is_default) {
      std::lock_guard<std::mutex> lock(g_mu);
      sources()[info.name] = "--" + info.name;
      continue;
    }
    std::vector<std::string> names = {env_name(info.name)};
    auto it = aliases.find(info.name);
    if (it != aliases.end()) names.insert(names.end(), it->second.begin(), it->second.end());
    for (const auto& name : names) {
      const char* value = std::getenv(name.c_str());
      if (value == nullptr || *value == '\0') continue;
      if (gflags::SetCommandLineOption(info.name.c_str(), value).empty()) {
        throw Error(ErrorKind::kBadArgument, name + "='" + value + "' (for --" + info.name + ") is not a valid " +
                                                 info.type + (info.type == "bool" ? " (true or false)" : ""));
      }
      std::lock_guard<std::mutex> lock(g_mu);
      sources()[info.name] = name;
      break;
    }
  }
}

std::string source(const std::string& flag) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = sources().find(flag);
  return it != sources().end() ? it->second : "--" + flag + " (default)";
}

int64_t parse_int(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  const bool digits = !text.empty() && text.find_first_not_of("0123456789", text[0] == '-' ? 1 : 0) == std::string::npos &&
                      text != "-";
  if (!digits) throw Error(ErrorKind::kBadArgument, what + ": '" + text + "' is not an integer");
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < lo || v > hi) {
    throw Error(ErrorKind::kBadArgument, what + ": '" + text + "' is out of range [" + std::to_string(lo) + ", " +
                                             std::to_string(hi) + "]");
  }
  return v;
}

void check_range(const std::string& flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return;
  throw Error(ErrorKind::kBadArgument, source(flag) + "=" + std::to_string(value) + ": must be in [" +
                                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace flags
}  // namespace drpc
