// The holder-tree mark against the real kernel: a payload's descendants keep
// DFLASH_GATE_HOLDER across fork, setsid and re-parenting, and are found and
// killed by it; nobody else is.
#include "cachelock/holder_tree.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "testing/process.h"
#include "testing/wait.h"

namespace dflash {
namespace {

using namespace std::chrono_literals;

/// Starts `sh -c script` with the mark in its environment; returns its pid.
pid_t StartMarked(const std::string& token, const std::string& script) {
  test::ProcessOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.set_env = {{kHolderEnvVar, token}};
  o.out = o.err = test::Output::Inherit();
  test::Process p;
  std::string err;
  EXPECT_TRUE(test::StartProcess(o, &p, &err)) << err;
  return p.pid;
}

/// The marked tree once it has at least `n` processes (or what it has at the deadline).
std::vector<pid_t> WaitForTree(const std::string& token, size_t n) {
  std::vector<pid_t> pids;
  test::WaitUntil([&] {
    pids = HolderTreePids(token);
    return pids.size() >= n;
  });
  return pids;
}

TEST(HolderTree, TokenIsPidAndStartTime) {
  OwnerRecord r;
  r.pid = 42;
  r.start_time = 777;
  EXPECT_EQ(HolderToken(r), "42.777");
}

TEST(HolderTree, FindsAndKillsEveryMarkedDescendantIncludingSetsid) {
  const std::string token = "test." + std::to_string(::getpid());
  // sh, a child in its group, and one that left for a session of its own.
  pid_t sh = StartMarked(token, "sleep 1000 & setsid sleep 1000 & wait");
  pid_t bystander = StartMarked("someone.else", "exec sleep 1000");
  std::vector<pid_t> tree = WaitForTree(token, 3);
  ASSERT_EQ(tree.size(), 3u);
  EXPECT_NE(std::find(tree.begin(), tree.end(), sh), tree.end());
  EXPECT_EQ(std::find(tree.begin(), tree.end(), bystander), tree.end());
  EXPECT_GE(HolderTreeCpuSeconds(token), 0.0);

  int killed = 0;
  std::string err;
  // Reap the direct child meanwhile (the others go to init or a subreaper).
  std::thread reaper([&] { ::waitpid(sh, nullptr, 0); });
  EXPECT_TRUE(KillHolderTree(token, 5s, &killed, &err)) << err;
  reaper.join();
  EXPECT_EQ(killed, 3);
  EXPECT_TRUE(HolderTreePids(token).empty());
  // The bystander lives on.
  EXPECT_EQ(::kill(bystander, 0), 0);
  ::kill(bystander, SIGKILL);
  ::waitpid(bystander, nullptr, 0);
}

TEST(HolderTree, AnEmptyTokenMatchesNothing) {
  EXPECT_TRUE(HolderTreePids("").empty());
  int killed = -1;
  std::string err;
  EXPECT_TRUE(KillHolderTree("", 100ms, &killed, &err));
  EXPECT_EQ(killed, 0);
}

TEST(HolderTree, IdleIsUnderTwoPercentOfACoreAndNeverALossOfCpu) {
  EXPECT_TRUE(HolderTreeLooksIdle(0.0, 10.0));    // blocked in a collective
  EXPECT_TRUE(HolderTreeLooksIdle(0.19, 10.0));
  EXPECT_FALSE(HolderTreeLooksIdle(0.2, 10.0));   // 2% of one core
  EXPECT_FALSE(HolderTreeLooksIdle(9.5, 10.0));   // compiling
  EXPECT_FALSE(HolderTreeLooksIdle(-3.0, 10.0));  // a process of the tree ended: it ran, whatever the sum says
}

}  // namespace
}  // namespace dflash
