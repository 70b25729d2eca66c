// `cache export` and the manifest reader shared with import (cache_import.cc).
#include "cachelock/cache_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>

#include "cachelock/gate_dir.h"
#include "common/fd.h"
#include "common/hash.h"
#include "common/proc_info.h"
#include "common/secure_path.h"
#include "cachelock/cache_archive_io.h"
#include "cachelock/cache_inventory.h"

namespace dflash {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// "write /x/c.tar.zst: No space left on device": errno's text when libarchive has one.
std::string WriteError(archive* a, const std::string& file) {
  int e = archive_errno(a);
  const char* what = archive_error_string(a);
  return "write " + file + ": " + (e > 0 ? std::strerror(e) : what ? what : "unknown error");
}

/// The SHA-256 and length of an open file, read through one buffer.
bool HashFd(int fd, const std::string& path, uint64_t* size, std::string* hex, std::string* err) {
  Sha256Stream sha;
  std::unique_ptr<char[]> buf(new char[kArchiveChunk]);
  *size = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.get(), kArchiveChunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = ErrnoMessage("read " + path, errno);
      return false;
    }
    if (n == 0) break;
    sha.Update(buf.get(), static_cast<size_t>(n));
    *size += static_cast<uint64_t>(n);
  }
  *hex = sha.Hex();
  return true;
}

/// Opens a cache file for reading without following a link anywhere on its path.
UniqueFd OpenCacheFile(int dirfd, const std::string& dir, const std::string& rel, std::string* err) {
  UniqueFd fd(OpenBeneath(dirfd, rel, O_RDONLY | O_NONBLOCK));
  struct stat st {};
  if (!fd) {
    *err = ErrnoMessage("open " + dir + "/" + rel, errno) + (errno == ELOOP ? " (a symlink: never followed)" : "");
  } else if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    *err = dir + "/" + rel + " is not a regular file";
    fd.reset();
  }
  return fd;
}

/// The READY markers worth exporting: plain files of ours (ReadTrustedMarker).
void ReadyMarkers(const std::string& dir, CacheManifest* m, std::vector<std::string>* rels, ExportReport* report) {
  std::string ready = dir + "/.dflash/ready";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(ready.c_str()), ::closedir);
  if (!d) return;
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d.get())) {
    std::string n = e->d_name;
    if (n.size() > 5 && n[0] != '.' && EndsWith(n, ".json")) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    std::string text, err;
    if (!ReadTrustedMarker(ready + "/" + n, &text, &err)) {
      report->skipped.push_back(".dflash/ready/" + n + " (" + err + ")");
      continue;
    }
    nlohmann::json rec = nlohmann::json::parse(text, nullptr, false);
    m->keys.push_back(rec.is_discarded() ? nlohmann::json(n) : rec);
    rels->push_back(".dflash/ready/" + n);
  }
}

bool AddEntryHeader(archive* a, const std::string& name, uint64_t size, const std::string& file, std::string* err) {
  std::unique_ptr<archive_entry, void (*)(archive_entry*)> e(archive_entry_new(), archive_entry_free);
  archive_entry_set_pathname(e.get(), name.c_str());
  archive_entry_set_size(e.get(), static_cast<la_int64_t>(size));
  archive_entry_set_filetype(e.get(), AE_IFREG);
  archive_entry_set_perm(e.get(), 0600);
  archive_entry_set_mtime(e.get(), std::time(nullptr), 0);
  if (archive_write_header(a, e.get()) != ARCHIVE_OK) {
    *err = WriteError(a, file);
    return false;
  }
  return true;
}

/// Streams one cache file into the archive, checking it is still what pass one hashed.
bool AddCacheFile(archive* a, int dirfd, const std::string& dir, const ManifestFile& f, const std::string& file,
                  char* buf, std::string* err) {
  UniqueFd fd = OpenCacheFile(dirfd, dir, f.path, err);
  if (!fd || !AddEntryHeader(a, f.path, f.size, file, err)) return false;
  Sha256Stream sha;
  uint64_t done = 0;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, kArchiveChunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = ErrnoMessage("read " + dir + "/" + f.path, errno);
      return false;
    }
    if (n == 0) break;
    if (done + static_cast<uint64_t>(n) > f.size) break;  // grew: caught below
    sha.Update(buf, static_cast<size_t>(n));
    if (archive_write_data(a, buf, static_cast<size_t>(n)) != n) {
      *err = WriteError(a, file);
      return false;
    }
    done += static_cast<uint64_t>(n);
  }
  if (done != f.size || sha.Hex() != f.sha256) {
    *err = dir + "/" + f.path + " changed while it was being exported (is something writing the cache without the gate?)";
    return false;
  }
  return true;
}

}  // namespace

