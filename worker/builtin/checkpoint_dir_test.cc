// CheckpointDir against the real kernel: the commit is one rename, a process SIGKILLed mid-write leaves the
// previous checkpoint usable and its leftovers are removed, the last K stay.
#include "worker/builtin/checkpoint_dir.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <gtest/gtest.h>

#include "common/fd.h"
#include "testing/temp_dir.h"

namespace dflash::builtin {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using Steps = std::vector<std::pair<int64_t, std::string>>;

auto WriteStep(int64_t step) {
  return [step](const std::string& tmp, std::string* err) {
    return WriteFileAtomic(tmp + "/state", std::to_string(step), err, 0600);
  };
}

TEST(CheckpointDir, SavesCommitsAndKeepsTheLastK) {
  TempDir d;
  std::string err, path;
  CheckpointDir c(d.path() + "/ck/drafter:0", 2, "state");
  int removed = -1;
  ASSERT_TRUE(c.Open(&removed, &err)) << err;
  EXPECT_EQ(removed, 0);
  EXPECT_EQ(fs::status(d.path() + "/ck/drafter:0").permissions() & fs::perms::all, fs::perms::owner_all);
  for (int64_t s : {3, 6, 9}) {
    ASSERT_TRUE(c.Save(s, WriteStep(s), &path, &err)) << err;
    EXPECT_EQ(path, d.path() + "/ck/drafter:0/" + CheckpointDir::StepName(s));
    ASSERT_TRUE(c.Prune(&err)) << err;
  }
  Steps all;
  ASSERT_TRUE(c.Committed(&all, &err)) << err;
  EXPECT_EQ(all, (Steps{{6, d.path() + "/ck/drafter:0/step-0000000006"}, {9, d.path() + "/ck/drafter:0/step-0000000009"}}));
  // A committed checkpoint is never replaced.
  EXPECT_FALSE(c.Save(9, WriteStep(9), &path, &err));
  EXPECT_NE(err.find("exists already"), std::string::npos) << err;
  // A failed write leaves nothing behind, and nothing committed.
  auto fail = [](const std::string&, std::string* e) {
    *e = "disk full";
    return false;
  };
  EXPECT_FALSE(c.Save(12, fail, &path, &err));
  EXPECT_FALSE(fs::exists(d.path() + "/ck/drafter:0/.tmp-step-0000000012"));
}

TEST(CheckpointDir, AStepDirWithoutItsFileIsNotACheckpoint) {
  TempDir d;
  std::string err;
  fs::create_directories(d.path() + "/step-0000000004");
  fs::create_directories(d.path() + "/step-x");
  CheckpointDir c(d.path(), 3, "state");
  Steps all;
  ASSERT_TRUE(c.Committed(&all, &err)) << err;
  EXPECT_TRUE(all.empty());
}

TEST(CheckpointDir, AProcessKilledMidWriteLeavesThePreviousCheckpointUsable) {
  TempDir d;
  std::string err, path;
  const std::string dir = d.path() + "/ck";
  {
    CheckpointDir c(dir, 3, "state");
    int removed = 0;
    ASSERT_TRUE(c.Open(&removed, &err) && c.Save(3, WriteStep(3), &path, &err)) << err;
  }
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    CheckpointDir c(dir, 3, "state");
    std::string e, p;
    auto half = [](const std::string& tmp, std::string* e2) {
      return WriteFileAtomic(tmp + "/state", "half", e2, 0600);
    };
    c.Save(6, half, &p, &e, [&] {
      (void)!::write(ready[1], "x", 1);
      ::pause();  // killed here: written, not committed
    });
    ::_exit(3);
  }
  char x;
  ASSERT_EQ(::read(ready[0], &x, 1), 1);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_TRUE(fs::exists(dir + "/.tmp-step-0000000006/state"));
  CheckpointDir c(dir, 3, "state");
  int removed = 0;
  ASSERT_TRUE(c.Open(&removed, &err)) << err;
  EXPECT_EQ(removed, 1);
  EXPECT_FALSE(fs::exists(dir + "/.tmp-step-0000000006"));
  Steps all;
  ASSERT_TRUE(c.Committed(&all, &err)) << err;
  ASSERT_EQ(all, (Steps{{3, dir + "/step-0000000003"}}));
  std::string text;
  ASSERT_TRUE(ReadFile(all.back().second + "/state", &text, &err)) << err;
  EXPECT_EQ(text, "3");
}

