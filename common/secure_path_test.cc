#include "common/secure_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/fd.h"
#include "testing/files.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

void Touch(const std::string& path, const std::string& text = "x") { test::WriteText(path, text); }

bool All(const std::string&) { return true; }

bool Says(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(SecurePath, OwnPrivateDirPassesAndAMissingTailIsFine) {
  TempDir t;
  std::string err;
  EXPECT_TRUE(CheckSecurePath(t.path(), &err)) << err;
  EXPECT_TRUE(CheckSecurePath(t / "not/yet/there", &err)) << err;
}

TEST(SecurePath, FollowsALinkOfOurOwn) {
  TempDir t;
  fs::create_directory(t / "real");
  ::chmod((t / "real").c_str(), 0700);
  fs::create_directory_symlink(t / "real", t / "link");
  std::string err;
  EXPECT_TRUE(CheckSecurePath(t / "link", &err)) << err;
}

TEST(SecurePath, RefusesALinkOwnedByAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a link away";
  TempDir t;
  fs::create_directory(t / "victim");
  ::chmod((t / "victim").c_str(), 0700);
  fs::create_directory_symlink(t / "victim", t / "cache");
  ASSERT_EQ(::lchown((t / "cache").c_str(), 65534, 65534), 0);
  std::string err;
  EXPECT_FALSE(CheckSecurePath(t / "cache", &err));
  EXPECT_TRUE(Says(err, "symlink " + (t / "cache"))) << err;
  EXPECT_TRUE(Says(err, "uid 65534")) << err;
  EXPECT_TRUE(Says(err, "rm " + (t / "cache"))) << err;
  // Also when the link is an ancestor.
  EXPECT_FALSE(CheckSecurePath(t / "cache/sub", &err));
}

TEST(SecurePath, RefusesAWritableNonStickyParentButNotASticky) {
  TempDir t;
  fs::create_directory(t / "shared");
  fs::create_directory(t / "shared/cache");
  ::chmod((t / "shared/cache").c_str(), 0700);
  ASSERT_EQ(::chmod((t / "shared").c_str(), 0777), 0);
  std::string err;
  EXPECT_FALSE(CheckSecurePath(t / "shared/cache", &err));
  EXPECT_TRUE(Says(err, (t / "shared") + " is writable by group and others (mode 0777, not sticky)")) << err;
  EXPECT_TRUE(Says(err, "fix: chmod go-w " + (t / "shared"))) << err;
  ASSERT_EQ(::chmod((t / "shared").c_str(), 01777), 0);
  EXPECT_TRUE(CheckSecurePath(t / "shared/cache", &err)) << err;
}

TEST(SecurePath, RefusesAParentOwnedByAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a directory away";
  TempDir t;
  fs::create_directories(t / "home/cache");
  ::chmod((t / "home/cache").c_str(), 0700);
  ASSERT_EQ(::chown((t / "home").c_str(), 65534, 65534), 0);
  std::string err;
  EXPECT_FALSE(CheckSecurePath(t / "home/cache", &err));
  EXPECT_TRUE(Says(err, (t / "home") + " is owned by")) << err;
}

TEST(SecurePath, RefusesAWritableCacheDirItself) {
  TempDir t;
  ASSERT_EQ(::chmod(t.path().c_str(), 0770), 0);
  std::string err;
  EXPECT_FALSE(CheckSecurePath(t.path(), &err));
  EXPECT_TRUE(Says(err, "fix: chmod go-w " + t.path())) << err;
}

TEST(PrivateTree, RefusesAWorldWritableSubdirWithTheChmodThatFixesIt) {
  TempDir t;
  fs::create_directories(t / "fxgraph/ab");
  Touch(t / "fxgraph/ab/entry");
  std::string err;
  EXPECT_TRUE(CheckPrivateTree(t.path(), All, &err)) << err;
  ASSERT_EQ(::chmod((t / "fxgraph").c_str(), 0777), 0);
  EXPECT_FALSE(CheckPrivateTree(t.path(), All, &err));
  EXPECT_TRUE(Says(err, (t / "fxgraph") + " is writable by group and others (mode 0777)")) << err;
  EXPECT_TRUE(Says(err, "fix: chmod -R go-w " + t.path())) << err;
}

TEST(PrivateTree, RefusesASymlinkAndAFifoInside) {
  TempDir t;
  fs::create_directories(t / "fxgraph");
  fs::create_symlink("/etc/passwd", t / "fxgraph/planted");
  std::string err;
  EXPECT_FALSE(CheckPrivateTree(t.path(), All, &err));
  EXPECT_TRUE(Says(err, "is a symlink (to /etc/passwd)")) << err;
  EXPECT_TRUE(Says(err, "fix: rm " + (t / "fxgraph/planted"))) << err;
  fs::remove(t / "fxgraph/planted");
  ASSERT_EQ(::mkfifo((t / "fxgraph/pipe").c_str(), 0600), 0);
  EXPECT_FALSE(CheckPrivateTree(t.path(), All, &err));
  EXPECT_TRUE(Says(err, "neither a file nor a directory")) << err;
  // What the filter leaves out is neither checked nor descended into.
  EXPECT_TRUE(CheckPrivateTree(t.path(), [](const std::string& rel) { return rel != "fxgraph"; }, &err)) << err;
}

TEST(PrivateTree, RefusesAFileOwnedByAnotherUserAndCountsTheRest) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  TempDir t;
  fs::create_directories(t / "aotautograd");
  for (const char* f : {"a", "b", "c"}) {
    Touch(t / ("aotautograd/" + std::string(f)));
    ASSERT_EQ(::chown((t / ("aotautograd/" + std::string(f))).c_str(), 65534, 65534), 0);
  }
  std::string err;
  EXPECT_FALSE(CheckPrivateTree(t.path(), All, &err));
  EXPECT_TRUE(Says(err, "uid 65534")) << err;
  EXPECT_TRUE(Says(err, "and 2 more")) << err;
  EXPECT_TRUE(Says(err, "fix: chown -R 0 ")) << err;
}

