// The test-support library against the real OS: what every other suite relies on.
#include <fcntl.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "testing/files.h"
#include "testing/process.h"
#include "testing/temp_dir.h"
#include "testing/wait.h"

namespace dflash::test {
namespace {

namespace fs = std::filesystem;

TEST(TempDir, IsPrivateAndGoesAwayWithWhatATestLockedUp) {
  std::string kept;
  {
    TempDir t("support-test");
    kept = t.path();
    struct stat st {};
    ASSERT_EQ(::stat(t.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_NE(fs::path(t.path()).filename().string().find("support-test."), std::string::npos);
    WriteText(t / "ro/inner/file", "x");
    ::chmod((t / "ro/inner").c_str(), 0500);
    ::chmod((t / "ro").c_str(), 0);
  }
  EXPECT_FALSE(fs::exists(kept));
}

TEST(Files, WriteTextMakesParentsAndSlurpReadsItBack) {
  TempDir t;
  WriteText(t / "a/b/c.txt", std::string("bytes\0and more", 14));
  EXPECT_EQ(Slurp(t / "a/b/c.txt"), std::string("bytes\0and more", 14));
}

TEST(Files, SlurpOfAMissingFileFailsTheTestNamingThePath) {
  // (The macro cannot see locals: a fixed path that does not exist.)
  EXPECT_NONFATAL_FAILURE(Slurp("/nonexistent/dflash-slurp-nope"), "/nonexistent/dflash-slurp-nope");
}

TEST(Process, RunCapturesBothStreamsAndTheStatus) {
  // More than a pipe holds on each stream: neither may stall the child.
  Finished f = RunProcess({"sh", "-c", "head -c 200000 /dev/zero; head -c 300000 /dev/zero >&2; exit 7"});
  EXPECT_EQ(f.exit_code, 7);
  EXPECT_EQ(f.out.size(), 200000u);
  EXPECT_EQ(f.err.size(), 300000u);
}

TEST(Process, SignalDeathIs128PlusNAndTheEnvironmentIsAsAsked) {
  EXPECT_EQ(RunProcess({"sh", "-c", "kill -TERM $$"}).exit_code, 128 + SIGTERM);
  ProcessOptions o;
  o.argv = {"sh", "-c", "echo \"$ONLY|${HOME-unset}\""};
  o.env = std::vector<std::string>{"PATH=/usr/bin:/bin"};
  o.set_env = {{"ONLY", "this"}};
  EXPECT_EQ(RunProcess(o).out, "this|unset\n");
}

TEST(Process, BlockedSignalsOfTheTestDoNotReachTheChild) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  Finished f = RunProcess({"sh", "-c", "grep SigBlk /proc/self/status"});
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  EXPECT_EQ(f.out, "SigBlk:\t0000000000000000\n");
}

TEST(Process, OutputToAFileAndAnFdMapped) {
  TempDir t;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  ProcessOptions o;
  o.argv = {"sh", "-c", "echo to-file; echo via-9 >&9"};
  o.out = Output::File(t / "out");
  o.fds = {{w.get(), 9}};  // (dash redirects single-digit fds only)
  Process proc;
  std::string err;
  ASSERT_TRUE(StartProcess(o, &proc, &err)) << err;
  w.reset();
  EXPECT_EQ(ReadToEof(r.get()), "via-9\n");
  EXPECT_EQ(ExitCodeOf(WaitForExit(proc.pid)), 0);
  EXPECT_EQ(Slurp(t / "out"), "to-file\n");
}

TEST(Process, AMissingProgramIsAClearError) {
  ProcessOptions o;
  o.argv = {"/nonexistent/dflash-program"};
  Process p;
  std::string err;
  bool started = StartProcess(o, &p, &err);
  // glibc's posix_spawn reports exec failure to the caller (ENOENT), naming the program.
  EXPECT_FALSE(started);
  EXPECT_NE(err.find("/nonexistent/dflash-program"), std::string::npos) << err;
}

TEST(Wait, WaitUntilSeesTheEventAndGivesUpAtTheDeadline) {
  std::atomic<bool> flag{false};
  std::thread setter([&] { flag = true; });
  EXPECT_TRUE(WaitUntil([&] { return flag.load(); }));
  setter.join();
  EXPECT_FALSE(WaitUntil([] { return false; }, 20ms));
}

TEST(Wait, ReadUntilStopsAtTheWantedTextOrAtEof) {
  // The child blocks on `go` (fd 9) after "ready": what was read at that point is all there is.
  int g[2];
  ASSERT_EQ(::pipe2(g, O_CLOEXEC), 0);
  UniqueFd go_r(g[0]), go_w(g[1]);
  Process p;
  std::string err;
  ProcessOptions o;
  o.argv = {"sh", "-c", "echo one; echo ready; read x <&9; echo after"};
  o.fds = {{go_r.get(), 9}};
  ASSERT_TRUE(StartProcess(o, &p, &err)) << err;
  go_r.reset();
  std::string got;
  EXPECT_TRUE(ReadUntil(p.out.get(), "ready\n", &got));
  EXPECT_EQ(got, "one\nready\n");
  go_w.reset();  // EOF on fd 9: the shell goes on and ends
  EXPECT_FALSE(ReadUntil(p.out.get(), "absent", &got));
  EXPECT_EQ(got, "one\nready\nafter\n");
  EXPECT_EQ(ExitCodeOf(WaitForExit(p.pid)), 0);
}

}  // namespace
}  // namespace dflash::test
