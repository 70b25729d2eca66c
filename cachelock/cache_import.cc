// `cache import`: stream, bound, verify, stage; then rename in, all or nothing.
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>

#include "common/fd.h"
#include "common/hash.h"
#include "common/secure_path.h"
#include "cachelock/cache_archive.h"
#include "cachelock/cache_archive_io.h"
#include "cachelock/cache_inventory.h"

namespace dflash {
namespace {

/// A path inside the archive we are willing to create: relative, no "." or
/// "..", and a cache content file or a READY marker.
bool SafeEntryPath(const std::string& p) {
  if (p.empty() || p[0] == '/' || p.find('\0') != std::string::npos) return false;
  if (p.rfind(".dflash/ready/", 0) == 0) {
    std::string name = p.substr(14);
    return name.find('/') == std::string::npos && name.size() > 5 && name[0] != '.' &&
           name.compare(name.size() - 5, 5, ".json") == 0;
  }
  return IsContentKind(CacheKindOf(p));
}

std::string Parent(const std::string& rel) {
  size_t slash = rel.find_last_of('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash);
}

/// The staging dir of this import, removed on every way out of ImportCache.
struct Staging {
  int meta_fd = -1;  // <dir>/.dflash
  std::string name;  // import-<pid>
  UniqueFd fd;
  ~Staging() {
    if (name.empty() || meta_fd < 0) return;
    uint64_t n = 0;
    std::string err;
    fd.reset();
    RemoveTreeAt(meta_fd, name, &n, &err);
  }
};

/// Streams the current entry into `out` (already created), never more than
/// `want.size` bytes, hashing as it goes.
ImportResult StreamEntry(archive* a, const std::string& file, const ManifestFile& want, int out,
                         const std::string& out_path, char* buf, std::string* err) {
  Sha256Stream sha;
  uint64_t got = 0;
  for (;;) {
    la_ssize_t n = archive_read_data(a, buf, kArchiveChunk);
    if (n < 0) {
      *err = file + " is corrupted at " + want.path + ": " + archive_error_string(a);
      return ImportResult::kCorrupt;
    }
    if (n == 0) break;
    got += static_cast<uint64_t>(n);
    if (got > want.size) {
      *err = file + ": " + want.path + " holds more than the " + std::to_string(want.size) +
             " bytes its manifest says (an archive bomb?); refused after " + std::to_string(got) + " bytes";
      return ImportResult::kCorrupt;
    }
    sha.Update(buf, static_cast<size_t>(n));
    std::string werr;
    if (!WriteAll(out, std::string_view(buf, static_cast<size_t>(n)), &werr)) {
      *err = "write " + out_path + ": " + werr.substr(werr.find(": ") + 2);
      return ImportResult::kIo;
    }
  }
  if (got != want.size) {
    *err = file + " is truncated: " + want.path + " has " + std::to_string(got) + " of " + std::to_string(want.size) +
           " bytes";
    return ImportResult::kCorrupt;
  }
  if (sha.Hex() != want.sha256) {
    *err = file + " is corrupted: " + want.path + " does not match its SHA-256";
    return ImportResult::kCorrupt;
  }
  return ImportResult::kOk;
}

/// What was renamed into the cache, so that a failure can take it back out.
struct Installed {
  std::string rel;
  bool replaced = false;  // an older file was moved to <staging>/.old/<rel>
};

/// Takes back what was installed (newest first), restores replaced files,
/// removes the directories the import made. False (with `err`) if any of it failed.
bool RollBack(int cache_fd, int stage_fd, const std::vector<Installed>& done, const std::vector<std::string>& made,
              const std::string& dir, std::string* err) {
  bool ok = true;
  for (auto it = done.rbegin(); it != done.rend(); ++it) {
    if (::unlinkat(cache_fd, it->rel.c_str(), 0) != 0 && errno != ENOENT) {
      *err = ErrnoMessage("unlink " + dir + "/" + it->rel, errno);
      ok = false;
      continue;
    }
    if (it->replaced && ::renameat(stage_fd, (".old/" + it->rel).c_str(), cache_fd, it->rel.c_str()) != 0) {
      *err = ErrnoMessage("restore " + dir + "/" + it->rel, errno);
      ok = false;
    }
  }
  for (auto it = made.rbegin(); it != made.rend(); ++it) ::unlinkat(cache_fd, it->c_str(), AT_REMOVEDIR);
  return ok;
}

}  // namespace

ImportResult ImportCache(const std::string& file, const std::string& dir, const ArchiveFacts& here, bool force,
                         const ArchiveTrust& trust, ImportReport* report, std::string* err) {
  *report = ImportReport{};
  ArchiveReader a = OpenArchiveForRead(file, err);
  if (!a) return ImportResult::kCorrupt;
  CacheManifest& m = report->manifest;
  std::string manifest_text, signature;
  bool signed_ = false;
  archive_entry* pending = nullptr;  // the first content entry, read while looking for the signature
  if (!ReadManifestEntry(a.get(), file, &m, err, &manifest_text) ||
      !ReadSignatureEntry(a.get(), file, &signature, &signed_, &pending, err))
    return ImportResult::kCorrupt;
  // Before anything else is believed: the manifest names every file's hash, so a trusted manifest is a trusted archive.
  if (!ArchiveTrusted(trust, manifest_text, signature, signed_, err)) return ImportResult::kUntrusted;
  if (!force && m.torch_version != here.torch_version) {
    *err = "the archive was built with torch " + m.torch_version + ", this machine has " + here.torch_version +
           ": Inductor would miss every entry (torch's version is in its cache key). Use --force to import anyway";
    return ImportResult::kMismatch;
  }
  if (!force && m.device != here.device) {
    *err = "the archive holds " + m.device + " kernels, this run uses " + here.device + ". Use --force to import anyway";
    return ImportResult::kMismatch;
  }
  // Triton kernels and their autotuned configs are made for one GPU model, CUDA and Triton: on
  // another they miss (or, with a stale best_config, run slow). Unknown on either side: not checked.
  if (!force && !m.gpu.empty() && !here.gpu.empty() && m.gpu != here.gpu) {
    *err = "the archive's kernels were compiled for " + m.gpu + ", this run's are for " + here.gpu +
           ": Inductor and Triton would not reuse them (GPU model, compute capability, CUDA and Triton are in their "
           "keys). Use --force to import anyway";
    return ImportResult::kMismatch;
  }
  // Inductor's CPU kernels are built for the vector ISA the process picks and with -march=native, and its FX-graph
  // key does not see either (common/cpu_identity.h): kernels of another CPU are never brought in. An archive that
  // does not say its CPU (made before dflash-launch recorded it) cannot show they are ours.
  if (!force && !here.cpu.empty() && m.cpu != here.cpu) {
    *err = (m.cpu.empty() ? std::string("the archive does not say which CPU its kernels were compiled for (made by an "
                                        "older dflash-launch)")
                          : "the archive's kernels were compiled for the CPU " + m.cpu) +
           "; this run's are for " + here.cpu +
           ": Inductor's CPU cache keys do not cover the vector ISA, so another CPU's entries could be loaded and "
           "compute wrong values. Export the cache on a machine with this CPU (and the same ATEN_CPU_CAPABILITY), or "
           "use --force to import anyway (this run's processes still never load them: their keys carry this CPU)";
    return ImportResult::kMismatch;
  }
  std::map<std::string, const ManifestFile*> want;
  for (const ManifestFile& f : m.files) {
    if (!SafeEntryPath(f.path)) {
      *err = file + ": refusing the unsafe path '" + f.path + "'";
      return ImportResult::kCorrupt;
    }
    want[f.path] = &f;
  }

  // Room for it, before writing a byte (the manifest's sizes are exact: an entry may not exceed them).
  struct statvfs vfs {};
  uint64_t need = m.TotalBytes();
  if (::statvfs(dir.c_str(), &vfs) == 0 &&
      static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < need + (need >> 4)) {
    *err = file + " needs " + HumanBytes(need) + " and only " +
           HumanBytes(static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize) + " is free under " + dir;
    return ImportResult::kIo;
  }

  // Staging inside the cache's own .dflash/ (ours, 0700, same filesystem: renames are atomic).
  // Under the gate no other import runs, so any import-* there is left by one that was killed.
  UniqueFd cache_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  UniqueFd meta_fd(cache_fd ? OpenBeneath(cache_fd.get(), ".dflash", O_RDONLY | O_DIRECTORY) : -1);
  if (!meta_fd) {
    *err = ErrnoMessage("open " + dir + "/.dflash", errno);
    return ImportResult::kIo;
  }
  if (std::unique_ptr<DIR, int (*)(DIR*)> d(::fdopendir(::dup(meta_fd.get())), ::closedir); d) {
    std::vector<std::string> old;
    while (struct dirent* e = ::readdir(d.get()))
      if (std::string(e->d_name).rfind("import-", 0) == 0) old.push_back(e->d_name);
    for (const std::string& n : old) {
      uint64_t count = 0;
      std::string ignored;
      RemoveTreeAt(meta_fd.get(), n, &count, &ignored);
    }
  }
  Staging stage;
  stage.meta_fd = meta_fd.get();
  std::string stage_name = "import-" + std::to_string(::getpid());
  if (::mkdirat(meta_fd.get(), stage_name.c_str(), 0700) != 0) {
    *err = ErrnoMessage("mkdir " + dir + "/.dflash/" + stage_name, errno);
    return ImportResult::kIo;
  }
  stage.name = stage_name;
  stage.fd.reset(OpenBeneath(meta_fd.get(), stage_name, O_RDONLY | O_DIRECTORY));
  if (!stage.fd) {
    *err = ErrnoMessage("open " + dir + "/.dflash/" + stage_name, errno);
    return ImportResult::kIo;
  }
  std::string stage_path = dir + "/.dflash/" + stage_name;

  // Unpack: every entry a plain file named in the manifest, bounded by its size, checked by its hash.
  std::unique_ptr<char[]> buf(new char[kArchiveChunk]);
  size_t seen = 0;
  for (bool first = true;; first = false) {
    archive_entry* e = first ? pending : nullptr;  // null first: no content entry at all
    int rc = first ? (e ? ARCHIVE_OK : ARCHIVE_EOF) : archive_read_next_header(a.get(), &e);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK) {
      *err = file + " is corrupted: " + archive_error_string(a.get());
      return ImportResult::kCorrupt;
    }
    std::string path = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    auto it = want.find(path);
    if (it == want.end()) {
      *err = file + ": '" + path + "' is not in its manifest";
      return ImportResult::kCorrupt;
    }
    if (archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e) || archive_entry_symlink(e)) {
      *err = file + ": '" + path + "' is not a plain file (a link?): refused";
      return ImportResult::kCorrupt;
    }
    const ManifestFile& f = *it->second;
    if (archive_entry_size_is_set(e) && static_cast<uint64_t>(archive_entry_size(e)) != f.size) {
      *err = file + ": '" + path + "' is " + std::to_string(archive_entry_size(e)) + " bytes, its manifest says " +
             std::to_string(f.size) + ": refused before reading it";
      return ImportResult::kCorrupt;
    }
    if (std::string merr; !MakeDirsBeneath(stage.fd.get(), Parent(path), nullptr, &merr) && !Parent(path).empty()) {
      *err = "staging " + path + ": " + merr;
      return ImportResult::kIo;
    }
    UniqueFd out(OpenBeneath(stage.fd.get(), path, O_WRONLY | O_CREAT | O_EXCL, 0600));
    if (!out) {
      *err = errno == EEXIST ? file + ": '" + path + "' appears twice" : ErrnoMessage("create " + stage_path + "/" + path, errno);
      return errno == EEXIST ? ImportResult::kCorrupt : ImportResult::kIo;
    }
    if (ImportResult r = StreamEntry(a.get(), file, f, out.get(), stage_path + "/" + path, buf.get(), err);
        r != ImportResult::kOk)
      return r;
    ++seen;
  }
  if (seen != want.size()) {
    *err = file + " is truncated: " + std::to_string(seen) + " of " + std::to_string(want.size()) + " files";
    return ImportResult::kCorrupt;
  }

