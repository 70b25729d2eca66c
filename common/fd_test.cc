#include "common/fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

namespace dflash {
namespace {

TEST(Fd, WriteFileAtomicReplacesWholeFileAndLeavesNoTemp) {
  auto dir = std::filesystem::temp_directory_path() / ("fdtest." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "f.json").string();
  std::string err, got;
  ASSERT_TRUE(WriteFileAtomic(path, "first", &err, 0600)) << err;
  ASSERT_TRUE(WriteFileAtomic(path, "second", &err, 0600)) << err;
  ASSERT_TRUE(ReadFile(path, &got, &err)) << err;
  EXPECT_EQ(got, "second");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);
  std::filesystem::remove_all(dir);
}

TEST(Fd, UniqueFdClosesOnce) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  {
    UniqueFd r(fds[0]);
    UniqueFd moved = std::move(r);
    EXPECT_FALSE(r.valid());
    EXPECT_EQ(moved.get(), fds[0]);
  }
  EXPECT_EQ(::fcntl(fds[0], F_GETFD), -1);  // closed by the moved-to owner
  ::close(fds[1]);
}

TEST(Fd, ReadFileReportsThePath) {
  std::string out, err;
  EXPECT_FALSE(ReadFile("/nonexistent/x", &out, &err));
  EXPECT_NE(err.find("/nonexistent/x"), std::string::npos);
}

}  // namespace
}  // namespace dflash
