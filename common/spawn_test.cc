#include "common/spawn.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "common/proc_scan.h"
#include "testing/files.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

SpawnOptions Sh(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.env = CurrentEnvironment();
  return o;
}

using test::ReadToEof;

/// Runs `opts` to completion with stdout captured.
int RunCapture(SpawnOptions opts, std::string* out) {
  int p[2];
  EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]), wr(p[1]);
  opts.stdout_fd = wr.get();
  Child c;
  std::string err;
  bool ok = Spawn(opts, &c, &err);
  wr.reset();
  *out = ReadToEof(rd.get());
  if (c.pid <= 0) return ok ? -1 : c.exit_code;
  ExitStatus st;
  EXPECT_TRUE(WaitForChild(c.pid, &st, &err)) << err;
  return st.ExitCode();
}

class SpawnTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ZombieChildrenOf(::getpid()).empty()) << "zombie children left behind";
  }
};

TEST_F(SpawnTest, ChildSeesExactlyStdioEvenWhenParentLeaksFds) {
  // Deliberately non-CLOEXEC fds, as a careless library (Boost.Process pipes,
  // spdlog's files) would leave them.
  int leaky_file = ::open("/dev/null", O_RDONLY);
  int leaky_pipe[2];
  ASSERT_EQ(::pipe(leaky_pipe), 0);
  int high = ::fcntl(leaky_file, F_DUPFD, 100);
  ASSERT_GE(high, 100);

  // The shell lists its own fds from a child `ls`: what it was given, not
  // the dynamic loader's transient fds right after exec.
  std::string out;
  EXPECT_EQ(RunCapture(Sh("ls /proc/$$/fd; true"), &out), 0);
  EXPECT_EQ(out, "0\n1\n2\n");

  SpawnOptions o;
  o.argv = {"sleep", "30"};
  o.env = CurrentEnvironment();
  Child c;
  std::string err;
  ASSERT_TRUE(Spawn(o, &c, &err)) << err;
  EXPECT_TRUE(c.pidfd.valid());
  ::kill(c.pid, SIGKILL);
  ExitStatus st;
  ASSERT_TRUE(WaitForChild(c.pid, &st, &err)) << err;
  EXPECT_EQ(st.ExitCode(), 128 + SIGKILL);
  ::close(leaky_file);
  ::close(leaky_pipe[0]);
  ::close(leaky_pipe[1]);
  ::close(high);
}

TEST_F(SpawnTest, KeepFdsArePassedAtTheSameNumber) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]), wr(p[1]);
  SpawnOptions o = Sh("echo through >&" + std::to_string(wr.get()));
  o.keep_fds = {wr.get()};
  Child c;
  std::string err;
  ASSERT_TRUE(Spawn(o, &c, &err)) << err;
  wr.reset();
  EXPECT_EQ(ReadToEof(rd.get()), "through\n");
  ExitStatus st;
  ASSERT_TRUE(WaitForChild(c.pid, &st, &err));
  EXPECT_EQ(st.ExitCode(), 0);
}

TEST_F(SpawnTest, MissingPathIs127AndNamesThePathAndIsReaped) {
  SpawnOptions o;
  o.argv = {"/nonexistent/dflash-no-such-binary", "x"};
  Child c;
  std::string err;
  EXPECT_FALSE(Spawn(o, &c, &err));
  EXPECT_EQ(c.exit_code, 127);
  EXPECT_EQ(c.exec_errno, ENOENT);
  EXPECT_EQ(err, "cannot execute '/nonexistent/dflash-no-such-binary': No such file or directory");
  ASSERT_GT(c.pid, 0);  // the child existed and exited with the same code
  ExitStatus st;
  ASSERT_TRUE(WaitForChild(c.pid, &st, &err));
  EXPECT_EQ(st.ExitCode(), 127);
}

TEST_F(SpawnTest, NameNotInPathIs127WithoutFork) {
  SpawnOptions o;
  o.argv = {"dflash-no-such-command"};
  o.env = {"PATH=/nonexistent:/also-not"};
  Child c;
  std::string err;
  EXPECT_FALSE(Spawn(o, &c, &err));
  EXPECT_EQ(c.exit_code, 127);
  EXPECT_EQ(c.pid, -1);
  EXPECT_NE(err.find("cannot execute 'dflash-no-such-command': No such file or directory"),
            std::string::npos)
      << err;
}

