// The orphan sweep's rule without a process: which leftovers are killed, and whose they were.
#include "launcher/supervise/orphan_owner.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

const std::string kToken = "tok-this-run";
constexpr pid_t kOwnGroup = 500;

/// train:0 lives (pid 1000, attempt 2), train:1 ended (attempt 0).
std::vector<RunProcess> Processes() { return {{"train:0", 1000, 2, true}, {"train:1", -1, 0, false}}; }

Orphan Child(pid_t pid, pid_t sid, pid_t pgid) {
  Orphan o;
  o.pid = pid;
  o.sid = sid;
  o.pgid = pgid;
  return o;
}

Orphan Marked(pid_t pid, const std::string& process, const std::string& attempt, const std::string& token = kToken) {
  Orphan o = Child(pid, pid, pid);  // setsid: its own session and group, only its environment names it
  o.run_token = token;
  o.process = process;
  o.attempt = attempt;
  return o;
}

TEST(OrphanOwner, ALiveProcesssChildIsLeftAloneUntilTheRunEnds) {
  OrphanVerdict v = JudgeOrphan(Marked(2001, "train:0", "2"), Processes(), kToken, kOwnGroup, false);
  EXPECT_FALSE(v.kill);
  EXPECT_EQ(v.owner, 0);
  v = JudgeOrphan(Marked(2001, "train:0", "2"), Processes(), kToken, kOwnGroup, /*run_ending=*/true);
  EXPECT_TRUE(v.kill);
  EXPECT_EQ(v.whose, "train:0 (the run is ending)");
}

TEST(OrphanOwner, AnEndedProcesssChildIsKilledWithItsGroup) {
  OrphanVerdict v = JudgeOrphan(Marked(2002, "train:1", "0"), Processes(), kToken, kOwnGroup, false);
  EXPECT_TRUE(v.kill);
  EXPECT_EQ(v.owner, 1);
  EXPECT_TRUE(v.kill_group);
  EXPECT_EQ(v.whose, "train:1 (ended)");
}

TEST(OrphanOwner, AnEarlierAttemptsChildIsKilledThoughItsProcessLivesAgain) {
  OrphanVerdict v = JudgeOrphan(Marked(2003, "train:0", "1"), Processes(), kToken, kOwnGroup, false);
  EXPECT_TRUE(v.kill);
  EXPECT_EQ(v.whose, "train:0 (an earlier attempt)");
}

TEST(OrphanOwner, WithoutItsEnvironmentTheSessionNamesTheOwner) {
  // env -i: no marker, but still in the session train:0 leads.
  OrphanVerdict v = JudgeOrphan(Child(2004, 1000, 2004), Processes(), kToken, kOwnGroup, false);
  EXPECT_FALSE(v.kill);
  EXPECT_EQ(v.owner, 0);
}

TEST(OrphanOwner, AnotherRunsNamesMeanNothingHere) {
  // Its environment names train:0 of another run (same names, another token), in a session of nobody's.
  OrphanVerdict v = JudgeOrphan(Marked(2005, "train:0", "2", "tok-other-run"), Processes(), kToken, kOwnGroup, false);
  EXPECT_TRUE(v.kill);
  EXPECT_EQ(v.owner, -1);
  EXPECT_EQ(v.whose, "an unknown process");
  // The same, in the session of our live train:0: that session is what counts.
  Orphan in_session = Marked(2006, "train:1", "0", "tok-other-run");
  in_session.sid = 1000;
  EXPECT_FALSE(JudgeOrphan(in_session, Processes(), kToken, kOwnGroup, false).kill);
}

TEST(OrphanOwner, ANameTheRunDoesNotHaveFallsBackToTheSession) {
  Orphan o = Marked(2007, "gone:0", "0");
  o.sid = 1000;
  OrphanVerdict v = JudgeOrphan(o, Processes(), kToken, kOwnGroup, false);
  EXPECT_FALSE(v.kill);
  EXPECT_EQ(v.owner, 0);
}

TEST(OrphanOwner, TheRunsOwnProcessesAreNeverOrphans) {
  EXPECT_FALSE(JudgeOrphan(Child(1000, 1000, 1000), Processes(), kToken, kOwnGroup, true).kill);
}

TEST(OrphanOwner, NeverTheGroupOfInitOrOfTheSupervisor) {
  EXPECT_FALSE(JudgeOrphan(Child(2008, 1, 1), Processes(), kToken, kOwnGroup, false).kill_group);
  OrphanVerdict v = JudgeOrphan(Child(2009, 2009, kOwnGroup), Processes(), kToken, kOwnGroup, false);
  EXPECT_TRUE(v.kill);
  EXPECT_FALSE(v.kill_group) << "a child still in the supervisor's own group: itself only";
}

}  // namespace
}  // namespace dflash
