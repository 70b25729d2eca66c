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
  bool ok = ExportCache(cache, file, {"2.13.0+cpu", "cpu", ""}, &report, &err);
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

// The whole cache travels: what torch writes on CUDA besides kernels (a best_config, the
// max-autotune timings, a CuTe DSL object), and the GPU identity it was made for, which an
// import for another GPU refuses (the cluster gate's fetch imports the same way).
TEST(CacheArchive, CudaContentTravelsAndAnotherGpuRefusesIt) {
  TempDir t;
  std::string cache = t.path() + "/cache", other = t.path() + "/other";
  const std::string best = "yv/842878a06c93b2a9ad1f746de6e5c812afe702acf579ebeeaa5c2025779ce37d.best_config";
  const std::string timings = "cache/44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
  const std::string cute = "cutedsl_compile_cache/3b66e2fda26d61d20b16b33290188adc334ce4327d6c2e3df3505e9689272f06.o";
  WriteText(cache + "/yv/cyvtb6lnvmsyxf4dc7y5psuvbja2k5deiclziipns6qqkyl42ii7.py", "kernel");
  WriteText(cache + "/" + best, "{\"XBLOCK\": 128}");
  WriteText(cache + "/" + timings, "{\"cache\": {}}");
  WriteText(cache + "/" + cute, "ELF");
  WriteText(cache + "/cutedsl_compile_cache/tmphywp6sqp.o.tmp", "half");  // in flight: not content
  const std::string h200 = "NVIDIA H200 sm 9.0; cuda 13.0 triton 3.6.0";
  ExportReport report;
  std::string err, file = t.path() + "/c.tar.zst";
  ASSERT_TRUE(ExportCache(cache, file, {"2.13.0+cu130", "cuda", h200}, &report, &err)) << err;
  EXPECT_EQ(report.manifest.gpu, h200);
  std::vector<std::string> names;
  for (const auto& [name, data] : Entries(file)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", timings, cute, best,
                                             "yv/cyvtb6lnvmsyxf4dc7y5psuvbja2k5deiclziipns6qqkyl42ii7.py"}));
  CacheManifest m;
  ASSERT_TRUE(ReadArchiveManifest(file, &m, &err)) << err;
  EXPECT_EQ(m.gpu, h200);

  fs::create_directories(other + "/.dflash");  // the gate dir: the import command takes the gate first
  ImportReport r;
  ArchiveTrust vouched;
  vouched.vouched = true;
  EXPECT_EQ(ImportCache(file, other, {"2.13.0+cu130", "cuda", "NVIDIA A100-SXM4-80GB sm 8.0; cuda 13.0 triton 3.6.0"},
                        false, vouched, &r, &err),
            ImportResult::kMismatch);
  EXPECT_NE(err.find("compiled for " + h200), std::string::npos) << err;
  EXPECT_NE(err.find("--force"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(other + "/" + best));
  ASSERT_EQ(ImportCache(file, other, {"2.13.0+cu130", "cuda", h200}, false, vouched, &r, &err), ImportResult::kOk)
      << err;
  EXPECT_TRUE(fs::exists(other + "/" + best) && fs::exists(other + "/" + timings) && fs::exists(other + "/" + cute));
}

