#include "worker/payload_host.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <set>

#include "common/fd.h"
#include "common/proc_scan.h"
#include "testing/files.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

bool Alive(pid_t pid) {
  ProcStat st;
  return ReadProcStat(pid, &st) && st.state != 'Z';
}

/// Shell that blocks until `path` exists (the test creates it when the event it waits for has
/// happened), giving up after 60 s so a broken host cannot hang the suite.
std::string BlockUntilExists(const std::string& path) {
  return "i=0; while [ ! -e '" + path + "' ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; ";
}

/// The event a blocked payload waits for (BlockUntilExists).
void Release(const std::string& path) { test::WriteText(path, ""); }

/// A file-backed capture for the payload's (or the relay's) output.
struct Capture {
  UniqueFd fd{::memfd_create("capture", MFD_CLOEXEC)};
  std::string Read() const {
    std::string s;
    char buf[65536];
    off_t off = 0;
    ssize_t n;
    while ((n = ::pread(fd.get(), buf, sizeof buf, off)) > 0) {
      s.append(buf, static_cast<size_t>(n));
      off += n;
    }
    return s;
  }
};

class PayloadHostTest : public ::testing::Test {
 protected:
  void TearDown() override {
    // One reaper, and it reaped everything: the payload and its orphans.
    EXPECT_TRUE(ZombieChildrenOf(::getpid()).empty()) << "zombies left behind";
    EXPECT_TRUE(ChildrenOf(::getpid()).empty()) << "children left behind";
    int subreaper = -1;
    ::prctl(PR_GET_CHILD_SUBREAPER, &subreaper);
    EXPECT_EQ(subreaper, 0) << "RunPayload must restore the subreaper flag";
  }

  PayloadHostOptions Sh(const std::string& script, const std::string& ready = "none",
                        Millis timeout = Millis(0)) {
    PayloadHostOptions o;
    o.name = "test:0";
    o.argv = {"/bin/sh", "-c", script};
    o.stdout_fd = out_.fd.get();
    o.stderr_fd = err_.fd.get();
    std::string e;
    EXPECT_TRUE(ParseReadySpec(ready, &o.ready, &e)) << e;
    o.ready.timeout = timeout;
    o.stop_grace = Millis(2000);
    return o;
  }

  test::TempDir tmp_{"payload-host"};
  fs::path dir_{tmp_.path()};
  std::string go_ = tmp_ / "go";  // BlockUntilExists(go_) / Release(go_)
  Capture out_, err_;
};

TEST_F(PayloadHostTest, NoneIsReadyAtSpawnAndExitCodePassesUp) {
  int ready = 0;
  pid_t spawned = 0;
  auto o = Sh("exit 3");
  o.on_spawned = [&](pid_t p) { spawned = p; };
  o.on_ready = [&] { ++ready; };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(ready, 1);
  EXPECT_TRUE(r.ready);
  EXPECT_EQ(r.pid, spawned);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_TRUE(r.message.empty()) << r.message;
}

TEST_F(PayloadHostTest, ExitModeIsReadyOnlyAfterExitZero) {
  int ready = 0;
  pid_t pid = 0;
  bool was_alive_at_ready = true;
  auto o = Sh("sleep 0.2; exit 0", "exit");
  o.on_spawned = [&](pid_t p) { pid = p; };
  o.on_ready = [&] {
    ++ready;
    was_alive_at_ready = Alive(pid);
  };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(ready, 1);
  EXPECT_FALSE(was_alive_at_ready);
  EXPECT_EQ(r.exit_code, 0);

  ready = 0;
  r = RunPayload(Sh("exit 4", "exit"));
  EXPECT_FALSE(r.ready);
  EXPECT_EQ(r.exit_code, 4);
}

