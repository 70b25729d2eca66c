#include "cachelock/cache_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "testing/files.h"
#include "testing/temp_dir.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

using test::TempDir;
using test::WriteText;
std::vector<std::pair<std::string, std::string>> Entries(const std::string& file) {
  std::vector<std::pair<std::string, std::string>> out;
  archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_tar(a);
  EXPECT_EQ(archive_read_open_filename(a, file.c_str(), 1 << 16), ARCHIVE_OK);
  archive_entry* e = nullptr;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    std::string data(static_cast<size_t>(archive_entry_size(e)), '\0');
    archive_read_data(a, data.data(), data.size());
    out.emplace_back(archive_entry_pathname(e), data);
  }
  archive_read_free(a);
  return out;
}

TEST(CacheArchive, ExportSkipsLinksAndForeignFilesAndIsPrivateWhateverTheUmask) {
  TempDir t;
  std::string cache = t.path() + "/cache";
  WriteText(cache + "/ab/cabkernel.cpp", "kernel");
  WriteText(cache + "/Documents/thesis.tex", "thesis");
  WriteText(t.path() + "/secret", "root-only secret");
  fs::create_symlink(t.path() + "/secret", cache + "/ab/cabsecret.so");
  fs::create_directories(cache + "/.dflash/ready");
  mode_t old = ::umask(0);
  ExportReport report;
  std::string err;
  std::string file = t.path() + "/c.tar.zst";
  bool ok = ExportCache(cache, file, {"2.13.0+cpu", "cpu"}, &report, &err);
  ::umask(old);
  ASSERT_TRUE(ok) << err;
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto entries = Entries(file);
  ASSERT_EQ(entries.size(), 2u);  // manifest + the one kernel
  EXPECT_EQ(entries[0].first, "manifest.json");
  EXPECT_EQ(entries[1].first, "ab/cabkernel.cpp");
  for (const auto& [name, data] : entries) EXPECT_EQ(data.find("secret"), std::string::npos) << name;
  ASSERT_EQ(report.skipped.size(), 2u);
  EXPECT_EQ(report.skipped[0], "Documents/thesis.tex (not written by Inductor)");
  EXPECT_EQ(report.skipped[1], "ab/cabsecret.so (a symlink: never followed)");
}

TEST(CacheArchive, ExportRefusesToWriteThroughAPlantedTempFile) {
  TempDir t;
  std::string cache = t.path() + "/cache";
  WriteText(cache + "/ab/cabkernel.cpp", "kernel");
  std::string file = t.path() + "/c.tar.zst";
  fs::create_symlink(t.path() + "/victim", file + ".tmp." + std::to_string(::getpid()));
  ExportReport report;
  std::string err;
  EXPECT_FALSE(ExportCache(cache, file, {"2.13.0+cpu", "cpu"}, &report, &err));
  EXPECT_NE(err.find("File exists"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(t.path() + "/victim"));
}

}  // namespace
}  // namespace dflash
