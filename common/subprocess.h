#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace drpc {

// A child process in its own process group. The destructor kills the group (SIGKILL) and
// reaps the child if it is still running, so a failing test never leaves one behind.
class Subprocess {
 public:
  // Starts argv[0] (a path) with the rest as arguments, with this process's environment
  // plus `extra_env` ("NAME=value"). Throws std::runtime_error if it cannot start.
  static std::unique_ptr<Subprocess> start(const std::vector<std::string>& argv,
                                           const std::vector<std::string>& extra_env = {});
  // The same, with the child's stdout and stderr sent into one pipe; *output_fd receives
  // its read end (the caller closes it).
  static std::unique_ptr<Subprocess> start_with_output(const std::vector<std::string>& argv,
                                                       const std::vector<std::string>& extra_env, int* output_fd);

  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }

  // Waits up to `timeout` for the child to exit. Returns its exit code, or 128 + the signal
  // that killed it; nullopt if it is still running.
  std::optional<int> wait(std::chrono::milliseconds timeout);

  // Sends `signal` to the child's whole process group.
  void kill(int signal);
  // Sends SIGSTOP to the group and returns once the child has stopped (true), or false if it
  // exited instead. kill(SIGSTOP) alone returns when the signal is queued: the child stops
  // when one of its threads next runs, and on a busy machine it may serve a request first.
  // Resume it with kill(SIGCONT).
  bool stop();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}

  const pid_t pid_;
  std::optional<int> status_;
};

}  // namespace drpc