TEST_F(SpawnTest, NonExecutableFileIs126) {
  fs::path f = fs::temp_directory_path() / ("spawn-noexec." + std::to_string(::getpid()));
  std::string err;
  ASSERT_TRUE(WriteFileAtomic(f.string(), "#!/bin/sh\nexit 0\n", &err, 0644)) << err;
  SpawnOptions o;
  o.argv = {f.string()};
  Child c;
  EXPECT_FALSE(Spawn(o, &c, &err));
  EXPECT_EQ(c.exit_code, 126);
  EXPECT_EQ(err, "cannot execute '" + f.string() + "': Permission denied");
  ExitStatus st;
  ASSERT_TRUE(WaitForChild(c.pid, &st, &err));
  EXPECT_EQ(st.ExitCode(), 126);
  fs::remove(f);
}

TEST_F(SpawnTest, PathLookupUsesTheChildsPath) {
  fs::path dir = fs::temp_directory_path() / ("spawn-path." + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string err;
  ASSERT_TRUE(WriteFileAtomic((dir / "dflash-hello").string(), "#!/bin/sh\necho \"hi $A\"\n",
                              &err, 0755));
  SpawnOptions o;
  o.argv = {"dflash-hello"};
  o.env = {"PATH=/nonexistent:" + dir.string(), "A=1"};
  std::string out;
  EXPECT_EQ(RunCapture(o, &out), 0);
  EXPECT_EQ(out, "hi 1\n");
  fs::remove_all(dir);
}

TEST_F(SpawnTest, EnvironmentIsExactlyTheGivenOne) {
  SpawnOptions o;
  o.argv = {"/usr/bin/env"};
  o.env = {"ONLY=this", "AND=that"};
  std::string out;
  EXPECT_EQ(RunCapture(o, &out), 0);
  EXPECT_EQ(out, "ONLY=this\nAND=that\n");
}

TEST_F(SpawnTest, CwdAndChdirFailure) {
  SpawnOptions o = Sh("pwd");
  o.cwd = "/proc";
  std::string out;
  EXPECT_EQ(RunCapture(o, &out), 0);
  EXPECT_EQ(out, "/proc\n");

  o.cwd = "/nonexistent-dir";
  Child c;
  std::string err;
  EXPECT_FALSE(Spawn(o, &c, &err));
  EXPECT_EQ(err, "cannot start '/bin/sh': chdir(/nonexistent-dir): No such file or directory");
  EXPECT_EQ(c.exit_code, 126);
  ExitStatus st;
  ASSERT_TRUE(WaitForChild(c.pid, &st, &err));
}

TEST_F(SpawnTest, SignalDeathIs128PlusNAndDiffersFromExitN) {
  std::string out;
  EXPECT_EQ(RunCapture(Sh("kill -TERM $$"), &out), 128 + SIGTERM);
  EXPECT_EQ(RunCapture(Sh("kill -KILL $$"), &out), 128 + SIGKILL);
  EXPECT_EQ(RunCapture(Sh("exit 9"), &out), 9);
}

TEST_F(SpawnTest, ProcessGroupAndSession) {
  SpawnOptions o;
  o.argv = {"sleep", "30"};
  o.env = CurrentEnvironment();
  for (auto g : {SpawnOptions::Group::kNewProcessGroup, SpawnOptions::Group::kNewSession,
                 SpawnOptions::Group::kInherit}) {
    o.group = g;
    Child c;
    std::string err;
    ASSERT_TRUE(Spawn(o, &c, &err)) << err;
    ProcStat st;
    ASSERT_TRUE(ReadProcStat(c.pid, &st));
    if (g == SpawnOptions::Group::kInherit) {
      EXPECT_EQ(st.pgid, ::getpgrp());
    } else {
      EXPECT_EQ(st.pgid, c.pid);
      EXPECT_EQ(st.sid == c.pid, g == SpawnOptions::Group::kNewSession);
    }
    ::kill(c.pid, SIGKILL);
    ExitStatus es;
    ASSERT_TRUE(WaitForChild(c.pid, &es, &err));
  }
}

TEST_F(SpawnTest, SignalMaskAndIgnoredSignalsAreReset) {
  struct sigaction ign{}, old_usr1{};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGUSR1, &ign, &old_usr1);
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  sigaddset(&block, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &block, &old_mask);
  // glibc's reserved signals (32, 33) ignored too, as some sandboxes leave them:
  // only the raw syscall can set (and reset) them.
  struct KSigaction { void (*handler)(int); unsigned long flags; void (*restorer)(); unsigned long mask; };
  KSigaction kign{SIG_IGN, 0, nullptr, 0}, old32{}, old33{};
  ::syscall(SYS_rt_sigaction, 32, &kign, &old32, sizeof kign.mask);
  ::syscall(SYS_rt_sigaction, 33, &kign, &old33, sizeof kign.mask);

  // grep itself, not a shell: dash blocks every signal around its own forks
  // and waits, so a shell's mask is not what it was given.
  SpawnOptions o;
  o.argv = {"grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"};
  o.env = CurrentEnvironment();
  std::string out;
  EXPECT_EQ(RunCapture(o, &out), 0);
  EXPECT_EQ(out, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");

  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGUSR1, &old_usr1, nullptr);
  ::syscall(SYS_rt_sigaction, 32, &old32, nullptr, sizeof kign.mask);
  ::syscall(SYS_rt_sigaction, 33, &old33, nullptr, sizeof kign.mask);
}

