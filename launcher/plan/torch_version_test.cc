// The torch version in a gate key comes from the interpreter the role will run:
// found in the role's own PATH, asked without a shell.
#include "launcher/plan/torch_version.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "common/fd.h"
#include "common/spawn.h"

namespace dflash {
namespace {

class TorchVersionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dflash_torch_version_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// <dir>/<sub>/<name>: a script standing in for a python.
  std::string FakePython(const std::string& sub, const std::string& body, const std::string& name = "python3") {
    std::filesystem::create_directories(dir_ + "/" + sub);
    std::string path = dir_ + "/" + sub + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path.c_str(), 0755);
    return dir_ + "/" + sub;
  }
  RoleSpec Role(std::vector<std::string> command, const std::string& path) {
    RoleSpec r;
    r.name = "r";
    r.command = std::move(command);
    r.env = {{"PATH", path + ":/usr/bin:/bin"}};
    return r;
  }
  std::string dir_;
};

TEST_F(TorchVersionTest, ARolesPathDecidesWhichPythonIsAsked) {
  // The launcher's own PATH finds the real python3; each role's env finds its own.
  std::string a = FakePython("a", "echo 1.2.3+fake");
  std::string b = FakePython("b", "echo 4.5.6+other");
  EXPECT_EQ(TorchVersionFor(Role({"python3", "train.py"}, a)), "1.2.3+fake");
  EXPECT_EQ(TorchVersionFor(Role({"python3", "train.py"}, b)), "4.5.6+other");  // not the cached answer for a
  // A command that is not a python: its python3 is still the role's.
  EXPECT_EQ(TorchVersionFor(Role({"sh", "-c", "exec python3 train.py"}, b)), "4.5.6+other");
}

TEST_F(TorchVersionTest, ThePythonIsGivenTheRolesEnvironment) {
  std::string a = FakePython("a", "echo \"$DFLASH_TEST_MARK\"");
  RoleSpec r = Role({"python3"}, a);
  r.env.emplace_back("DFLASH_TEST_MARK", "from-the-role");
  EXPECT_EQ(TorchVersionFor(r), "from-the-role");
}

TEST_F(TorchVersionTest, APythonThatFailsOrSaysNothingIsUnknown) {
  std::string bad = FakePython("bad", "echo 9.9.9; exit 3");
  EXPECT_EQ(AskPythonForTorchVersion("python3", {"PATH=" + bad}, "", Millis(10'000)), "unknown");
  std::string mute = FakePython("mute", "exit 0");
  EXPECT_EQ(AskPythonForTorchVersion("python3", {"PATH=" + mute}, "", Millis(10'000)), "unknown");
  EXPECT_EQ(AskPythonForTorchVersion("python3", {"PATH=" + dir_ + "/nowhere"}, "", Millis(10'000)), "unknown");
}

TEST_F(TorchVersionTest, AHangingPythonIsKilledAndReaped) {
  std::string pid_file = dir_ + "/pid";
  std::string hang = FakePython("hang", "echo $$ > " + pid_file + "; exec sleep 60");
  EXPECT_EQ(AskPythonForTorchVersion("python3", {"PATH=" + hang + ":/usr/bin:/bin"}, "", Millis(300)), "unknown");
  std::string text, err;
  ASSERT_TRUE(ReadFile(pid_file, &text, &err)) << err;
  pid_t pid = std::stoi(text);
  EXPECT_EQ(::kill(pid, 0), -1);  // killed and reaped: not even a zombie is left
  EXPECT_EQ(errno, ESRCH);
}

TEST_F(TorchVersionTest, NoShellReadsTheInterpretersName) {
  // popen() would have run this through sh: the `;` would start a second command.
  std::string a = FakePython("a", "echo 1.0");
  std::string planted = dir_ + "/pwned";
  RoleSpec r = Role({"python3;touch pwned", "x.py"}, a);  // a python by its name, to be found in PATH
  r.cwd = dir_;
  EXPECT_EQ(TorchVersionFor(r), "unknown");
  EXPECT_FALSE(std::filesystem::exists(planted));
}

}  // namespace
}  // namespace dflash
