#include "launcher/cache_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>

#include "common/fd.h"
#include "common/hash.h"
#include "common/proc_info.h"
#include "launcher/cache_inventory.h"

namespace dflash {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kFormat = "dflash-cache/1";

using ArchivePtr = std::unique_ptr<archive, int (*)(archive*)>;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// A path inside the archive we are willing to create: relative, no "..",
/// and a cache file or a READY marker.
bool SafeEntryPath(const std::string& p) {
  if (p.empty() || p[0] == '/' || p.find('\0') != std::string::npos) return false;
  for (const auto& part : fs::path(p))
    if (part == ".." || part == ".") return false;
  return !CacheKindOf(p).empty() || p.rfind(".dflash/ready/", 0) == 0;
}

bool AddFile(archive* a, const std::string& name, const std::string& data, std::string* err) {
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0600);
  archive_entry_set_mtime(e, std::time(nullptr), 0);
  bool ok = archive_write_header(a, e) == ARCHIVE_OK &&
            archive_write_data(a, data.data(), data.size()) == static_cast<la_ssize_t>(data.size());
  if (!ok) *err = std::string("writing ") + name + ": " + archive_error_string(a);
  archive_entry_free(e);
  return ok;
}

std::vector<std::string> ReadyMarkers(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / ".dflash/ready", ec))
    if (e.path().extension() == ".json") out.push_back(".dflash/ready/" + e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

ArchivePtr OpenRead(const std::string& file, std::string* err) {
  ArchivePtr a(archive_read_new(), archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), file.c_str(), 1 << 16) != ARCHIVE_OK) {
    *err = "cannot open " + file + ": " + archive_error_string(a.get());
    return ArchivePtr(nullptr, archive_read_free);
  }
  return a;
}