  // Rename in: cache files first, READY markers last, so no reader is promised a warm
  // cache before its files are there. A file Inductor already has is moved aside (kept
  // until the end, to be put back if a later step fails); anything else in the way fails.
  std::vector<std::string> order;
  for (const auto& [p, _] : want)
    if (p.rfind(".dflash/", 0) != 0) order.push_back(p);
  for (const auto& [p, _] : want)
    if (p.rfind(".dflash/", 0) == 0) order.push_back(p);
  std::vector<Installed> done;
  std::vector<std::string> made;
  for (const std::string& p : order) {
    std::string step_err;
    Installed inst{p, false};
    struct stat st {};
    bool ok = MakeDirsBeneath(cache_fd.get(), Parent(p), &made, &step_err) || Parent(p).empty();
    if (ok && ::fstatat(cache_fd.get(), p.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (!S_ISREG(st.st_mode)) {
        step_err = dir + "/" + p + " is in the way (not a plain file)";
        ok = false;
      } else if (!MakeDirsBeneath(stage.fd.get(), ".old/" + Parent(p), nullptr, &step_err) ||
                 ::renameat(cache_fd.get(), p.c_str(), stage.fd.get(), (".old/" + p).c_str()) != 0) {
        if (step_err.empty()) step_err = ErrnoMessage("move aside " + dir + "/" + p, errno);
        ok = false;
      } else {
        inst.replaced = true;
      }
    }
    if (ok && ::renameat(stage.fd.get(), p.c_str(), cache_fd.get(), p.c_str()) != 0) {
      step_err = ErrnoMessage("rename into " + dir + "/" + p, errno);
      if (inst.replaced) ::renameat(stage.fd.get(), (".old/" + p).c_str(), cache_fd.get(), p.c_str());
      ok = false;
    }
    if (!ok) {
      *err = step_err;
      if (!done.empty() || !made.empty()) {
        std::string rb_err;
        if (RollBack(cache_fd.get(), stage.fd.get(), done, made, dir, &rb_err)) {
          report->rolled_back = true;
        } else {
          report->cache_changed = true;
          report->rollback_error = rb_err;
        }
      }
      return ImportResult::kIo;
    }
    done.push_back(inst);
  }
  return ImportResult::kOk;
}

}  // namespace dflash
