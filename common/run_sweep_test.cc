#include "common/run_sweep.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/proc_info.h"
#include "common/proc_scan.h"
#include "testing/process.h"
#include "testing/wait.h"

namespace dflash {
namespace {

/// `sh -c script` in a session of its own, with `token` (if any) as the run token in its environment.
pid_t Start(const std::string& script, const std::string& token) {
  test::ProcessOptions o;
  o.argv = {"/bin/sh", "-c", script};
  if (!token.empty()) o.set_env = {{kRunTokenVar, token}};
  o.new_session = true;
  o.out = o.err = test::Output::Inherit();
  test::Process p;
  std::string err;
  EXPECT_TRUE(test::StartProcess(o, &p, &err)) << err;
  return p.pid;
}

using test::WaitUntil;

TEST(RunSweep, TokensAreUniquePerCall) { EXPECT_NE(NewRunToken(), NewRunToken()); }

TEST(RunSweep, EnvironValueAndOwnChildrenSeeAChild) {
  pid_t pid = Start("exec sleep 30", "tok-env");
  ASSERT_GT(pid, 0);
  auto kids = OwnChildren();
  EXPECT_NE(std::find(kids.begin(), kids.end(), pid), kids.end());
  ASSERT_TRUE(WaitUntil([&] { return EnvironValue(pid, kRunTokenVar).has_value(); }));
  EXPECT_EQ(*EnvironValue(pid, kRunTokenVar), "tok-env");
  EXPECT_FALSE(EnvironValue(pid, "DFLASH_NO_SUCH_VARIABLE_X").has_value());
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST(RunSweep, KillsADoubleForkedSetsidDaemonByItsTokenAndSparesOthers) {
  std::string token = NewRunToken();
  // The shell starts a daemon in its own session (setsid) and exits: the
  // daemon is re-parented away from us; only its environment names the run.
  pid_t starter = Start("setsid sleep 1000 & echo $! > /dev/null; exec sleep 1000", token);
  pid_t other = Start("exec sleep 1001", "");  // no token: not of this run
  SweepTarget t;
  t.token = token;
  t.spare = {::getpid()};
  ASSERT_TRUE(WaitUntil([&] { return FindRunProcesses(t).size() >= 2; }));
  std::vector<pid_t> killed;
  EXPECT_GE(SweepRun(t, 100, &killed), 2);
  EXPECT_NE(std::find(killed.begin(), killed.end(), starter), killed.end());
  EXPECT_EQ(std::find(killed.begin(), killed.end(), other), killed.end());
  int status = 0;
  ASSERT_EQ(::waitpid(starter, &status, 0), starter);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return FindRunProcesses(t).empty(); }));
  EXPECT_TRUE(ProcessAlive(other, 0));
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
}

TEST(RunSweep, SessionsMatchWithoutAToken) {
  pid_t pid = Start("sleep 1000 & exec sleep 1000", "");
  SweepTarget t;
  t.sessions = {pid};  // kNewSession: its session id is its pid
  t.spare = {::getpid()};
  ASSERT_TRUE(WaitUntil([&] { return FindRunProcesses(t).size() == 2; }));
  // Processes started before `not_before` are never matched (reused ids).
  SweepTarget later = t;
  later.not_before = ProcessStartTime(pid) + 1000000;
  EXPECT_TRUE(FindRunProcesses(later).empty());
  SweepRun(t, 100, nullptr);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(WaitUntil([&] { return FindRunProcesses(t).empty(); }));
}

}  // namespace
}  // namespace dflash