// A kill at any moment of a prune (the CI saw one land mid-removal, which left a step-N without its file that no
// later prune saw): the next Open and Prune leave exactly the last K, whatever the kill interrupted.
TEST(CheckpointDir, AProcessKilledMidPruneLeavesExactlyTheLastKAfterTheNextOpen) {
  for (int delay_us : {0, 500, 1000, 1500, 2000, 3000, 4000, 6000}) {
    TempDir d;
    std::string err, path;
    const std::string dir = d.path() + "/ck";
    {
      CheckpointDir c(dir, 3, "state");
      int removed = 0;
      ASSERT_TRUE(c.Open(&removed, &err)) << err;
      auto many = [](const std::string& tmp, std::string* e) {  // a removal that takes a while to kill inside
        for (int i = 0; i < 300; ++i) std::ofstream(tmp + "/shard-" + std::to_string(i)) << i;
        return WriteFileAtomic(tmp + "/state", "1", e, 0600);
      };
      ASSERT_TRUE(c.Save(1, many, &path, &err)) << err;
      for (int64_t s : {2, 3, 4}) ASSERT_TRUE(c.Save(s, WriteStep(s), &path, &err)) << err;
    }
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      CheckpointDir c(dir, 3, "state");
      std::string e;
      ::_exit(c.Prune(&e) ? 0 : 3);
    }
    ::usleep(delay_us);
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    CheckpointDir c(dir, 3, "state");
    int removed = 0;
    ASSERT_TRUE(c.Open(&removed, &err) && c.Prune(&err)) << err;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"step-0000000002", "step-0000000003", "step-0000000004"}))
        << "killed after " << delay_us << " us";
  }
}

TEST(CheckpointDir, UncoveredListsWhatDoneCreditsToANewerOrRenamedCheckpoint) {
  const std::string d = "/ck/drafter:0";
  std::map<std::string, std::vector<std::string>> commits = {
      {d + "/step-0000000002", {"t:0-0000000000.safetensors"}},  // older: pruned or there, covered
      {d + "/step-0000000004", {"t:0-0000000002.safetensors"}},
      {d + "/step-0000000006", {"t:0-0000000004.safetensors"}},
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(CheckpointDir::Uncovered(commits, 6, d + "/step-0000000006"), V{});
  // The newest removed, the one before restored: step 6's frames would be skipped.
  EXPECT_EQ(CheckpointDir::Uncovered(commits, 4, d + "/step-0000000004"), V{d + "/step-0000000006"});
  // Nothing restored: every checkpoint done/ names.
  EXPECT_EQ(CheckpointDir::Uncovered(commits, -1, "").size(), 3u);
  // The restored step under another name, or a name that is no step-N: never taken as covered.
  commits[d + "/step-0000000006.1"] = {"t:0-0000000005.safetensors"};
  commits[d + "/odd"] = {"t:0-0000000006.safetensors"};
  EXPECT_EQ(CheckpointDir::Uncovered(commits, 6, d + "/step-0000000006"),
            (V{d + "/odd", d + "/step-0000000006.1"}));
}

TEST(CheckpointDir, ADamagedCheckpointSetAsideLeavesTheCommittedNamesAndItsStepFree) {
  TempDir d;
  std::string err, path, aside;
  CheckpointDir c(d.path() + "/ck", 3, "state");
  int removed = 0;
  ASSERT_TRUE(c.Open(&removed, &err)) << err;
  ASSERT_TRUE(c.Save(4, WriteStep(4), &path, &err)) << err;
  ASSERT_TRUE(c.SetAside(path, &aside, &err)) << err;
  EXPECT_EQ(aside, d.path() + "/ck/damaged-step-0000000004");
  EXPECT_TRUE(fs::exists(aside + "/state"));
  Steps all;
  ASSERT_TRUE(c.Committed(&all, &err)) << err;
  EXPECT_TRUE(all.empty());
  // Its step saved again, damaged again: the first one set aside stays what it is.
  ASSERT_TRUE(c.Save(4, WriteStep(4), &path, &err)) << err;
  ASSERT_TRUE(c.SetAside(path, &aside, &err)) << err;
  EXPECT_EQ(aside, d.path() + "/ck/damaged-step-0000000004.2");
  // Open's sweep of a killed save's leftovers leaves them for a look.
  ASSERT_TRUE(c.Open(&removed, &err)) << err;
  EXPECT_EQ(removed, 0);
  EXPECT_TRUE(fs::exists(d.path() + "/ck/damaged-step-0000000004") && fs::exists(aside));
}

}  // namespace
}  // namespace dflash::builtin
