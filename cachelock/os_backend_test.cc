// The real backend against the kernel: the named mutex, OFD locks between
// threads and against Python's lockf, and what a child of the holder inherits.
#include "cachelock/os_backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "cachelock/gate.h"
#include "cachelock/status.h"
#include "cachelock/test_util.h"
#include "common/fd.h"
#include "testing/process.h"
#include "testing/wait.h"


namespace dflash {
namespace {

using std::chrono::milliseconds;
using testing::OpenGate;
using test::WaitForExit;
using testing::TempGateDir;

// Where each fd of `pid` points.
std::vector<std::string> FdTargets(pid_t pid) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    out.push_back(std::filesystem::read_symlink(e.path(), ec2).string());
  }
  return out;
}

// How many fds of `pid` point at a file of this gate.
int GateFds(pid_t pid, const GateLayout& l) {
  int n = 0;
  for (const std::string& t : FdTargets(pid))
    if (t.find(l.meta_dir) == 0 || t == l.local_owner_path || t == l.local_sem_path) ++n;
  return n;
}

TEST(OsBackend, CreatesPrivateFilesAndAPrivateMutex) {
  TempGateDir tmp;
  GateLayout l;
  std::string err;
  auto b = OpenOsGateBackend(tmp.path(), &l, &err);
  ASSERT_TRUE(b) << err;
  for (const std::string& p : {l.lock_path, l.holder_path, l.local_owner_path, l.local_sem_path}) {
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << p;
    EXPECT_EQ(st.st_uid, ::geteuid()) << p;
  }
}

TEST(OsBackend, UnlockNeverRaisesTheMutexAboveOne) {
  TempGateDir tmp;
  std::string err;
  auto b = OpenOsGateBackend(tmp.path(), nullptr, &err);
  ASSERT_TRUE(b) << err;
  ASSERT_EQ(b->LockLocal(milliseconds(0), &err), LockAttempt::kAcquired);
  b->UnlockLocal();
  b->UnlockLocal();  // a second unlock, as by a holder that was taken over
  EXPECT_EQ(b->LockLocal(milliseconds(0), &err), LockAttempt::kAcquired);
  EXPECT_EQ(b->LockLocal(milliseconds(20), &err), LockAttempt::kBusy);
  b->UnlockLocal();
}

TEST(OsBackend, OfdLockExcludesASecondOpenInTheSameProcess) {
  TempGateDir tmp;
  std::string err;
  auto a = OpenOsGateBackend(tmp.path(), nullptr, &err);
  auto b = OpenOsGateBackend(tmp.path(), nullptr, &err);
  ASSERT_TRUE(a && b) << err;
  ASSERT_EQ(a->TryLockFile(&err), LockAttempt::kAcquired);
  EXPECT_EQ(b->TryLockFile(&err), LockAttempt::kBusy);  // a classic fcntl lock would say kAcquired
  EXPECT_TRUE(b->ProbeFile().held);
  a->UnlockFile();
  EXPECT_EQ(b->TryLockFile(&err), LockAttempt::kAcquired);
  b->UnlockFile();
}

TEST(OsBackend, TwoThreadsWithTheirOwnGatesNeverHoldAtOnce) {
  TempGateDir tmp;
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0}, leads{0};
  auto worker = [&](const std::string& role) {
    auto g = OpenGate(tmp.path(), role);
    for (int i = 0; i < 200; ++i) {
      AcquireResult got;
      std::string err;
      ASSERT_EQ(g->Acquire("k", &got, &err), GateError::kOk) << err;
      ASSERT_EQ(got.decision, GateDecision::kLead);
      if (inside.fetch_add(1) != 0) ++overlaps;
      ++leads;
      std::this_thread::yield();
      inside.fetch_sub(1);
      g->Release();
    }
  };
  std::thread t1(worker, "thread-1"), t2(worker, "thread-2");
  t1.join();
  t2.join();
  EXPECT_EQ(leads.load(), 400);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(OsBackend, ASecondThreadWaitsForTheFirstAndNamesIt) {
  TempGateDir tmp;
  auto a = OpenGate(tmp.path(), "thread-a");
  AcquireResult got;
  std::string err;
  ASSERT_EQ(a->Acquire("k", &got, &err), GateError::kOk) << err;
  std::thread t([&] {
    auto b = OpenGate(tmp.path(), "thread-b", milliseconds(300));
    AcquireResult got_b;
    std::string err_b;
    EXPECT_EQ(b->Acquire("k", &got_b, &err_b), GateError::kTimeout);
    EXPECT_NE(err_b.find("held by thread-a (pid " + std::to_string(::getpid()) + ")"), std::string::npos)
        << err_b;
  });
  t.join();
  a->Release();
}

TEST(OsBackend, OneGateObjectSharedByTwoThreadsRefusesTheSecond) {
  TempGateDir tmp;
  auto g = OpenGate(tmp.path(), "shared");
  AcquireResult got;
  std::string err;
  ASSERT_EQ(g->Acquire("k", &got, &err), GateError::kOk) << err;
  std::thread t([&] {
    AcquireResult got2;
    std::string err2;
    EXPECT_EQ(g->Acquire("k", &got2, &err2), GateError::kMisuse);
    EXPECT_NE(err2.find("one object per thread"), std::string::npos) << err2;
  });
  t.join();
  EXPECT_TRUE(g->holding());
  g->Release();
}

