// The launcher's fd budget (fd_limit.h, issue #12's process hardening), in a child: the limits are per process.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "launcher/commands/fd_limit.h"

namespace dflash {
namespace {

TEST(FdLimit, NeedGrowsWithTheProcesses) {
  EXPECT_LT(FdsNeeded(1), FdsNeeded(2));
  EXPECT_GE(FdsNeeded(300), 1500u);  // 300 processes break a soft limit of 1024
  EXPECT_EQ(FdsNeeded(3, 45), FdsNeeded(3) + 45);  // each named port's lock is held for the run
}

/// In a child: the limits are per process.
int InChild(rlim_t soft, rlim_t hard, size_t processes) {
  pid_t pid = ::fork();
  if (pid == 0) {
    struct rlimit rl{soft, hard};
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) ::_exit(90);
    std::string note, err;
    bool ok = RaiseFdLimit(processes, &note, &err);
    ::getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur != hard) ::_exit(91);
    if (soft < hard && note.find("raised") == std::string::npos) ::_exit(92);
    if (!ok && err.find(std::to_string(processes) + " processes need ~") == std::string::npos) ::_exit(93);
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(FdLimit, RaisesTheSoftLimitToTheHardOne) { EXPECT_EQ(InChild(64, 4096, 40), 0); }
TEST(FdLimit, SaysWhenEvenTheHardLimitIsShort) { EXPECT_EQ(InChild(14, 14, 6), 1); }

}  // namespace
}  // namespace dflash
