#include "common/proc_info.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testing/wait.h"

namespace dflash {
namespace {

TEST(ProcInfo, StartTimeIdentifiesAProcess) {
  uint64_t me = ProcessStartTime(::getpid());
  EXPECT_GT(me, 0u);
  EXPECT_TRUE(ProcessAlive(::getpid(), me));
  EXPECT_FALSE(ProcessAlive(::getpid(), me + 1));  // a reused pid has another start time
}

TEST(ProcInfo, ExitedAndZombieProcessesAreNotAlive) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) ::_exit(0);
  // Until it is reaped the child is a zombie: not alive for our purposes.
  EXPECT_TRUE(test::WaitUntil([&] { return !ProcessAlive(pid, 0); }));
  ::waitpid(pid, nullptr, 0);
  EXPECT_FALSE(ProcessAlive(pid, 0));
  EXPECT_EQ(ProcessStartTime(pid), 0u);
}

}  // namespace
}  // namespace dflash