TEST(OsBackend, InteroperatesWithPythonLockf) {
  if (::system("python3 -c 'import fcntl' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  TempGateDir tmp;
  auto g = OpenGate(tmp.path(), "cxx", milliseconds(300));
  GateLayout l = tmp.Layout();
  // Python takes a classic whole-file lock and holds it until we remove `go`.
  std::string go = tmp.path() + "/go", locked = tmp.path() + "/locked";
  std::string script =
      "import fcntl, os, time\n"
      "f = open('" + l.lock_path + "', 'r+')\n"
      "fcntl.lockf(f, fcntl.LOCK_EX)\n"
      "open('" + locked + "', 'w').close()\n"
      "while os.path.exists('" + go + "'): time.sleep(0.01)\n";
  { UniqueFd(::open(go.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)); }
  pid_t py = test::StartHelper({"python3", "-c", script});
  ASSERT_TRUE(test::WaitUntil([&] { return std::filesystem::exists(locked); }))
      << "python did not take the lock";
  AcquireResult got;
  std::string err;
  EXPECT_EQ(g->Acquire("k", &got, &err), GateError::kTimeout);
  EXPECT_NE(err.find("held by pid " + std::to_string(py)), std::string::npos) << err;
  ::unlink(go.c_str());
  EXPECT_TRUE(WIFEXITED(WaitForExit(py)));
  ASSERT_EQ(g->Acquire("k", &got, &err), GateError::kOk) << err;
  // And the other way round: while we hold it, lockf cannot take it.
  std::string probe =
      "import fcntl, sys\n"
      "f = open('" + l.lock_path + "', 'r+')\n"
      "try:\n"
      "    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
      "except OSError:\n"
      "    sys.exit(3)\n";
  int status = WaitForExit(test::StartHelper({"python3", "-c", probe}));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  g->Release();
  status = WaitForExit(test::StartHelper({"python3", "-c", probe}));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(OsBackend, AChildStartedByTheHolderHasNoGateFd) {
  TempGateDir tmp;
  auto g = OpenGate(tmp.path(), "holder");
  AcquireResult got;
  std::string err;
  ASSERT_EQ(g->Acquire("k", &got, &err), GateError::kOk) << err;
  GateLayout l = tmp.Layout();
  ASSERT_GE(GateFds(::getpid(), l), 3) << "the check must see the holder's own gate fds";
  pid_t child = test::StartHelper({"sleep", "30"});
  // /proc/<child>/fd is the parent's table until exec; wait for the exec.
  EXPECT_TRUE(test::WaitUntil([&] {
    std::error_code ec;
    return std::filesystem::read_symlink("/proc/" + std::to_string(child) + "/exe", ec).filename() == "sleep";
  })) << "the child never exec'ed sleep";
  EXPECT_EQ(GateFds(child, l), 0);
  ::kill(child, SIGKILL);
  WaitForExit(child);
  g->Release();
}

TEST(OsBackend, AForkedChildNeitherKeepsNorReleasesTheParentsGate) {
  TempGateDir tmp;
  GateLayout l = tmp.Layout();
  auto g = OpenGate(tmp.path(), "parent");
  AcquireResult got;
  std::string err;
  ASSERT_EQ(g->Acquire("k", &got, &err), GateError::kOk) << err;
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  pid_t child = ::fork();
  if (child == 0) {
    // The child: its copies of the gate fds point at /dev/null; its gate
    // object refuses to act and its Release must not free the parent's gate.
    char verdict = GateFds(::getpid(), l) == 0 ? 'n' : 'y';
    AcquireResult c;
    std::string e;
    if (g->Acquire("k2", &c, &e) != GateError::kMisuse) verdict = 'a';
    g->Release();
    (void)!::write(report[1], &verdict, 1);
    ::pause();
    ::_exit(0);
  }
  ::close(report[1]);
  char verdict = '?';
  ASSERT_EQ(::read(report[0], &verdict, 1), 1);
  ::close(report[0]);
  EXPECT_EQ(verdict, 'n') << "y: the child kept gate fds; a: the child's gate acquired";
  // The child's Release changed nothing: the parent still holds both levels.
  GateStatusReport s;
  ASSERT_TRUE(ReadGateStatus(tmp.path(), &s, &err)) << err;
  EXPECT_TRUE(s.held);
  EXPECT_EQ(s.local_value, 0);
  // The parent lets go while the child lives: another gate can take it at once.
  g->Release();
  auto other = OpenGate(tmp.path(), "other", std::chrono::seconds(5));
  EXPECT_EQ(other->Acquire("k", &got, &err), GateError::kOk) << err;
  other->Release();
  ::kill(child, SIGKILL);
  WaitForExit(child);
}

}  // namespace
}  // namespace dflash
