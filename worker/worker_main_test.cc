// The dflash-worker binary as a real separate process: signals from outside,
// the death of its parent, usage errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/proc_scan.h"
#include "common/spawn.h"
#include "testing/files.h"
#include "testing/wait.h"

namespace dflash {
namespace {

struct WorkerRun {
  Child child;
  UniqueFd out, err;
};

/// Starts dflash-worker with `args`, stdout and stderr on pipes.
WorkerRun StartWorker(std::vector<std::string> args, int death_signal = 0) {
  WorkerRun r;
  int o[2], e[2];
  EXPECT_EQ(::pipe2(o, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(e, O_CLOEXEC), 0);
  r.out.reset(o[0]);
  r.err.reset(e[0]);
  UniqueFd ow(o[1]), ew(e[1]);
  SpawnOptions so;
  so.argv = {DFLASH_WORKER_BIN};
  so.argv.insert(so.argv.end(), args.begin(), args.end());
  so.env = CurrentEnvironment();
  so.stdout_fd = ow.get();
  so.stderr_fd = ew.get();
  so.death_signal = death_signal;
  std::string err;
  EXPECT_TRUE(Spawn(so, &r.child, &err)) << err;
  return r;
}

int Finish(WorkerRun& r) {
  ExitStatus st;
  std::string err;
  EXPECT_TRUE(WaitForChild(r.child.pid, &st, &err)) << err;
  return st.ExitCode();
}

class WorkerMain : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(ZombieChildrenOf(::getpid()).empty()) << "zombies left behind";
  }
};

TEST_F(WorkerMain, SigtermFromOutsideIsForwardedAndTheStatusPassesUp) {
  WorkerRun r = StartWorker({"--ready", "log:^ready$", "--", "sh", "-c",
                       // No long-lived child: one forked just as the group's SIGTERM comes can take it before
                       // its exec (sh's trap, not yet reset) and live on until the 10 s grace's SIGKILL.
                       "trap 'exit 42' TERM; echo ready; while :; do sleep 0.1; done"});
  std::string out;
  ASSERT_TRUE(test::ReadUntil(r.out.get(), "ready\n", &out)) << out;
  ::kill(r.child.pid, SIGTERM);
  EXPECT_EQ(Finish(r), 42);
}

TEST_F(WorkerMain, SystemdNotifyReadyVerbose) {
  if (::access("/usr/bin/systemd-notify", X_OK) != 0) GTEST_SKIP() << "no systemd-notify";
  WorkerRun r = StartWorker({"-v", "--name", "drafter:0", "--ready", "notify", "--ready-timeout", "1m",
                       "--", "sh", "-c", "systemd-notify --ready --status=warm"});
  EXPECT_EQ(Finish(r), 0);
  std::string err = test::ReadToEof(r.err.get());
  EXPECT_NE(err.find("dflash-worker: drafter:0 ready\n"), std::string::npos) << err;
  EXPECT_NE(err.find("dflash-worker: drafter:0: warm\n"), std::string::npos) << err;
}

TEST_F(WorkerMain, TimeoutMessage) {
  WorkerRun r = StartWorker({"--name", "drafter:1", "--ready", "notify", "--ready-timeout", "300ms",
                       "--", "sleep", "30"});
  EXPECT_EQ(Finish(r), 75);
  std::string err = test::ReadToEof(r.err.get());
  EXPECT_NE(err.find("dflash-worker: drafter:1 (pid "), std::string::npos) << err;
  EXPECT_NE(err.find(") not ready after 300ms (ready = notify: no READY=1 received)\n"),
            std::string::npos)
      << err;
}

TEST_F(WorkerMain, ExecFailureAndUsage) {
  WorkerRun r = StartWorker({"--", "/nonexistent/payload"});
  EXPECT_EQ(Finish(r), 127);
  EXPECT_EQ(test::ReadToEof(r.err.get()),
            "dflash-worker: cannot execute '/nonexistent/payload': No such file or directory\n");
  WorkerRun u = StartWorker({"--ready", "sometimes", "--", "true"});
  EXPECT_EQ(Finish(u), 64);
  WorkerRun n = StartWorker({});
  EXPECT_EQ(Finish(n), 64);
  WorkerRun ok = StartWorker({"sh", "-c", "exit 7"});  // "--" is optional
  EXPECT_EQ(Finish(ok), 7);
}

TEST_F(WorkerMain, PayloadDiesWithAKilledHost) {
  // SIGKILL cannot be forwarded or handled: the payload's PR_SET_PDEATHSIG
  // (SIGKILL) is what takes it down with the host.
  WorkerRun r = StartWorker({"--", "sh", "-c", "trap '' TERM; echo $$; exec sleep 60"});
  std::string line;
  ASSERT_TRUE(test::ReadUntil(r.out.get(), "\n", &line)) << line;
  pid_t payload = std::stoi(line);
  UniqueFd pidfd(PidfdOpen(payload));
  ASSERT_TRUE(pidfd.valid());
  ::kill(r.child.pid, SIGKILL);
  EXPECT_EQ(Finish(r), 128 + SIGKILL);
  struct pollfd p{pidfd.get(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 30000), 1) << "payload outlived its host";
  ::waitpid(payload, nullptr, WNOHANG);  // ours only if this process is a subreaper
}

TEST_F(WorkerMain, HostKillsThePayloadWhenItsParentDies) {
  // test -> middle -> dflash-worker (PDEATHSIG SIGTERM) -> payload. Killing
  // `middle` delivers SIGTERM to the worker, which must notice that its
  // parent is gone (not a plain SIGTERM to forward) and kill the payload.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd rd(p[0]), wr(p[1]);
  pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    SpawnOptions so;
    // The payload ignores SIGTERM: only a SIGKILL ends it.
    so.argv = {DFLASH_WORKER_BIN, "--", "sh", "-c", "trap '' TERM; echo $$; exec sleep 60"};
    so.env = CurrentEnvironment();
    so.stdout_fd = wr.get();
    so.death_signal = SIGTERM;
    Child c;
    std::string err;
    if (!Spawn(so, &c, &err)) ::_exit(1);
    for (;;) ::pause();
  }
  wr.reset();
  std::string line;
  ASSERT_TRUE(test::ReadUntil(rd.get(), "\n", &line)) << line;
  pid_t payload = std::stoi(line);

  ::kill(middle, SIGKILL);
  ExitStatus st;
  std::string err;
  ASSERT_TRUE(WaitForChild(middle, &st, &err)) << err;

  // The orphaned worker is now ours (subreaper); bound the wait.
  pid_t worker = 0;
  ASSERT_TRUE(test::WaitUntil([&] {
    for (const auto& c : ChildrenOf(::getpid())) worker = c.pid;
    return worker != 0;
  }));
  UniqueFd pidfd(PidfdOpen(worker));
  struct pollfd pp{pidfd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&pp, 1, 30000), 1) << "worker outlived its parent";
  ASSERT_TRUE(WaitForChild(worker, &st, &err)) << err;
  EXPECT_EQ(st.ExitCode(), 128 + SIGKILL);  // the payload's status, passed up
  ProcStat ps;
  EXPECT_FALSE(ReadProcStat(payload, &ps) && ps.state != 'Z');
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

}  // namespace
}  // namespace dflash
