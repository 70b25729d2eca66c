#include "cachelock/gate_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cachelock/test_util.h"

namespace dflash {
namespace {

using testing::TempGateDir;

mode_t Mode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(GateDir, CreatesMissingDirsPrivate) {
  TempGateDir tmp;
  std::string dir = tmp.path() + "/a/b/cache";
  GateLayout l;
  std::string err;
  ASSERT_TRUE(PrepareGateDir(dir, &l, &err)) << err;
  EXPECT_EQ(Mode(tmp.path() + "/a"), 0700u);
  EXPECT_EQ(Mode(dir), 0700u);
  EXPECT_EQ(Mode(l.meta_dir), 0700u);
  EXPECT_EQ(Mode(l.ready_dir), 0700u);
  EXPECT_EQ(l.lock_path, l.dir + "/.dflash/gate.lock");
  EXPECT_EQ(l.ReadyPath("drafter"), l.dir + "/.dflash/ready/drafter.json");
}

TEST(GateDir, OneMutexNamePerCanonicalDirAndUser) {
  TempGateDir tmp;
  std::filesystem::create_directory(tmp.path() + "/c");
  std::filesystem::create_directory_symlink(tmp.path() + "/c", tmp.path() + "/link");
  GateLayout a, b, c;
  std::string err;
  ASSERT_TRUE(LocateGate(tmp.path() + "/c", &a, &err));
  ASSERT_TRUE(LocateGate(tmp.path() + "/link/../c/.", &b, &err));
  ASSERT_TRUE(LocateGate(tmp.path(), &c, &err));
  EXPECT_EQ(a.local_name, b.local_name);
  EXPECT_NE(a.local_name, c.local_name);
  EXPECT_EQ(a.local_name.rfind("dflash-" + std::to_string(::geteuid()) + "-", 0), 0u) << a.local_name;
  EXPECT_EQ(a.local_sem_path, "/dev/shm/sem." + a.local_name);
}

TEST(GateDir, RefusesAWorldWritableDirAndSaysWhichChmodFixesIt) {
  TempGateDir tmp;
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0777), 0);
  GateLayout l;
  std::string err;
  EXPECT_FALSE(PrepareGateDir(tmp.path(), &l, &err));
  EXPECT_NE(err.find("writable by group and others (mode 0777)"), std::string::npos) << err;
  EXPECT_NE(err.find("fix: chmod go-w " + tmp.path()), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/.dflash"));  // refused before creating anything
}

TEST(GateDir, RefusesAGroupWritableDotDflash) {
  TempGateDir tmp;
  GateLayout l;
  std::string err;
  ASSERT_TRUE(PrepareGateDir(tmp.path(), &l, &err)) << err;
  ASSERT_EQ(::chmod(l.meta_dir.c_str(), 0770), 0);
  EXPECT_FALSE(PrepareGateDir(tmp.path(), &l, &err));
  EXPECT_NE(err.find(l.meta_dir), std::string::npos) << err;
  EXPECT_NE(err.find("chmod go-w " + l.meta_dir), std::string::npos) << err;
}

TEST(GateDir, RefusesADotDflashSymlink) {
  TempGateDir tmp;
  std::filesystem::create_directory(tmp.path() + "/elsewhere");
  std::filesystem::create_directory_symlink(tmp.path() + "/elsewhere", tmp.path() + "/.dflash");
  GateLayout l;
  std::string err;
  EXPECT_FALSE(PrepareGateDir(tmp.path(), &l, &err));
  EXPECT_NE(err.find("not a directory"), std::string::npos) << err;
}

TEST(GateDir, RefusesADirOwnedBySomeoneElseAndSaysWhichChownFixesIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  TempGateDir tmp;
  ASSERT_EQ(::chown(tmp.path().c_str(), 65534, 65534), 0);
  GateLayout l;
  std::string err;
  EXPECT_FALSE(PrepareGateDir(tmp.path(), &l, &err));
  EXPECT_NE(err.find("uid 65534"), std::string::npos) << err;
  EXPECT_NE(err.find("fix: chown 0 " + tmp.path()), std::string::npos) << err;
}

}  // namespace
}  // namespace dflash

namespace dflash {
namespace {

using testing::TempGateDir;

TEST(GateDir, RefusesAWorldWritableSubdirOfTheCacheWithTheChmodThatFixesIt) {
  TempGateDir tmp;
  std::filesystem::create_directories(tmp.path() + "/fxgraph/ab");
  ASSERT_EQ(::chmod((tmp.path() + "/fxgraph/ab").c_str(), 0777), 0);
  GateLayout l;
  std::string err;
  EXPECT_FALSE(PrepareGateDir(tmp.path(), &l, &err));
  EXPECT_NE(err.find(tmp.path() + "/fxgraph/ab is writable by group and others (mode 0777)"), std::string::npos)
      << err;
  EXPECT_NE(err.find("fix: chmod -R go-w " + tmp.path()), std::string::npos) << err;
}

TEST(GateDir, RefusesASymlinkedReadyMarker) {
  TempGateDir tmp;
  GateLayout l;
  std::string err;
  ASSERT_TRUE(PrepareGateDir(tmp.path(), &l, &err)) << err;
  std::string other = tmp.path() + "/elsewhere.json";
  { std::ofstream(other) << "{}"; }
  std::filesystem::create_symlink(other, l.ReadyPath("drafter"));
  EXPECT_FALSE(PrepareGateDir(tmp.path(), &l, &err));
  EXPECT_NE(err.find("is a symlink"), std::string::npos) << err;
  EXPECT_NE(err.find("rm " + l.ReadyPath("drafter")), std::string::npos) << err;
  std::string text;
  EXPECT_FALSE(ReadTrustedMarker(l.ReadyPath("drafter"), &text, &err));
  EXPECT_NE(err.find("symlink: not trusted"), std::string::npos) << err;
}

TEST(GateDir, DoesNotTrustAReadyMarkerOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  TempGateDir tmp;
  GateLayout l;
  std::string err;
  ASSERT_TRUE(PrepareGateDir(tmp.path(), &l, &err)) << err;
  { std::ofstream(l.ReadyPath("drafter")) << "{}"; }
  std::string text;
  EXPECT_TRUE(ReadTrustedMarker(l.ReadyPath("drafter"), &text, &err)) << err;
  ASSERT_EQ(::chown(l.ReadyPath("drafter").c_str(), 65534, 65534), 0);
  EXPECT_FALSE(ReadTrustedMarker(l.ReadyPath("drafter"), &text, &err));
  EXPECT_NE(err.find("uid 65534"), std::string::npos) << err;
  EXPECT_FALSE(PrepareGateDir(tmp.path(), &l, &err));
  EXPECT_NE(err.find("uid 65534"), std::string::npos) << err;
}

TEST(GateDir, RefusesACacheDirThatIsAnotherUsersSymlink) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a link away";
  TempGateDir tmp;
  std::filesystem::create_directory(tmp.path() + "/target");
  ::chmod((tmp.path() + "/target").c_str(), 0700);
  std::filesystem::create_directory_symlink(tmp.path() + "/target", tmp.path() + "/cache");
  ASSERT_EQ(::lchown((tmp.path() + "/cache").c_str(), 65534, 65534), 0);
  GateLayout l;
  std::string err;
  EXPECT_FALSE(PrepareGateDir(tmp.path() + "/cache", &l, &err));
  EXPECT_NE(err.find("symlink " + tmp.path() + "/cache owned by nobody (uid 65534)"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/target/.dflash"));  // nothing created through it
}

}  // namespace
}  // namespace dflash
