// Units of the process hardening (issue #12): the command check, the run's
// cgroup sub-tree (skipped where none can be made). The fd budget: launcher/commands/fd_limit_test.cc.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/spawn.h"
#include "launcher/plan/executable_check.h"
#include "launcher/supervise/cgroup_tree.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

class CommandCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dflash-cc-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "bin");
    Write(dir_ / "bin" / "tool", 0755);
    Write(dir_ / "noexec", 0644);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void Write(const fs::path& p, unsigned mode) {
    std::ofstream(p) << "#!/bin/sh\n";
    ::chmod(p.c_str(), mode);
  }
  std::vector<ConfigError> Check(std::vector<std::string> command, EnvList role_env = {}) {
    RunConfig c;
    RoleSpec r;
    r.name = "r";
    r.command = std::move(command);
    r.command_pos = {"run.toml", 7, 11};
    r.env = std::move(role_env);
    r.cwd = dir_.string();
    c.roles.push_back(r);
    return CheckCommands(c, {{"PATH", "/usr/bin:/bin"}});
  }
  fs::path dir_;
};

TEST_F(CommandCheck, FoundAndExecutablePasses) {
  EXPECT_TRUE(Check({"sh", "-c", "true"}).empty());
  EXPECT_TRUE(Check({(dir_ / "bin" / "tool").string()}).empty());
  EXPECT_TRUE(Check({"bin/tool"}).empty());  // relative to the role's cwd
}

TEST_F(CommandCheck, NotFoundInTheRolesPathIsAnErrorAtTheCommandKey) {
  auto e = Check({"tool"});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].key, "role[r].command");
  EXPECT_EQ(e[0].pos.ToString(), "run.toml:7:11");
  EXPECT_NE(e[0].message.find("not found"), std::string::npos);
  // The role's own PATH decides.
  EXPECT_TRUE(Check({"tool"}, {{"PATH", (dir_ / "bin").string()}}).empty());
}

TEST_F(CommandCheck, NotExecutableAndDirectoriesAreErrors) {
  auto e = Check({(dir_ / "noexec").string()});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NE(e[0].message.find("not executable"), std::string::npos);
  e = Check({(dir_ / "bin").string()});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].found, "a directory");
  EXPECT_EQ(Check({(dir_ / "missing").string()}).size(), 1u);
}

TEST_F(CommandCheck, AMissingPythonScriptIsAnErrorAtTheCommandKey) {
  // Python would start and exit 2 ("can't open file"): the exit code of a config error, after spawning.
  auto e = Check({"python3", "-u", "train_drafer.py", "--steps", "3"});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].pos.ToString(), "run.toml:7:11");
  EXPECT_NE(e[0].message.find("`train_drafer.py`, which is not found"), std::string::npos) << e[0].message;
  EXPECT_EQ(e[0].found, "no file " + (dir_ / "train_drafer.py").string());
  {
    std::ofstream((dir_ / "train_drafer.py").string()) << "print('hi')\n";
  }
  EXPECT_TRUE(Check({"python3", "-u", "train_drafer.py"}).empty());
  // Nothing to look for: a module, inline code, a directory with __main__.py.
  EXPECT_TRUE(Check({"python3", "-m", "no_such_module_here"}).empty());
  EXPECT_TRUE(Check({"python3", "-c", "pass"}).empty());
  fs::create_directories(dir_ / "app");
  EXPECT_EQ(Check({"python3", "app"}).size(), 1u);
  std::ofstream((dir_ / "app" / "__main__.py").string()) << "\n";
  EXPECT_TRUE(Check({"python3", "app"}).empty());
}

TEST(RunCgroup, ModeParsing) {
  CgroupMode m;
  std::string err;
  EXPECT_TRUE(ParseCgroupMode(nullptr, &m, &err) && m == CgroupMode::kAuto);
  EXPECT_TRUE(ParseCgroupMode("off", &m, &err) && m == CgroupMode::kOff);
  EXPECT_TRUE(ParseCgroupMode("require", &m, &err) && m == CgroupMode::kRequire);
  EXPECT_FALSE(ParseCgroupMode("yes please", &m, &err));
  EXPECT_NE(err.find("auto, off or require"), std::string::npos);
}

TEST(RunCgroup, KillEndsATreeThatLeftItsSessionAndTheLeafGoes) {
  RunCgroup cg;
  std::string err;
  if (!cg.Create("unit-" + std::to_string(::getpid()), &err)) GTEST_SKIP() << "no cgroup v2 sub-tree here: " << err;
  UniqueFd procs = cg.MakeLeaf(LeafName(0, 0), &err);
  ASSERT_TRUE(procs) << err;
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "setsid sleep 1000 & exec sleep 1000"};
  o.env = CurrentEnvironment();
  o.cgroup_procs_fd = procs.get();
  Child c;
  ASSERT_TRUE(Spawn(o, &c, &err)) << err;
  std::string leaf = cg.LeafDir(LeafName(0, 0));
  std::string text;
  ASSERT_TRUE(ReadFile("/proc/" + std::to_string(c.pid) + "/cgroup", &text, &err));
  EXPECT_NE(text.find(LeafName(0, 0)), std::string::npos) << text;
  ASSERT_TRUE(RunCgroup::Kill(leaf));
  int status = 0;
  ASSERT_EQ(::waitpid(c.pid, &status, 0), c.pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(RunCgroup::WaitEmpty(leaf, 5000));  // the setsid'd sleep too
  std::string dir = cg.dir();
  cg.Destroy();
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
}  // namespace dflash
