#include "common/private_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "common/fd.h"
#include "testing/files.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

mode_t ModeOf(const std::string& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

/// A umask that lets everything through: the modes must come from us, not from it.
struct OpenUmask {
  mode_t old = ::umask(0);
  ~OpenUmask() { ::umask(old); }
};

TEST(PrivateFiles, DirsAre0700AndFiles0600WhateverTheUmask) {
  OpenUmask u;
  TempDir t;
  std::string err;
  UniqueFd dir;
  bool made = false;
  ASSERT_TRUE(MakePrivateDir(t / "logs/run-1/attempt_0", FileMode::Private(), RunDirUse(), &dir, &err, &made)) << err;
  EXPECT_TRUE(made);
  for (const char* d : {"logs", "logs/run-1", "logs/run-1/attempt_0"}) EXPECT_EQ(ModeOf(t / d), 0700u) << d;
  UniqueFd f(OpenPrivateFile(t / "logs/run-1/attempt_0/a-0.stdout.log", O_WRONLY | O_APPEND, FileMode::Private(),
                             RunDirUse(), &err));
  ASSERT_TRUE(f) << err;
  EXPECT_EQ(ModeOf(t / "logs/run-1/attempt_0/a-0.stdout.log"), 0600u);
  ASSERT_TRUE(WritePrivateFileAtomic(t / "logs/run-1/summary.json", "{}\n", FileMode::Private(), RunDirUse(), &err))
      << err;
  EXPECT_EQ(ModeOf(t / "logs/run-1/summary.json"), 0600u);
  EXPECT_EQ(test::Slurp(t / "logs/run-1/summary.json"), "{}\n");
}

TEST(PrivateFiles, AGroupGetsReadOnly) {
  OpenUmask u;
  TempDir t;
  std::string err;
  FileMode g = FileMode::Group(::getegid());
  UniqueFd f(OpenPrivateFile(t / "run/x.log", O_WRONLY | O_APPEND, g, RunDirUse(), &err));
  ASSERT_TRUE(f) << err;
  EXPECT_EQ(ModeOf(t / "run"), 0750u);
  EXPECT_EQ(ModeOf(t / "run/x.log"), 0640u);
}

TEST(PrivateFiles, NeverWritesThroughALink) {
  TempDir t;
  fs::create_directory(t / "run");
  ::chmod((t / "run").c_str(), 0700);
  test::WriteText(t / "victim", "untouched");
  fs::create_symlink(t / "victim", t / "run/events.jsonl");
  std::string err;
  UniqueFd f(OpenPrivateFile(t / "run/events.jsonl", O_WRONLY | O_APPEND, FileMode::Private(), RunDirUse(), &err));
  EXPECT_FALSE(f);
  EXPECT_TRUE(Has(err, "symlink")) << err;
  EXPECT_EQ(test::Slurp(t / "victim"), "untouched");
  // A planted FIFO neither blocks us nor is written.
  ASSERT_EQ(::mkfifo((t / "run/fifo").c_str(), 0600), 0);
  EXPECT_FALSE(UniqueFd(OpenPrivateFile(t / "run/fifo", O_WRONLY | O_APPEND, FileMode::Private(), RunDirUse(), &err)));
  // A hard link to a file elsewhere is not ours to append to either.
  ASSERT_EQ(::link((t / "victim").c_str(), (t / "run/hard.log").c_str()), 0);
  EXPECT_FALSE(UniqueFd(OpenPrivateFile(t / "run/hard.log", O_WRONLY | O_TRUNC, FileMode::Private(), RunDirUse(), &err)));
  EXPECT_TRUE(Has(err, "hard link")) << err;
  EXPECT_EQ(test::Slurp(t / "victim"), "untouched");
}

TEST(PrivateFiles, RefusesADirOrFileOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  TempDir t;
  fs::create_directory(t / "shared");
  ::chmod((t / "shared").c_str(), 01777);  // a sticky shared log dir
  fs::create_directory(t / "shared/run-1");
  ASSERT_EQ(::chown((t / "shared/run-1").c_str(), 65534, 65534), 0);
  std::string err;
  EXPECT_FALSE(MakePrivateDir(t / "shared/run-1", FileMode::Private(), RunDirUse(), nullptr, &err));
  EXPECT_TRUE(Has(err, "uid 65534")) << err;
  // A file of theirs in a dir of ours (root writes anywhere: nothing stops the open but us).
  fs::create_directory(t / "shared/run-2");
  ::chmod((t / "shared/run-2").c_str(), 0700);
  test::WriteText(t / "shared/run-2/supervisor.log", "theirs");
  ASSERT_EQ(::chown((t / "shared/run-2/supervisor.log").c_str(), 65534, 65534), 0);
  EXPECT_FALSE(UniqueFd(
      OpenPrivateFile(t / "shared/run-2/supervisor.log", O_WRONLY | O_APPEND, FileMode::Private(), RunDirUse(), &err)));
  EXPECT_TRUE(Has(err, "owned by")) << err;
  // A group/world-writable dir of ours is refused too.
  fs::create_directory(t / "shared/run-3");
  ::chmod((t / "shared/run-3").c_str(), 0777);
  EXPECT_FALSE(MakePrivateDir(t / "shared/run-3", FileMode::Private(), RunDirUse(), nullptr, &err));
  EXPECT_TRUE(Has(err, "chmod go-w")) << err;
}

TEST(PrivateFiles, ASharedParentMayBeStickyButNotOpen) {
  TempDir t;
  fs::create_directory(t / "sticky");
  ::chmod((t / "sticky").c_str(), 01777);
  fs::create_directory(t / "open");
  ::chmod((t / "open").c_str(), 0777);
  PathUse use;
  use.shared_parent = true;
  std::string err;
  EXPECT_TRUE(CheckSecurePath(t / "sticky", use, &err)) << err;
  EXPECT_FALSE(CheckSecurePath(t / "open", use, &err));
  EXPECT_TRUE(Has(err, "chmod +t")) << err;
  EXPECT_TRUE(MakePrivateDir(t / "sticky/run", FileMode::Private(), RunDirUse(), nullptr, &err)) << err;
  EXPECT_FALSE(MakePrivateDir(t / "open/run", FileMode::Private(), RunDirUse(), nullptr, &err));
}

}  // namespace
}  // namespace dflash