TEST_F(SpawnTest, DeathSignalKillsTheChildWhenTheSpawnerDies) {
  // The test process becomes a subreaper so the orphaned grandchild is
  // reparented to it and its death can be observed (and reaped).
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]), wr(p[1]);
  pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    SpawnOptions o;
    o.argv = {"sleep", "60"};
    o.env = CurrentEnvironment();
    o.death_signal = SIGKILL;
    Child c;
    std::string err;
    if (!Spawn(o, &c, &err)) ::_exit(1);
    ::write(wr.get(), &c.pid, sizeof c.pid);
    for (;;) ::pause();
  }
  wr.reset();
  pid_t grandchild = 0;
  ASSERT_EQ(::read(rd.get(), &grandchild, sizeof grandchild),
            static_cast<ssize_t>(sizeof grandchild));
  ASSERT_GT(grandchild, 0);

  ::kill(middle, SIGKILL);
  ExitStatus st;
  std::string err;
  ASSERT_TRUE(WaitForChild(middle, &st, &err)) << err;
  EXPECT_EQ(st.ExitCode(), 128 + SIGKILL);

  // The grandchild is ours now (subreaper); a pidfd bounds the wait.
  UniqueFd pidfd(PidfdOpen(grandchild));
  ASSERT_TRUE(pidfd.valid());
  struct pollfd pfd{pidfd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 20000), 1) << "grandchild survived its spawner";
  ASSERT_TRUE(WaitForChild(grandchild, &st, &err)) << err;
  EXPECT_TRUE(st.signaled);
  EXPECT_EQ(st.signal, SIGKILL);
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_F(SpawnTest, StdioCanBeSwapped) {
  int p[2], q[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(q, O_CLOEXEC), 0);
  UniqueFd prd(p[0]), pwr(p[1]), qrd(q[0]), qwr(q[1]);
  SpawnOptions o = Sh("echo out; echo err >&2");
  o.stdout_fd = pwr.get();
  o.stderr_fd = qwr.get();
  Child c;
  std::string err;
  ASSERT_TRUE(Spawn(o, &c, &err)) << err;
  pwr.reset();
  qwr.reset();
  EXPECT_EQ(ReadToEof(prd.get()), "out\n");
  EXPECT_EQ(ReadToEof(qrd.get()), "err\n");
  ExitStatus st;
  ASSERT_TRUE(WaitForChild(c.pid, &st, &err));
}

TEST(ExitStatus, Decode) {
  ExitStatus s = DecodeWaitStatus(3 << 8);
  EXPECT_TRUE(s.exited);
  EXPECT_EQ(s.ExitCode(), 3);
  EXPECT_EQ(s.Describe(), "exited with code 3");
  s = DecodeWaitStatus(SIGSEGV | 0x80);
  EXPECT_TRUE(s.signaled);
  EXPECT_TRUE(s.core_dumped);
  EXPECT_EQ(s.ExitCode(), 139);
  EXPECT_EQ(s.Describe(), "killed by SIGSEGV (core dumped)");
  EXPECT_EQ(ExitCodeFromWaitStatus(SIGKILL), 137);
  EXPECT_EQ(ExitCodeFromWaitStatus(9 << 8), 9);
}

TEST(Env, SetUnsetGet) {
  std::vector<std::string> env = {"A=1", "B=2", "AB=3"};
  SetEnvVar(&env, "A", "x");
  EXPECT_EQ(GetEnvVar(env, "A"), "x");
  EXPECT_EQ(GetEnvVar(env, "AB"), "3");
  UnsetEnvVar(&env, "B");
  EXPECT_FALSE(GetEnvVar(env, "B"));
  EXPECT_EQ(env.size(), 2u);
}

}  // namespace
}  // namespace dflash
