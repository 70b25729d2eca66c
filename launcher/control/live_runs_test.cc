// The per-user run registry: entries come and go with their run, stale ones of
// dead supervisors are cleaned, and a registry dir others could touch is refused.
#include "launcher/control/live_runs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/proc_info.h"

namespace dflash {
namespace {

class RunRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/reg_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    xdg_ = tmpl;
    const char* old = std::getenv("XDG_RUNTIME_DIR");
    if (old) old_ = old, had_ = true;
    ::setenv("XDG_RUNTIME_DIR", xdg_.c_str(), 1);
  }
  void TearDown() override {
    if (had_) ::setenv("XDG_RUNTIME_DIR", old_.c_str(), 1);
    else ::unsetenv("XDG_RUNTIME_DIR");
    std::filesystem::remove_all(xdg_);
  }
  void Plant(const std::string& name, const std::string& text) {
    std::filesystem::create_directories(xdg_ + "/dflash-launch");
    ::chmod((xdg_ + "/dflash-launch").c_str(), 0700);
    std::ofstream(xdg_ + "/dflash-launch/" + name) << text;
  }
  std::string xdg_, old_;
  bool had_ = false;
};

TEST_F(RunRegistryTest, AnEntryLivesAsLongAsItsRegistration) {
  std::vector<RunEntry> runs;
  std::string err;
  ASSERT_TRUE(ListRuns(&runs, &err)) << err;  // no registry yet: empty, not an error
  EXPECT_TRUE(runs.empty());
  {
    RunRegistration reg;
    RunEntry e;
    e.run_id = "r1";
    e.run_dir = "/x/runs/r1";
    ASSERT_TRUE(reg.Register(e, &err)) << err;
    struct stat st;
    ASSERT_EQ(::lstat((xdg_ + "/dflash-launch").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_TRUE(ListRuns(&runs, &err)) << err;
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].run_id, "r1");
    EXPECT_EQ(runs[0].pid, ::getpid());
    EXPECT_EQ(runs[0].start_time, ProcessStartTime(::getpid()));
  }
  ASSERT_TRUE(ListRuns(&runs, &err)) << err;
  EXPECT_TRUE(runs.empty());
}

TEST_F(RunRegistryTest, StaleAndForeignEntriesAreNotRuns) {
  // A dead supervisor's entry, and one whose pid was reused by another process.
  Plant("999999999.json",
        R"({"run_id":"dead","run_dir":"/x","pid":999999999,"start_time":1,"started_unix":1})");
  Plant("1.json", R"({"run_id":"reused","run_dir":"/x","pid":1,"start_time":12345678901,"started_unix":1})");
  Plant("junk.json", "{not json");
  std::vector<RunEntry> runs;
  std::string err;
  ASSERT_TRUE(ListRuns(&runs, &err)) << err;
  EXPECT_TRUE(runs.empty());
  EXPECT_FALSE(std::filesystem::exists(xdg_ + "/dflash-launch/999999999.json"));  // cleaned
  EXPECT_FALSE(std::filesystem::exists(xdg_ + "/dflash-launch/1.json"));
  EXPECT_TRUE(std::filesystem::exists(xdg_ + "/dflash-launch/junk.json"));  // not ours to judge: left
}

TEST_F(RunRegistryTest, ARegistryOthersCouldWriteOrASymlinkIsRefused) {
  std::filesystem::create_directories(xdg_ + "/dflash-launch");
  ::chmod((xdg_ + "/dflash-launch").c_str(), 0777);
  std::vector<RunEntry> runs;
  std::string err;
  EXPECT_FALSE(ListRuns(&runs, &err));
  EXPECT_NE(err.find("mode 0777"), std::string::npos) << err;
  RunRegistration reg;
  EXPECT_FALSE(reg.Register(RunEntry{}, &err));
  std::filesystem::remove(xdg_ + "/dflash-launch");
  std::filesystem::create_directory_symlink("/tmp", xdg_ + "/dflash-launch");
  EXPECT_FALSE(ListRuns(&runs, &err));
  EXPECT_NE(err.find("a symlink"), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash
