// CheckPidClaim against real processes: a session the test starts (its leader,
// a grandchild, a grandchild that left for a session of its own) is believed;
// pid 1, the test itself, an unrelated process and a dead pid are not.
#include "launcher/supervise/pid_claim.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "common/proc_scan.h"
#include "testing/wait.h"

namespace dflash {
namespace {

/// `sh -c CMD` in a session of its own (what the supervisor spawns).
pid_t StartSession(const std::string& cmd) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ProcStat st;  // once it leads its session, as a spawned process does before exec
  EXPECT_TRUE(test::WaitUntil([&] { return ReadProcStat(pid, &st) && st.sid == pid; }));
  return pid;
}

/// The pids of `parent`'s live children.
std::vector<pid_t> KidsOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const ProcStat& st : ChildrenOf(parent))
    if (st.state != 'Z') out.push_back(st.pid);
  return out;
}

void Stop(pid_t session) {
  ::kill(-session, SIGKILL);
  ::waitpid(session, nullptr, 0);
}

TEST(PidClaim, TheSpawnedTreeIsBelievedWithItsGroup) {
  // sh -> sleep (same session, a child); sh -> setsid sleep (a descendant in its own session).
  pid_t leader = StartSession("sleep 60 & setsid sleep 61 & wait");
  ASSERT_TRUE(test::WaitUntil([&] { return KidsOf(leader).size() == 2; }));
  VerifiedPid v;
  std::string why;
  ASSERT_TRUE(CheckPidClaim(leader, leader, "", &v, &why)) << why;
  EXPECT_TRUE(v.leads_group);
  for (pid_t kid : KidsOf(leader)) {
    ASSERT_TRUE(CheckPidClaim(kid, leader, "", &v, &why)) << why;
    EXPECT_EQ(v.pid, kid);
    EXPECT_GT(v.start_time, 0u);
  }
  // The setsid'd sleep is in a group of its own: the group kill would leave it running (and holding ctest's
  // output pipe for its 61 s).
  for (pid_t kid : KidsOf(leader)) ::kill(kid, SIGKILL);
  Stop(leader);
}

TEST(PidClaim, WhatIsNotOursIsRefusedWithAReason) {
  pid_t leader = StartSession("exec sleep 60");
  pid_t stranger = StartSession("exec sleep 60");
  VerifiedPid v;
  std::string why;
  EXPECT_FALSE(CheckPidClaim(1, leader, "", &v, &why));
  EXPECT_NE(why.find("MAINPID=1 names no process of its own"), std::string::npos) << why;
  EXPECT_FALSE(CheckPidClaim(0, leader, "", &v, &why));
  EXPECT_FALSE(CheckPidClaim(-5, leader, "", &v, &why));
  EXPECT_FALSE(CheckPidClaim(::getpid(), leader, "", &v, &why));
  EXPECT_NE(why.find("the supervisor"), std::string::npos) << why;
  EXPECT_FALSE(CheckPidClaim(stranger, leader, "", &v, &why));
  EXPECT_NE(why.find("not in the process tree the supervisor started (pid " + std::to_string(leader)),
            std::string::npos)
      << why;
  Stop(stranger);
  EXPECT_FALSE(CheckPidClaim(stranger, leader, "", &v, &why));  // reaped: no process
  EXPECT_NE(why.find("names no live process"), std::string::npos) << why;
  EXPECT_FALSE(v.valid());
  Stop(leader);
}

TEST(PidClaim, ASignalNeverReachesAPidThatChangedHands) {
  pid_t leader = StartSession("exec sleep 60");
  VerifiedPid v;
  std::string why;
  ASSERT_TRUE(CheckPidClaim(leader, leader, "", &v, &why)) << why;
  VerifiedPid reused = v;
  reused.start_time += 1;  // what a reuse of the number looks like
  EXPECT_FALSE(SignalVerified(reused, SIGKILL));
  EXPECT_EQ(::kill(leader, 0), 0);  // untouched
  EXPECT_TRUE(SignalVerified(v, SIGKILL));
  ::waitpid(leader, nullptr, 0);
  EXPECT_FALSE(SignalVerified(v, SIGKILL));  // reaped: nothing is signalled
}

}  // namespace
}  // namespace dflash
