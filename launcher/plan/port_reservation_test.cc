// The port locks and the run lock against the real kernel: sockets, flock, symlinks.
#include "launcher/plan/port_reservation.h"

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "launcher/plan/holder_lock.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

/// A listening socket on an ephemeral port of 127.0.0.1.
int Listen(int* port) {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::listen(s, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return s;
}

TEST(PortReservation, ABusyPortIsRefusedWithTheReason) {
  test::TempDir tmp("port-reservation-test");
  std::string dir = tmp.path(), err;
  int port = 0;
  UniqueFd listener(Listen(&port));
  PortReservations held;
  EXPECT_EQ(ReservePort(dir, port, "test", &held, &err), ReserveResult::kInUse);
  EXPECT_NE(err.find("already uses it"), std::string::npos) << err;
  EXPECT_TRUE(held.locks.empty());
  listener.reset();
  EXPECT_EQ(ReservePort(dir, port, "test", &held, &err), ReserveResult::kReserved) << err;
}

TEST(PortReservation, AReservedPortIsRefusedNamingItsHolderUntilReleased) {
  test::TempDir tmp("port-reservation-test");
  std::string dir = tmp.path(), err;
  PortReservations first, second;
  int port = 0;
  ASSERT_EQ(ReserveFreePort(dir, "holder-record-1", &port, &first, &err), ReserveResult::kReserved) << err;
  EXPECT_GE(port, 20000);
  EXPECT_LT(port, 32767);
  // flock belongs to the open file description: a second open, even in this process, is refused.
  EXPECT_EQ(ReservePort(dir, port, "second", &second, &err), ReserveResult::kInUse);
  EXPECT_NE(err.find("reserved by holder-record-1"), std::string::npos) << err;
  // "auto" never hands out a reserved port.
  for (int i = 0; i < 50; ++i) {
    int other = 0;
    ASSERT_EQ(ReserveFreePort(dir, "x", &other, &second, &err), ReserveResult::kReserved) << err;
    EXPECT_NE(other, port);
  }
  first.locks.clear();  // the run ended
  PortReservations third;
  EXPECT_EQ(ReservePort(dir, port, "third", &third, &err), ReserveResult::kReserved) << err;
}

// Two roles' named ports; "s" is warmup-gated, so its warm-up gets ports of its own.
Plan NamedPortsPlan(const std::string& run_id) {
  const char* text = R"(
[run]
name = "p"
log_dir = "/tmp/dflash-port-test-logs"
cache_dir = "/tmp/dflash-port-test-cache"
[[role]]
name = "s"
cpu = 3
command = ["true"]
ports = ["http", "grpc"]
gate = { mode = "warmup" }
[[role]]
name = "c"
cpu = 1
command = ["true"]
)";
  RunConfig c;
  std::vector<ConfigError> errors;
  EXPECT_TRUE(LoadConfigFromString(text, "/tmp/ports.toml", &c, &errors)) << FormatErrors(errors);
  PlanOptions po;
  po.run_id = run_id;
  po.torch_version = [](const RoleSpec&) { return std::string("2.13.0+cpu"); };
  return BuildPlan(c, po);
}

std::vector<int> AllNamedPorts(const Plan& plan) {
  std::vector<int> all;
  for (const auto* list : {&plan.warmups, &plan.processes})
    for (const ProcessPlan& p : *list) all.insert(all.end(), p.ports.begin(), p.ports.end());
  return all;
}

TEST(NamedPorts, EachProcessAndWarmUpGetsItsOwnHeldPortsAndASecondRunOthers) {
  test::TempDir tmp("port-reservation-test");
  std::string dir = tmp.path(), err;
  Plan a = NamedPortsPlan("run-a"), b = NamedPortsPlan("run-b");
  ASSERT_EQ(a.warmups.size(), 1u);
  PortReservations held_a, held_b;
  ASSERT_EQ(ReserveNamedPorts(&a, dir, &held_a, &err), ReserveResult::kReserved) << err;
  std::vector<int> ports = AllNamedPorts(a);
  ASSERT_EQ(ports.size(), 8u);  // 3 processes and the warm-up, 2 names each; the role "c" names none
  EXPECT_EQ(held_a.locks.size(), 8u);
  EXPECT_TRUE(a.processes.back().ports.empty());
  std::set<int> distinct(ports.begin(), ports.end());
  EXPECT_EQ(distinct.size(), ports.size());
  for (int p : ports) {
    EXPECT_GE(p, 20000);
    EXPECT_LT(p, 32767);
    PortReservations probe;
    EXPECT_EQ(ReservePort(dir, p, "other", &probe, &err), ReserveResult::kInUse) << p;
    EXPECT_NE(err.find("run run-a"), std::string::npos) << err;  // the holder is named
  }
  // The list a peer reads: this node's processes in role-rank order, the warm-up's not among them.
  EXPECT_EQ(a.RolePortsList(0, 1), std::to_string(a.processes[0].ports[1]) + "," +
                                       std::to_string(a.processes[1].ports[1]) + "," +
                                       std::to_string(a.processes[2].ports[1]));
  // A second call (nothing to do) keeps what was given: the ports are the run's, not a spawn's.
  std::vector<int> before = AllNamedPorts(a);
  ASSERT_EQ(ReserveNamedPorts(&a, dir, &held_a, &err), ReserveResult::kReserved) << err;
  EXPECT_EQ(AllNamedPorts(a), before);
  // A concurrent run on the host never gets one of them.
  ASSERT_EQ(ReserveNamedPorts(&b, dir, &held_b, &err), ReserveResult::kReserved) << err;
  for (int p : AllNamedPorts(b)) EXPECT_EQ(distinct.count(p), 0u) << p;
  // Run a ends: its ports are free for the next run.
  held_a.locks.clear();
  PortReservations next;
  for (int p : ports) EXPECT_EQ(ReservePort(dir, p, "next", &next, &err), ReserveResult::kReserved) << err;
}

