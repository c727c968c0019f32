// Subprocess on real children (/bin/sleep, /bin/sh): stop() returns only once the child has
// stopped, or false when it exited instead; wait() still reports how a child ended.

#include "common/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <string>

namespace drpc {
namespace {

// The state letter of /proc/<pid>/stat ('T': stopped).
char state_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? '?' : text[paren + 2];
}

TEST(Subprocess, StopReturnsOnceTheChildHasStoppedAndItResumes) {
  auto child = Subprocess::start({"/bin/sleep", "30"});
  ASSERT_TRUE(child->stop());
  EXPECT_EQ(state_of(child->pid()), 'T');
  child->kill(SIGCONT);
  EXPECT_FALSE(child->wait(std::chrono::milliseconds(0)).has_value());  // running again
  child->kill(SIGTERM);
  EXPECT_EQ(child->wait(std::chrono::seconds(10)), std::optional<int>(128 + SIGTERM));
}

TEST(Subprocess, StopOfAChildThatExitedIsFalseAndLeavesItsExitCode) {
  auto child = Subprocess::start({"/bin/sh", "-c", "exit 7"});
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child->pid()), &info, WEXITED | WNOWAIT), 0);  // exited, not reaped
  EXPECT_FALSE(child->stop());
  EXPECT_EQ(child->wait(std::chrono::seconds(10)), std::optional<int>(7));
}

}  // namespace
}  // namespace drpc