ArchiveReader OpenArchiveForRead(const std::string& file, std::string* err) {
  ArchiveReader a(archive_read_new(), archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), file.c_str(), kArchiveChunk) != ARCHIVE_OK) {
    *err = "cannot open " + file + ": " + archive_error_string(a.get());
    return ArchiveReader(nullptr, archive_read_free);
  }
  return a;
}

bool ReadManifestEntry(archive* a, const std::string& file, CacheManifest* manifest, std::string* err,
                       std::string* text_out) {
  archive_entry* e = nullptr;
  if (archive_read_next_header(a, &e) != ARCHIVE_OK) {
    *err = file + " is not a dflash cache archive: " + archive_error_string(a);
    return false;
  }
  if (std::string(archive_entry_pathname(e)) != kManifestName || archive_entry_filetype(e) != AE_IFREG) {
    *err = file + " is not a dflash cache archive: its first entry is not " + kManifestName;
    return false;
  }
  if (archive_entry_size_is_set(e) && archive_entry_size(e) > static_cast<la_int64_t>(CacheManifest::kMaxBytes)) {
    *err = file + ": its manifest is larger than 64 MiB";
    return false;
  }
  std::string text;
  std::unique_ptr<char[]> buf(new char[kArchiveChunk]);
  for (;;) {
    la_ssize_t n = archive_read_data(a, buf.get(), kArchiveChunk);
    if (n < 0) {
      *err = file + " is corrupted at " + kManifestName + ": " + archive_error_string(a);
      return false;
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > CacheManifest::kMaxBytes) {
      *err = file + ": its manifest is larger than 64 MiB";
      return false;
    }
    text.append(buf.get(), static_cast<size_t>(n));
  }
  if (!ParseManifest(text, manifest, err)) {
    *err = file + ": bad manifest: " + *err;
    return false;
  }
  if (text_out) *text_out = std::move(text);
  return true;
}

bool ReadSignatureEntry(archive* a, const std::string& file, std::string* signature, bool* signed_,
                        archive_entry** pending, std::string* err) {
  *signed_ = false;
  *pending = nullptr;
  archive_entry* e = nullptr;
  int rc = archive_read_next_header(a, &e);
  if (rc == ARCHIVE_EOF) return true;
  if (rc != ARCHIVE_OK) {
    *err = file + " is corrupted: " + archive_error_string(a);
    return false;
  }
  if (std::string(archive_entry_pathname(e) ? archive_entry_pathname(e) : "") != kSignatureName) {
    *pending = e;
    return true;
  }
  char buf[129];
  la_ssize_t n = archive_read_data(a, buf, sizeof buf);
  if (n < 0 || n > 128 || archive_entry_filetype(e) != AE_IFREG) {
    *err = file + ": its " + kSignatureName + " is not a signature";
    return false;
  }
  *signature = std::string(buf, static_cast<size_t>(n));
  *signed_ = true;
  rc = archive_read_next_header(a, &e);  // the first content entry, for the caller
  if (rc == ARCHIVE_EOF) return true;
  if (rc != ARCHIVE_OK) {
    *err = file + " is corrupted: " + archive_error_string(a);
    return false;
  }
  *pending = e;
  return true;
}

ImportResult CheckArchiveTrust(const std::string& file, const ArchiveTrust& trust, std::string* err) {
  ArchiveReader a = OpenArchiveForRead(file, err);
  CacheManifest m;
  std::string text, sig;
  bool signed_ = false;
  archive_entry* pending = nullptr;
  if (!a || !ReadManifestEntry(a.get(), file, &m, err, &text) ||
      !ReadSignatureEntry(a.get(), file, &sig, &signed_, &pending, err))
    return ImportResult::kCorrupt;
  return ArchiveTrusted(trust, text, sig, signed_, err) ? ImportResult::kOk : ImportResult::kUntrusted;
}