TEST(NamedPorts, OutOfFileDescriptorsIsAClearFailureNamingThePort) {
  test::TempDir tmp("port-reservation-test");
  std::string dir = tmp.path();
  Plan plan = NamedPortsPlan("run-fd");
  std::fflush(nullptr);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // No fd left to open: the first lock file cannot be made.
    int lowest = ::dup(0);
    ::close(lowest);
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = static_cast<rlim_t>(lowest);
    ::setrlimit(RLIMIT_NOFILE, &rl);
    PortReservations held;
    std::string err;
    ReserveResult r = ReserveNamedPorts(&plan, dir, &held, &err);
    std::fprintf(stderr, "err: %s\n", err.c_str());
    bool ok = r == ReserveResult::kFailed && err.find("port \"http\" of s:warmup") != std::string::npos &&
              err.find("Too many open files") != std::string::npos && held.locks.empty();
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "see err: above";
}

TEST(HolderLock, RefusesASymlinkAndKeepsTheHoldersRecord) {
  test::TempDir tmp("port-reservation-test");
  std::string dir = tmp.path(), holder;
  std::filesystem::create_symlink("/etc/passwd", dir + "/run.lock");
  UniqueFd fd;
  EXPECT_EQ(TryHolderLock(dir + "/run.lock", "me", &fd, &holder), HolderLockResult::kFailed);
  EXPECT_NE(holder.find("run.lock"), std::string::npos) << holder;
  std::filesystem::remove(dir + "/run.lock");
  ASSERT_EQ(TryHolderLock(dir + "/run.lock", HolderRecord("run r"), &fd, &holder), HolderLockResult::kAcquired);
  UniqueFd again;
  EXPECT_EQ(TryHolderLock(dir + "/run.lock", "intruder", &again, &holder), HolderLockResult::kHeld);
  EXPECT_NE(holder.find("pid " + std::to_string(::getpid())), std::string::npos) << holder;
  EXPECT_NE(holder.find("run r"), std::string::npos) << holder;
  // The refused one did not overwrite the record.
  fd.reset();
  EXPECT_EQ(TryHolderLock(dir + "/run.lock", "next", &again, &holder), HolderLockResult::kAcquired);
}

TEST(PortReservation, ABadLockFileIsSkippedAndAnotherPortDrawn) {
  // A symlink or a directory at <port>.lock (issue #46 item 5): that port is skipped, never the whole run refused.
  test::TempDir tmp("port-reservation-test");
  std::string dir = tmp.path(), err;
  for (int p = 20000; p < 32767; p += 2) {
    if (p % 4 == 0) std::filesystem::create_symlink("/etc/passwd", dir + "/" + std::to_string(p) + ".lock");
    else std::filesystem::create_directory(dir + "/" + std::to_string(p) + ".lock");
  }
  PortReservations held;
  for (int i = 0; i < 20; ++i) {
    int port = 0;
    ASSERT_EQ(ReserveFreePort(dir, "r", &port, &held, &err), ReserveResult::kReserved) << err;
    EXPECT_EQ(port % 2, 1) << port;
  }
  // Asked for by number, a bad lock file says what is wrong with it.
  EXPECT_EQ(ReservePort(dir, 20000, "r", &held, &err), ReserveResult::kBadLock);
  EXPECT_NE(err.find("20000.lock"), std::string::npos) << err;
}

TEST(PortReservation, TheLockDirIsThisUsersOwnAndPrivate) {
  std::string dir, warning, err;
  ASSERT_TRUE(PortLockDir(&dir, &warning, &err)) << err;
  struct stat st {};
  ASSERT_EQ(::lstat(dir.c_str(), &st), 0) << dir;
  EXPECT_TRUE(S_ISDIR(st.st_mode)) << dir;
  EXPECT_EQ(st.st_uid, ::geteuid()) << dir;
  EXPECT_EQ(st.st_mode & 077, 0u) << dir;
  EXPECT_NE(dir, "/tmp/dflash-ports");
}

}  // namespace
}  // namespace dflash
