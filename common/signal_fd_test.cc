#include "common/signal_fd.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

namespace dflash {
namespace {

TEST(SignalFd, SignalsBecomeReadableAndTheMaskIsRestored) {
  sigset_t before;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &before);
  ASSERT_FALSE(sigismember(&before, SIGUSR1));
  {
    SignalFd sfd;
    std::string err;
    ASSERT_TRUE(sfd.Open({SIGUSR1, SIGUSR2}, &err)) << err;
    signalfd_siginfo si;
    EXPECT_FALSE(sfd.Read(&si));
    ::kill(::getpid(), SIGUSR1);
    struct pollfd p{sfd.fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1);
    ASSERT_TRUE(sfd.Read(&si));
    EXPECT_EQ(si.ssi_signo, static_cast<uint32_t>(SIGUSR1));
    EXPECT_EQ(si.ssi_pid, static_cast<uint32_t>(::getpid()));
    // Left pending on purpose: the destructor drains it before unblocking,
    // otherwise SIGUSR2's default action would end this test binary.
    ::kill(::getpid(), SIGUSR2);
  }
  sigset_t after;
  ::pthread_sigmask(SIG_SETMASK, nullptr, &after);
  EXPECT_FALSE(sigismember(&after, SIGUSR1));
  EXPECT_FALSE(sigismember(&after, SIGUSR2));
}

}  // namespace
}  // namespace dflash