TEST_F(PayloadHostTest, LogModeIsReadyAtTheMatchingLine) {
  int ready = 0;
  pid_t pid = 0;
  std::string out_at_ready;
  bool alive_at_ready = false;
  // "after" waits until on_ready has looked: what it saw is exactly what came before.
  auto o = Sh("echo starting; echo 'compiled in 0s' >&2; echo compiled; " + BlockUntilExists(go_) +
                  "echo after",
              "log:^compiled$", Millis(60'000));
  o.on_spawned = [&](pid_t p) { pid = p; };
  o.on_ready = [&] {
    ++ready;
    alive_at_ready = Alive(pid);
    out_at_ready = out_.Read();
    Release(go_);
  };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(ready, 1);
  EXPECT_TRUE(alive_at_ready);
  EXPECT_EQ(out_at_ready, "starting\ncompiled\n");  // the matching line is out first
  EXPECT_EQ(out_.Read(), "starting\ncompiled\nafter\n");
  EXPECT_EQ(err_.Read(), "compiled in 0s\n");
  EXPECT_EQ(r.exit_code, 0);
}

TEST_F(PayloadHostTest, FileModeIsReadyWhenThePathAppears) {
  int ready = 0;
  pid_t pid = 0;
  bool alive_at_ready = false, existed_at_ready = false;
  std::string marker = (dir_ / "sub" / "compiled").string();
  // The path appears a moment after the start (not there at the first look); the payload then
  // stays until on_ready has looked.
  auto o = Sh("sleep 0.2; mkdir -p '" + dir_.string() + "/sub'; touch '" + marker + "'; " +
                  BlockUntilExists(go_),
              "file:" + marker, Millis(60'000));
  o.on_spawned = [&](pid_t p) { pid = p; };
  o.on_ready = [&] {
    ++ready;
    alive_at_ready = Alive(pid);
    existed_at_ready = fs::exists(marker);
    Release(go_);
  };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(ready, 1);
  EXPECT_TRUE(alive_at_ready);
  EXPECT_TRUE(existed_at_ready);
  EXPECT_EQ(r.exit_code, 0);
}

TEST_F(PayloadHostTest, NotifyModeWithSystemdNotifyDoesNotHang) {
  if (::access("/usr/bin/systemd-notify", X_OK) != 0) GTEST_SKIP() << "no systemd-notify";
  int ready = 0;
  pid_t pid = 0;
  bool alive_at_ready = false;
  std::vector<std::string> statuses;
  auto o = Sh("systemd-notify --status=compiling; echo status=$?; systemd-notify --ready; "
              "echo notified=$?; " + BlockUntilExists(go_),
              "notify", Millis(60'000));
  o.on_spawned = [&](pid_t p) { pid = p; };
  o.on_ready = [&] {
    ++ready;
    alive_at_ready = Alive(pid);
    Release(go_);
  };
  o.on_status = [&](std::string_view s) { statuses.emplace_back(s); };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(ready, 1);
  EXPECT_TRUE(alive_at_ready);
  EXPECT_EQ(statuses, std::vector<std::string>{"compiling"});
  // An unanswered barrier is a 5 s hang that ends in "Failed to invoke barrier" and exit 1: two 0s
  // say both barriers were answered, with no clock that a loaded machine could fail.
  EXPECT_EQ(out_.Read(), "status=0\nnotified=0\n");
  EXPECT_EQ(r.exit_code, 0);
}

TEST_F(PayloadHostTest, NotifySocketIsReplacedAndExtraEnvIsSet) {
  auto o = Sh("echo \"$NOTIFY_SOCKET|$DFLASH_GATE_ROLE\"", "notify", Millis(60'000));
  o.env = CurrentEnvironment();
  SetEnvVar(&o.env, "NOTIFY_SOCKET", "@inherited-from-systemd");
  o.extra_env = {{"DFLASH_GATE_ROLE", "leader"}};
  PayloadResult r = RunPayload(o);
  std::string out = out_.Read();
  EXPECT_EQ(out.rfind("@dflash/" + std::to_string(::getpid()) + "/", 0), 0u) << out;
  EXPECT_NE(out.find("|leader\n"), std::string::npos) << out;
  EXPECT_FALSE(r.ready);  // exited without READY=1
  EXPECT_EQ(r.exit_code, 0);

  Capture fresh;
  auto o2 = Sh("echo \"[${NOTIFY_SOCKET-unset}]\"", "log:x");
  o2.stdout_fd = fresh.fd.get();
  o2.env = o.env;
  RunPayload(o2);
  EXPECT_EQ(fresh.Read(), "[unset]\n");
}

TEST_F(PayloadHostTest, ReadyFromAnUnrelatedProcessIsIgnored) {
  // A sender in a session of its own (not the payload's process group) says READY=1 and stays
  // alive until the host has judged it: the payload's own STATUS=after goes out after that
  // READY=1, so on_status("after") means the host has read past it -- and only then is the
  // sender let go. No sleep decides whether it was alive when judged.
  std::string sender = tmp_ / "send.py";
  test::WriteText(sender,
                  "import os, socket, sys, time\n"
                  "a = os.environ['NOTIFY_SOCKET']\n"
                  "socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(sys.argv[1].encode(), '\\0' + a[1:])\n"
                  "if len(sys.argv) > 2:\n"
                  "    open(sys.argv[2] + '.sent', 'w').close()\n"
                  "    deadline = time.time() + 60\n"
                  "    while not os.path.exists(sys.argv[2]) and time.time() < deadline:\n"
                  "        time.sleep(0.01)\n");
  int ready = 0;
  std::vector<std::string> statuses;
  auto o = Sh("setsid python3 '" + sender + "' READY=1 '" + go_ + "' & " + BlockUntilExists(go_ + ".sent") +
                  "python3 '" + sender + "' STATUS=after; wait",
              "notify", Millis(60'000));
  o.on_ready = [&] { ++ready; };
  o.on_status = [&](std::string_view st) {
    statuses.emplace_back(st);
    Release(go_);
  };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(statuses, std::vector<std::string>{"after"});
  EXPECT_EQ(ready, 0);
  EXPECT_FALSE(r.ready);  // it exited without a READY=1 of its own
  EXPECT_EQ(r.exit_code, 0);
}

TEST_F(PayloadHostTest, TimeoutCallbackSeesTheReportedMessageAndStops) {
  int timeouts = 0;
  std::string message;
  auto o = Sh("exec sleep 30", "notify", Millis(300));
  o.on_ready_timeout = [&](const std::string& m) {
    ++timeouts;
    message = m;
    return TimeoutAction::kStop;
  };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(timeouts, 1);
  EXPECT_EQ(message, r.message);
  EXPECT_NE(message.find("not ready after 300ms"), std::string::npos) << message;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 75);
}

TEST_F(PayloadHostTest, TimeoutStopsThePayloadAndReports75) {
  pid_t pid = 0;
  // The payload ignores SIGTERM: the host must escalate to SIGKILL.
  auto o = Sh("trap '' TERM; echo started; while :; do sleep 0.05; done", "log:^never$",
              Millis(500));
  o.stop_grace = Millis(300);
  o.on_spawned = [&](pid_t p) { pid = p; };
  PayloadResult r = RunPayload(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.ready);
  EXPECT_EQ(r.exit_code, 75);
  EXPECT_EQ(r.message, "test:0 (pid " + std::to_string(pid) +
                           ") not ready after 500ms (ready = log: no output line matched '^never$')");
  ASSERT_TRUE(r.status);
  EXPECT_EQ(r.status->signal, SIGKILL);
  EXPECT_FALSE(Alive(pid));
}

TEST_F(PayloadHostTest, TimeoutCanBeIgnoredByTheCaller) {
  // The payload ends only after the timeout callback ran: the callback is what lets it go, so
  // exit 5 proves both that it ran and that kKeepRunning left the payload alone.
  int timeouts = 0;
  auto o = Sh(BlockUntilExists(go_) + "exit 5", "notify", Millis(100));
  o.on_ready_timeout = [&](const std::string& m) {
    ++timeouts;
    EXPECT_NE(m.find(") not ready after 100ms (ready = notify: no READY=1 received)"), std::string::npos) << m;
    Release(go_);
    return TimeoutAction::kKeepRunning;
  };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(timeouts, 1);
  EXPECT_FALSE(r.timed_out);
  EXPECT_FALSE(r.ready);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_EQ(r.message.find("not ready"), std::string::npos) << r.message;
}

TEST_F(PayloadHostTest, SignalsToTheHostReachThePayloadGroup) {
  for (int sig : {SIGTERM, SIGUSR2, SIGHUP}) {
    SCOPED_TRACE(sig);
    // `sleep & wait` so the trap runs at once; the sleep (same group) gets
    // the signal too, so nothing is left behind.
    auto o = Sh("trap 'exit 42' " + std::to_string(sig) + "; echo ready; sleep 30 & wait",
                "log:^ready$", Millis(60'000));
    o.on_ready = [sig] { ::kill(::getpid(), sig); };
    PayloadResult r = RunPayload(o);
    EXPECT_TRUE(r.ready);
    EXPECT_EQ(r.exit_code, 42);
    EXPECT_FALSE(r.parent_died);
  }
}

TEST_F(PayloadHostTest, SignalDeathIs128PlusN) {
  PayloadResult r = RunPayload(Sh("kill -SEGV $$"));
  EXPECT_EQ(r.exit_code, 139);
  ASSERT_TRUE(r.status);
  EXPECT_TRUE(r.status->signaled);
  r = RunPayload(Sh("kill -KILL $$"));
  EXPECT_EQ(r.exit_code, 137);
}

TEST_F(PayloadHostTest, MissingBinaryIs127WithThePath) {
  PayloadHostOptions o;
  o.argv = {"/nonexistent/train.py"};
  o.ready.mode = ReadyMode::kNotify;
  int ready = 0;
  o.on_ready = [&] { ++ready; };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_EQ(r.message, "cannot execute '/nonexistent/train.py': No such file or directory");
  EXPECT_EQ(ready, 0);

  o.name = "drafter:1";
  o.argv = {"dflash-surely-not-installed"};
  r = RunPayload(o);
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_EQ(r.message.rfind("drafter:1: cannot execute 'dflash-surely-not-installed'", 0), 0u)
      << r.message;
}

TEST_F(PayloadHostTest, PayloadSeesExactlyStdioInEveryMode) {
  // Non-CLOEXEC fds in the host must not leak either. The shell lists its own
  // fds from a child `ls` (not the loader's transient ones of a fresh exec).
  int leaky = ::open("/dev/null", O_RDONLY);
  for (const char* mode : {"none", "notify", "log:x", "file:/nonexistent"}) {
    SCOPED_TRACE(mode);
    Capture out;
    auto o = Sh("ls /proc/$$/fd; true", mode, Millis(60'000));
    o.stdout_fd = out.fd.get();
    PayloadResult r = RunPayload(o);
    EXPECT_EQ(out.Read(), "0\n1\n2\n");
    EXPECT_EQ(r.exit_code, 0);
  }
  ::close(leaky);
}

TEST_F(PayloadHostTest, OrphansAreReapedAndLeftoversStopped) {
  // The payload exits at once, leaving a background child in its group.
  pid_t pid = 0;
  auto o = Sh("sleep 30 & echo $! > '" + (dir_ / "bg").string() + "'; exit 6");
  o.stop_grace = Millis(2000);
  o.on_spawned = [&](pid_t p) { pid = p; };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(r.exit_code, 6);
  std::string bg, e;
  ASSERT_TRUE(ReadFile((dir_ / "bg").string(), &bg, &e)) << e;
  EXPECT_FALSE(Alive(std::stoi(bg)));
  EXPECT_FALSE(Alive(pid));
}

TEST_F(PayloadHostTest, LogModeRelaysOneHundredThousandLinesByteExact) {
  std::mt19937 rng(12345);
  std::string a, b;
  for (int i = 0; i < 100'000; ++i) {
    int len = static_cast<int>(rng() % 200);
    if (i % 997 == 0) len = 5000 + static_cast<int>(rng() % 70000);  // some long lines
    std::string line;
    for (int k = 0; k < len; ++k) line += static_cast<char>(' ' + rng() % 95);
    if (i % 101 == 0) line += "\r";
    (i % 3 == 0 ? b : a) += line + "\n";
  }
  a += "last line without newline";
  b += "stderr tail";
  std::string e;
  ASSERT_TRUE(WriteFileAtomic((dir_ / "a").string(), a, &e)) << e;
  ASSERT_TRUE(WriteFileAtomic((dir_ / "b").string(), b, &e)) << e;
  int ready = 0;
  auto o = Sh("echo compiled; cat '" + (dir_ / "b").string() + "' >&2 & cat '" +
                  (dir_ / "a").string() + "'; wait",
              "log:^compiled$", Millis(120'000));
  o.on_ready = [&] { ++ready; };
  PayloadResult r = RunPayload(o);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(ready, 1);
  std::string got_out = out_.Read(), got_err = err_.Read();
  EXPECT_EQ(got_out.size(), a.size() + 9);
  EXPECT_TRUE(got_out == "compiled\n" + a) << "stdout differs";
  EXPECT_TRUE(got_err == b) << "stderr differs";
}

}  // namespace
}  // namespace dflash
