#include "common/signal_names.h"

#include <gtest/gtest.h>

#include <csignal>

namespace dflash {
namespace {

TEST(SignalNames, AcceptsCommonSpellings) {
  EXPECT_EQ(SignalFromName("SIGTERM"), SIGTERM);
  EXPECT_EQ(SignalFromName("TERM"), SIGTERM);
  EXPECT_EQ(SignalFromName("sigusr1"), SIGUSR1);
  EXPECT_EQ(SignalFromName("SIGTREM"), 0);
  EXPECT_EQ(SignalFromName("15"), 0);
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGRTMIN + 1), "SIG" + std::to_string(SIGRTMIN + 1));
}

}  // namespace
}  // namespace dflash
