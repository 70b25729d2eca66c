#include "common/untrusted_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "common/fd.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace untrusted_file_test {
namespace {

using test::TempDir;
using Clock = std::chrono::steady_clock;

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

/// ReadUntrustedFile, timed: every case must come back at once, whatever is at the path.
struct Result {
  UntrustedRead r;
  std::string out, why;
  double s;
};
UntrustedFileRules Beneath(const std::string& dir) {
  UntrustedFileRules r;
  r.beneath = dir;
  return r;
}
UntrustedFileRules Limit(size_t limit) {
  UntrustedFileRules r;
  r.limit = limit;
  return r;
}
UntrustedFileRules FollowLink() {
  UntrustedFileRules r;
  r.follow_link = true;
  return r;
}
UntrustedFileRules AnyOwner() {
  UntrustedFileRules r;
  r.any_owner = true;
  return r;
}

Result Read(const std::string& path, UntrustedFileRules rules = {}) {
  Result res;
  auto t0 = Clock::now();
  res.r = ReadUntrustedFile(path, rules, &res.out, &res.why);
  res.s = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

TEST(UntrustedFile, ReadsARegularFileOfOurs) {
  TempDir t;
  Write(t / "m.json", "{\"steps\": 3}");
  Result r = Read(t / "m.json");
  ASSERT_EQ(r.r, UntrustedRead::kOk) << r.why;
  EXPECT_EQ(r.out, "{\"steps\": 3}");
  Result beneath = Read(t / "m.json", Beneath(t.path()));
  ASSERT_EQ(beneath.r, UntrustedRead::kOk) << beneath.why;
  EXPECT_EQ(beneath.out, r.out);
}

TEST(UntrustedFile, AbsentIsNotUnreadable) {
  TempDir t;
  EXPECT_EQ(Read(t / "none.json").r, UntrustedRead::kAbsent);
  EXPECT_EQ(Read(t / "attempt_9/none.json", Beneath(t.path())).r, UntrustedRead::kAbsent);
}

TEST(UntrustedFile, AFifoWithNoWriterIsRefusedAtOnce) {
  TempDir t;
  ASSERT_EQ(::mkfifo((t / "m.json").c_str(), 0600), 0);
  Result r = Read(t / "m.json");
  EXPECT_EQ(r.r, UntrustedRead::kUnreadable);
  EXPECT_EQ(r.why, "a FIFO, not a regular file");
  EXPECT_LT(r.s, 1.0);
}

TEST(UntrustedFile, AFifoWithAWriterThatNeverWritesIsRefusedAtOnce) {
  TempDir t;
  ASSERT_EQ(::mkfifo((t / "m.json").c_str(), 0600), 0);
  // O_RDWR opens a FIFO without waiting for a reader: a writer that holds it open and never writes (a plain
  // read would wait for its first byte, forever).
  UniqueFd writer(::open((t / "m.json").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(writer);
  Result r = Read(t / "m.json");
  EXPECT_EQ(r.r, UntrustedRead::kUnreadable);
  EXPECT_EQ(r.why, "a FIFO, not a regular file");
  EXPECT_LT(r.s, 1.0);
}

TEST(UntrustedFile, ALinkToDevZeroIsNeverFollowed) {
  TempDir t;
  ASSERT_EQ(::symlink("/dev/zero", (t / "m.json").c_str()), 0);
  Result r = Read(t / "m.json");
  EXPECT_EQ(r.r, UntrustedRead::kUnreadable);
  EXPECT_EQ(r.why, "a symlink to /dev/zero: never followed");
  EXPECT_TRUE(r.out.empty());
  EXPECT_LT(r.s, 1.0);
  // Followed on purpose (a key file may be a link): /dev/zero is still not a regular file.
  Result followed = Read(t / "m.json", FollowLink());
  EXPECT_EQ(followed.r, UntrustedRead::kUnreadable);
  EXPECT_EQ(followed.why, "a character device, not a regular file");
  // A link to a file of ours is refused all the same: the payload chose where it points.
  Write(t / "real.json", "{}");
  ASSERT_EQ(::symlink((t / "real.json").c_str(), (t / "to_real.json").c_str()), 0);
  EXPECT_EQ(Read(t / "to_real.json").r, UntrustedRead::kUnreadable);
}

TEST(UntrustedFile, AHugeFileIsNotReadAndALargeOneOnlyToTheCap) {
  TempDir t;
  {
    UniqueFd fd(::open((t / "huge.json").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::ftruncate(fd.get(), off_t{64} << 30), 0);  // 64 GiB, sparse: an allocation would fail
  }
  Result r = Read(t / "huge.json");
  EXPECT_EQ(r.r, UntrustedRead::kUnreadable);
  EXPECT_EQ(r.why, "64.00 GB, more than the 1048576 bytes read of it");
  EXPECT_LT(r.s, 1.0);
  Write(t / "big.json", std::string(2000, 'x'));
  Result capped = Read(t / "big.json", Limit(1999));
  EXPECT_EQ(capped.r, UntrustedRead::kUnreadable);
  EXPECT_TRUE(capped.why == "2.0 KB, more than the 1999 bytes read of it") << capped.why;
  Result fits = Read(t / "big.json", Limit(2000));
  EXPECT_EQ(fits.r, UntrustedRead::kOk) << fits.why;
  EXPECT_EQ(fits.out.size(), 2000u);
}

TEST(UntrustedFile, ADirectoryIsRefused) {
  TempDir t;
  ASSERT_EQ(::mkdir((t / "m.json").c_str(), 0700), 0);
  Result r = Read(t / "m.json");
  EXPECT_EQ(r.r, UntrustedRead::kUnreadable);
  EXPECT_EQ(r.why, "a directory, not a regular file");
}

TEST(UntrustedFile, ALinkedAttemptDirIsNeverFollowedBeneathTheRunDir) {
  TempDir run, elsewhere;
  Write(elsewhere / "m.json", "{\"steps\": 1}");
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), (run / "attempt_0").c_str()), 0);
  Result r = Read(run / "attempt_0/m.json", Beneath(run.path()));
  EXPECT_EQ(r.r, UntrustedRead::kUnreadable);
  EXPECT_EQ(r.why, "a symlink on its way: never followed");
  EXPECT_EQ(Read(elsewhere / "m.json", Beneath(run.path())).why, "not under " + run.path());
}

TEST(UntrustedFile, AFileOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  TempDir t;
  Write(t / "m.json", "{}");
  ASSERT_EQ(::chown((t / "m.json").c_str(), 65534, 65534), 0);
  Result r = Read(t / "m.json");
  EXPECT_EQ(r.r, UntrustedRead::kUnreadable);
  EXPECT_TRUE(Has(r.why, "(uid 65534), not by this run's user")) << r.why;
  EXPECT_EQ(Read(t / "m.json", AnyOwner()).r, UntrustedRead::kOk);
}

TEST(UntrustedFile, UnreadableSaysWhy) {
  EXPECT_EQ(Unreadable("a FIFO, not a regular file"), "unreadable (a FIFO, not a regular file)");
}

}  // namespace
}  // namespace untrusted_file_test
}  // namespace dflash
