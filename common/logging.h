#pragma once

#include <string>

namespace drpc {

// Log lines tagged with the worker they come from: "[name/rank]" after glog's usual
// prefix. A thread that works for one worker (its agent's threads, its handlers) carries
// that worker's tag (ScopedLogTag); other threads carry the process's (set by init_rpc).

// google::InitGoogleLogging with drpc's prefix. Binaries call it instead; without it,
// lines carry no tag (libraries never install a prefix themselves).
void init_logging(const char* argv0);

// The tag of threads that have none of their own. Thread-safe.
void set_process_log_tag(const std::string& name, int rank);

// "[name/rank]".
std::string make_log_tag(const std::string& name, int rank);

// While it lives, this thread's lines carry `*tag` (borrowed: it must outlive the scope).
class ScopedLogTag {
 public:
  explicit ScopedLogTag(const std::string* tag);
  ~ScopedLogTag();
  ScopedLogTag(const ScopedLogTag&) = delete;
  ScopedLogTag& operator=(const ScopedLogTag&) = delete;

 private:
  const std::string* previous_;
};

}  // namespace drpc
