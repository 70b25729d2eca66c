// The port locks and the run lock against the real kernel: sockets, flock, symlinks.
#include "launcher/plan/port_reservation.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

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

}  // namespace
}  // namespace dflash