TEST(OpenBeneath, NeverFollowsALinkOnTheWay) {
  TempDir t;
  fs::create_directories(t / "outside");
  Touch(t / "outside/secret", "secret");
  fs::create_directories(t / "cache");
  fs::create_directory_symlink(t / "outside", t / "cache/dir");
  fs::create_symlink(t / "outside/secret", t / "cache/file");
  UniqueFd root(::open((t / "cache").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root);
  EXPECT_LT(OpenBeneath(root.get(), "dir/secret", O_RDONLY), 0);
  EXPECT_LT(OpenBeneath(root.get(), "file", O_RDONLY), 0);
  EXPECT_EQ(errno, ELOOP);
  EXPECT_LT(OpenBeneath(root.get(), "../outside/secret", O_RDONLY), 0);
  EXPECT_EQ(errno, EINVAL);
  std::string err;
  std::vector<std::string> made;
  EXPECT_FALSE(MakeDirsBeneath(root.get(), "dir/sub", &made, &err));
  EXPECT_FALSE(fs::exists(t / "outside/sub"));
  EXPECT_TRUE(MakeDirsBeneath(root.get(), "a/b", &made, &err)) << err;
  EXPECT_EQ(made, (std::vector<std::string>{"a", "a/b"}));
}

TEST(RemoveTree, RemovesLinksNotWhatTheyPointAtAndCountsFiles) {
  TempDir t;
  fs::create_directories(t / "outside");
  Touch(t / "outside/keep");
  fs::create_directories(t / "trash/d");
  Touch(t / "trash/d/one");
  Touch(t / "trash/two");
  fs::create_directory_symlink(t / "outside", t / "trash/d/link");
  UniqueFd root(::open(t.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  uint64_t files = 0;
  std::string err;
  ASSERT_TRUE(RemoveTreeAt(root.get(), "trash", &files, &err)) << err;
  EXPECT_EQ(files, 3u);  // one, two, and the link itself
  EXPECT_FALSE(fs::exists(t / "trash"));
  EXPECT_TRUE(fs::exists(t / "outside/keep"));
}

}  // namespace
}  // namespace dflash
