#include "common/subprocess.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace drpc {
namespace {

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

std::unique_ptr<Subprocess> Subprocess::start(const std::vector<std::string>& argv,
                                              const std::vector<std::string>& extra_env) {
  return start_with_output(argv, extra_env, nullptr);
}

std::unique_ptr<Subprocess> Subprocess::start_with_output(const std::vector<std::string>& argv,
                                                          const std::vector<std::string>& extra_env, int* output_fd) {
  if (argv.empty()) throw std::runtime_error("Subprocess::start: empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_storage;
  for (char** e = environ; *e; ++e) env_storage.emplace_back(*e);
  for (const auto& e : extra_env) env_storage.push_back(e);
  std::vector<char*> env;
  for (auto& e : env_storage) env.push_back(e.data());
  env.push_back(nullptr);

  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  int fds[2] = {-1, -1};
  if (output_fd) {
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("cannot create a pipe for " + argv[0]);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  }
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (output_fd) {
    close(fds[1]);
    if (rc != 0) close(fds[0]);
    else *output_fd = fds[0];
  }
  if (rc != 0) {
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid));
}

Subprocess::~Subprocess() {
  if (status_) return;
  kill(SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
}

std::optional<int> Subprocess::wait(std::chrono::milliseconds timeout) {
  if (status_) return status_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // A pidfd turns "the child exited" into an event to poll for, without a sleep loop.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      if (pidfd >= 0) close(pidfd);
      status_ = decode_status(status);
      return status_;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      if (pidfd >= 0) close(pidfd);
      return std::nullopt;
    }
    if (pidfd >= 0) {
      pollfd fd{pidfd, POLLIN, 0};
      poll(&fd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(left.count(), 10)));
    }
  }
}

void Subprocess::kill(int signal) {
  if (status_) return;
  ::kill(-pid_, signal);
}

bool Subprocess::stop() {
  if (status_) return false;
  ::kill(-pid_, SIGSTOP);
  // Reported once every thread has stopped; WNOWAIT leaves an exit for wait() to collect.
  siginfo_t info{};
  while (waitid(P_PID, static_cast<id_t>(pid_), &info, WSTOPPED | WEXITED | WNOWAIT) != 0) {
    if (errno != EINTR) return false;
  }
  return info.si_code == CLD_STOPPED;
}

}  // namespace drpc