bool ReadArchiveManifest(const std::string& file, CacheManifest* manifest, std::string* err) {
  ArchiveReader a = OpenArchiveForRead(file, err);
  return a && ReadManifestEntry(a.get(), file, manifest, err);
}

bool ExportCache(const std::string& dir, const std::string& file, const ArchiveFacts& facts, ExportReport* report,
                 std::string* err, const std::string& sign_key) {
  UniqueFd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd) {
    *err = ErrnoMessage("open " + dir, errno);
    return false;
  }
  CacheManifest& m = report->manifest;
  m = CacheManifest{};
  m.torch_version = facts.torch_version;
  m.device = facts.device;
  m.gpu = facts.gpu;
  m.cpu = facts.cpu;
  m.host = HostName();
  m.created = static_cast<int64_t>(std::time(nullptr));
  std::vector<CacheFile> files;
  if (!ListCache(dir, &files, err)) return false;
  // Pass one: every content file's size and hash (the manifest comes first in the archive).
  std::vector<std::string> rels;
  for (const CacheFile& f : files) {
    if (f.type == S_IFLNK) report->skipped.push_back(f.rel + " (a symlink: never followed)");
    else if (f.kind.empty()) report->skipped.push_back(f.rel + " (not written by Inductor)");
    else if (IsContentKind(f.kind)) rels.push_back(f.rel);
  }
  ReadyMarkers(dir, &m, &rels, report);
  for (const std::string& rel : rels) {
    UniqueFd fd = OpenCacheFile(dirfd.get(), dir, rel, err);
    ManifestFile mf{rel, 0, ""};
    if (!fd || !HashFd(fd.get(), dir + "/" + rel, &mf.size, &mf.sha256, err)) return false;
    m.files.push_back(std::move(mf));
  }
  // Pass two: the archive, into a temp file only we can read, streamed.
  std::string tmp = file + ".tmp." + std::to_string(::getpid());
  UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) {
    *err = ErrnoMessage("create " + tmp, errno);
    return false;
  }
  ::fchmod(out.get(), 0600);
  bool ok = false;
  {
    ArchivePtrW a(archive_write_new(), archive_write_free);
    bool gz = EndsWith(file, ".tar.gz") || EndsWith(file, ".tgz");
    int frc = EndsWith(file, ".tar") ? ARCHIVE_OK
              : gz                   ? archive_write_add_filter_gzip(a.get())
                                     : archive_write_add_filter_zstd(a.get());
    if (frc != ARCHIVE_OK || archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
        archive_write_open_fd(a.get(), out.get()) != ARCHIVE_OK) {
      *err = WriteError(a.get(), file);
    } else {
      std::string text = m.Encode();
      ok = AddEntryHeader(a.get(), kManifestName, text.size(), file, err);
      if (ok && archive_write_data(a.get(), text.data(), text.size()) != static_cast<la_ssize_t>(text.size())) {
        *err = WriteError(a.get(), file);
        ok = false;
      }
      if (ok && !sign_key.empty()) {  // right after the manifest: an import checks it before unpacking anything
        std::string sig = SignManifest(sign_key, text);
        ok = AddEntryHeader(a.get(), kSignatureName, sig.size(), file, err);
        if (ok && archive_write_data(a.get(), sig.data(), sig.size()) != static_cast<la_ssize_t>(sig.size())) {
          *err = WriteError(a.get(), file);
          ok = false;
        }
      }
      std::unique_ptr<char[]> buf(new char[kArchiveChunk]);
      for (size_t i = 0; ok && i < m.files.size(); ++i)
        ok = AddCacheFile(a.get(), dirfd.get(), dir, m.files[i], file, buf.get(), err);
      if (ok && archive_write_close(a.get()) != ARCHIVE_OK) {
        *err = WriteError(a.get(), file);
        ok = false;
      }
    }
  }
  if (ok && ::fsync(out.get()) != 0) {
    *err = ErrnoMessage("write " + file, errno);
    ok = false;
  }
  struct stat st {};
  if (ok && ::fstat(out.get(), &st) == 0) report->archive_bytes = static_cast<uint64_t>(st.st_size);
  out.reset();
  if (ok && ::rename(tmp.c_str(), file.c_str()) != 0) {
    *err = ErrnoMessage("rename " + tmp + " to " + file, errno);
    ok = false;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    *err += " (the partial archive was removed)";
  }
  return ok;
}

}  // namespace dflash