// Inductor's CPU keys do not see the vector ISA (common/cpu_identity.h): an archive made for another CPU, or one
// that does not say (an older version's), is refused, and nothing is written; the same CPU imports it.
TEST(CacheArchive, AnotherCpusKernelsAreRefused) {
  TempDir t;
  std::string cache = t.path() + "/cache", other = t.path() + "/other";
  const std::string kernel = "yv/cyvtb6lnvmsyxf4dc7y5psuvbja2k5deiclziipns6qqkyl42ii7.py";
  WriteText(cache + "/" + kernel, "kernel");
  const std::string avx512 = "x86_64 GenuineIntel family 6 model 143, best ISA avx512, flags 1, ATEN_CPU_CAPABILITY unset";
  const std::string avx2 = "x86_64 AuthenticAMD family 23 model 49, best ISA avx2, flags 2, ATEN_CPU_CAPABILITY unset";
  ExportReport report;
  std::string err, file = t.path() + "/c.tar.zst", old = t.path() + "/old.tar.zst";
  ASSERT_TRUE(ExportCache(cache, file, {"2.13.0+cpu", "cpu", "cpu", avx512}, &report, &err)) << err;
  ASSERT_TRUE(ExportCache(cache, old, {"2.13.0+cpu", "cpu", "cpu", ""}, &report, &err)) << err;
  CacheManifest m;
  ASSERT_TRUE(ReadArchiveManifest(file, &m, &err)) << err;
  EXPECT_EQ(m.cpu, avx512);
  fs::create_directories(other + "/.dflash");
  ImportReport r;
  ArchiveTrust vouched;
  vouched.vouched = true;
  EXPECT_EQ(ImportCache(file, other, {"2.13.0+cpu", "cpu", "cpu", avx2}, false, vouched, &r, &err),
            ImportResult::kMismatch);
  EXPECT_NE(err.find("compiled for the CPU " + avx512), std::string::npos) << err;
  EXPECT_EQ(ImportCache(old, other, {"2.13.0+cpu", "cpu", "cpu", avx2}, false, vouched, &r, &err),
            ImportResult::kMismatch);
  EXPECT_NE(err.find("does not say which CPU"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(other + "/" + kernel));
  ASSERT_EQ(ImportCache(file, other, {"2.13.0+cpu", "cpu", "cpu", avx512}, false, vouched, &r, &err),
            ImportResult::kOk)
      << err;
  EXPECT_TRUE(fs::exists(other + "/" + kernel));
}

// An archive is code: only one signed with the importer's key (or vouched for) is unpacked, and a refusal
// writes nothing. The signature follows the manifest, which names every file's hash.
TEST(CacheArchive, OnlyAnArchiveSignedWithTheImportersKeyOrVouchedForIsImported) {
  TempDir t;
  std::string cache = t.path() + "/cache", other = t.path() + "/other";
  WriteText(cache + "/ab/cabkernel.cpp", "kernel");
  fs::create_directories(other + "/.dflash");
  ExportReport report;
  std::string err, signed_file = t.path() + "/s.tar.zst", unsigned_file = t.path() + "/u.tar.zst";
  ASSERT_TRUE(ExportCache(cache, signed_file, {"2.13.0+cpu", "cpu", ""}, &report, &err, "my-key")) << err;
  ASSERT_TRUE(ExportCache(cache, unsigned_file, {"2.13.0+cpu", "cpu", ""}, &report, &err)) << err;
  auto entries = Entries(signed_file);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[1].first, kSignatureName);
  EXPECT_EQ(entries[1].second, SignManifest("my-key", entries[0].second));
  ImportReport r;
  const ArchiveFacts here{"2.13.0+cpu", "cpu", ""};
  struct Case {
    std::string file, key;
    bool vouched;
    ImportResult want;
    std::string says;
  };
  for (const Case& c : {Case{unsigned_file, "my-key", false, ImportResult::kUntrusted, "not signed"},
                        Case{signed_file, "another-key", false, ImportResult::kUntrusted, "not signed with your"},
                        Case{signed_file, "", false, ImportResult::kUntrusted, "no archive key"}}) {
    ArchiveTrust trust{c.key, c.vouched};
    EXPECT_EQ(CheckArchiveTrust(c.file, trust, &err), c.want) << c.file << " " << c.key;
    EXPECT_EQ(ImportCache(c.file, other, here, false, trust, &r, &err), c.want) << c.file << " " << c.key;
    EXPECT_NE(err.find(c.says), std::string::npos) << err;
    EXPECT_NE(err.find("--trust"), std::string::npos) << err;
    EXPECT_FALSE(fs::exists(other + "/ab/cabkernel.cpp"));
  }
  ASSERT_EQ(ImportCache(signed_file, other, here, false, {"my-key", false}, &r, &err), ImportResult::kOk) << err;
  EXPECT_EQ(test::Slurp(other + "/ab/cabkernel.cpp"), "kernel");
  fs::remove_all(other + "/ab");
  ASSERT_EQ(ImportCache(unsigned_file, other, here, false, {"", true}, &r, &err), ImportResult::kOk) << err;
  EXPECT_EQ(test::Slurp(other + "/ab/cabkernel.cpp"), "kernel");
}

TEST(CacheArchive, ExportRefusesToWriteThroughAPlantedTempFile) {
  TempDir t;
  std::string cache = t.path() + "/cache";
  WriteText(cache + "/ab/cabkernel.cpp", "kernel");
  std::string file = t.path() + "/c.tar.zst";
  fs::create_symlink(t.path() + "/victim", file + ".tmp." + std::to_string(::getpid()));
  ExportReport report;
  std::string err;
  EXPECT_FALSE(ExportCache(cache, file, {"2.13.0+cpu", "cpu", ""}, &report, &err));
  EXPECT_NE(err.find("File exists"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(t.path() + "/victim"));
}

}  // namespace
}  // namespace dflash