bool ReadEntryData(archive* a, std::string* out, std::string* err) {
  out->clear();
  char buf[1 << 16];
  for (;;) {
    la_ssize_t n = archive_read_data(a, buf, sizeof buf);
    if (n < 0) {
      *err = archive_error_string(a);
      return false;
    }
    if (n == 0) return true;
    out->append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

bool ExportCache(const std::string& dir, const std::string& file, const ArchiveFacts& facts,
                 nlohmann::json* manifest, std::string* err) {
  std::vector<std::string> files = CacheContentFiles(dir);
  std::vector<std::string> markers = ReadyMarkers(dir);
  nlohmann::json m = {{"format", kFormat}, {"torch_version", facts.torch_version}, {"device", facts.device},
                      {"created", static_cast<int64_t>(std::time(nullptr))}, {"host", HostName()},
                      {"keys", nlohmann::json::array()}, {"files", nlohmann::json::array()}};
  // First pass: hashes, so the manifest can be the archive's first entry.
  std::map<std::string, std::string> contents;
  for (const std::string& rel : files) {
    std::string data;
    if (!ReadFile((fs::path(dir) / rel).string(), &data, err)) return false;
    m["files"].push_back({{"path", rel}, {"size", data.size()}, {"sha256", Sha256Hex(data)}});
    contents[rel] = std::move(data);
  }
  for (const std::string& rel : markers) {
    std::string data;
    if (!ReadFile((fs::path(dir) / rel).string(), &data, err)) return false;
    nlohmann::json rec = nlohmann::json::parse(data, nullptr, false);
    m["keys"].push_back(rec.is_discarded() ? nlohmann::json(rel) : rec);
    m["files"].push_back({{"path", rel}, {"size", data.size()}, {"sha256", Sha256Hex(data)}});
    contents[rel] = std::move(data);
  }
  std::string tmp = file + ".tmp." + std::to_string(::getpid());
  ArchivePtr a(archive_write_new(), archive_write_free);
  bool gz = EndsWith(file, ".tar.gz") || EndsWith(file, ".tgz");
  if ((gz ? archive_write_add_filter_gzip(a.get()) : archive_write_add_filter_zstd(a.get())) != ARCHIVE_OK ||
      archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_open_filename(a.get(), tmp.c_str()) != ARCHIVE_OK) {
    *err = "cannot write " + tmp + ": " + archive_error_string(a.get());
    return false;
  }
  bool ok = AddFile(a.get(), kManifestName, m.dump(2), err);
  for (const auto& f : m["files"]) {
    if (!ok) break;
    ok = AddFile(a.get(), f["path"].get<std::string>(), contents[f["path"].get<std::string>()], err);
  }
  if (ok && archive_write_close(a.get()) != ARCHIVE_OK) {
    *err = std::string("closing the archive: ") + archive_error_string(a.get());
    ok = false;
  }
  if (!ok || ::rename(tmp.c_str(), file.c_str()) != 0) {
    if (ok) *err = ErrnoMessage("rename(" + file + ")", errno);
    ::unlink(tmp.c_str());
    return false;
  }
  *manifest = std::move(m);
  return true;
}

bool ReadArchiveManifest(const std::string& file, nlohmann::json* manifest, std::string* err) {
  ArchivePtr a = OpenRead(file, err);
  if (!a) return false;
  archive_entry* e = nullptr;
  if (archive_read_next_header(a.get(), &e) != ARCHIVE_OK) {
    *err = file + " is not a dflash cache archive: " + archive_error_string(a.get());
    return false;
  }
  std::string text;
  if (std::string(archive_entry_pathname(e)) != kManifestName || !ReadEntryData(a.get(), &text, err)) {
    *err = file + " is not a dflash cache archive: its first entry is not " + kManifestName;
    return false;
  }
  *manifest = nlohmann::json::parse(text, nullptr, false);
  if (manifest->is_discarded() || !manifest->is_object() || manifest->value("format", "") != kFormat ||
      !(*manifest)["files"].is_array()) {
    *err = file + ": unreadable manifest (expected format " + kFormat + ")";
    return false;
  }
  return true;
}

ImportResult ImportCache(const std::string& file, const std::string& dir, const ArchiveFacts& here, bool force,
                         nlohmann::json* manifest, std::string* err) {
  if (!ReadArchiveManifest(file, manifest, err)) return ImportResult::kCorrupt;
  const nlohmann::json& m = *manifest;
  std::string torch = m.value("torch_version", ""), device = m.value("device", "");
  if (!force && torch != here.torch_version) {
    *err = "the archive was built with torch " + torch + ", this machine has " + here.torch_version +
           ": Inductor would miss every entry (torch's version is in its cache key). Use --force to import anyway";
    return ImportResult::kMismatch;
  }
  if (!force && device != here.device) {
    *err = "the archive holds " + device + " kernels, this run uses " + here.device + ". Use --force to import anyway";
    return ImportResult::kMismatch;
  }
  std::map<std::string, std::pair<uint64_t, std::string>> want;
  for (const auto& f : m["files"]) {
    std::string p = f.value("path", "");
    if (!SafeEntryPath(p)) {
      *err = file + ": refusing the unsafe path '" + p + "'";
      return ImportResult::kCorrupt;
    }
    want[p] = {f.value("size", uint64_t{0}), f.value("sha256", "")};
  }

  // Unpack beside the cache (same filesystem: renames are atomic), verifying as we go.
  fs::path cache(dir);
  std::string staging = (cache.parent_path() / ("." + cache.filename().string() + ".import-" +
                                                std::to_string(::getpid()))).string();
  std::error_code ec;
  fs::remove_all(staging, ec);
  if (::mkdir(staging.c_str(), 0700) != 0) {
    *err = ErrnoMessage("mkdir(" + staging + ")", errno);
    return ImportResult::kIo;
  }
  auto fail = [&](ImportResult r, std::string why) {
    *err = std::move(why);
    fs::remove_all(staging, ec);
    return r;
  };
  ArchivePtr a = OpenRead(file, err);
  if (!a) return fail(ImportResult::kCorrupt, *err);
  archive_entry* e = nullptr;
  size_t seen = 0;
  bool first = true;
  for (;;) {
    int rc = archive_read_next_header(a.get(), &e);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK)
      return fail(ImportResult::kCorrupt, file + " is corrupted: " + archive_error_string(a.get()));
    std::string path = archive_entry_pathname(e);
    std::string data, rerr;
    if (!ReadEntryData(a.get(), &data, &rerr))
      return fail(ImportResult::kCorrupt, file + " is corrupted at " + path + ": " + rerr);
    if (first) {  // the manifest, read above
      first = false;
      continue;
    }
    auto it = want.find(path);
    if (it == want.end() || archive_entry_filetype(e) != AE_IFREG)
      return fail(ImportResult::kCorrupt, file + ": '" + path + "' is not in its manifest");
    if (data.size() != it->second.first || Sha256Hex(data) != it->second.second)
      return fail(ImportResult::kCorrupt, file + " is corrupted: " + path + " does not match its SHA-256");
    fs::path out = fs::path(staging) / path;
    if (std::string merr; !MakeDirs(out.parent_path().string(), 0700, &merr)) return fail(ImportResult::kIo, merr);
    UniqueFd fd(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    std::string werr;
    if (!fd || !WriteAll(fd.get(), data, &werr))
      return fail(ImportResult::kIo, fd ? werr : ErrnoMessage("open(" + out.string() + ")", errno));
    ++seen;
  }
  if (seen != want.size())
    return fail(ImportResult::kCorrupt, file + " is truncated: " + std::to_string(seen) + " of " +
                                            std::to_string(want.size()) + " files");

  // Rename in: cache files first, READY markers last, so no reader is promised
  // a warm cache before its files are there. Each file appears whole or not at all.
  std::vector<std::string> order;
  for (const auto& [p, _] : want)
    if (p.rfind(".dflash/", 0) != 0) order.push_back(p);
  for (const auto& [p, _] : want)
    if (p.rfind(".dflash/", 0) == 0) order.push_back(p);
  for (const std::string& p : order) {
    fs::path dst = cache / p;
    std::string merr;
    if (!MakeDirs(dst.parent_path().string(), 0700, &merr)) return fail(ImportResult::kIo, merr);
    if (::rename((fs::path(staging) / p).c_str(), dst.c_str()) != 0)
      return fail(ImportResult::kIo, ErrnoMessage("rename into " + dst.string(), errno));
  }
  fs::remove_all(staging, ec);
  return ImportResult::kOk;
}

}  // namespace dflash
