// Portable compile-cache archives (`dflash-launch cache export|import`): a tar
// (zstd; gzip for .tar.gz/.tgz; none for .tar) written with libarchive, its
// first entry a manifest (cachelock/cache_manifest.h) naming the torch version,
// the device kind, the READY keys and every file's size and SHA-256.
//
// Both directions stream: a file's bytes pass through one fixed buffer, so
// memory does not grow with a file, the cache or the archive (a 36 KB archive
// that inflates to gigabytes costs what a small one costs). Neither ever
// follows a symlink: export skips links (and files Inductor did not write) and
// says so; import writes only plain files at checked relative paths.
#pragma once

#include <string>
#include <vector>

#include "cachelock/archive_key.h"
#include "cachelock/cache_manifest.h"

namespace dflash {

struct ArchiveFacts {
  std::string torch_version;  // what the cache was built with (this machine's, for import)
  std::string device;         // "cpu" or "cuda"
  /// "cpu" or the GPU model(s), compute capability, CUDA and Triton versions the kernels are for
  /// (launcher/plan RolePlan::gpu_identity); empty: unknown (then not checked).
  std::string gpu;
  /// The CPU identity its entries are keyed for (common/cpu_identity.h; RolePlan::cpu_identity): Inductor's CPU
  /// keys do not see the vector ISA, so an archive of another CPU is refused. Empty: unknown (an archive made
  /// before it was recorded is refused as well when `here` knows its own).
  std::string cpu;
};

struct ExportReport {
  CacheManifest manifest;
  uint64_t archive_bytes = 0;
  std::vector<std::string> skipped;  // "fxgraph/x (a symlink: never followed)", ...
};

/// Writes `file` from the cache in `dir`: a temp file beside it created 0600
/// with O_EXCL, renamed over `file` once complete. On failure the temp file is
/// removed and `err` says what failed, on which path, with errno's text
/// ("write /x/c.tar.zst: No space left on device").
/// REQUIRES: the caller holds the cache's gate (no leader is writing).
/// `sign_key` (archive_key.h) signs the manifest: the signature is the archive's second entry. Empty: unsigned
/// (the cluster gate signs its archives its own way).
bool ExportCache(const std::string& dir, const std::string& file, const ArchiveFacts& facts, ExportReport* report,
                 std::string* err, const std::string& sign_key = "");

enum class ImportResult { kOk, kMismatch, kCorrupt, kIo, kUntrusted };

struct ImportReport {
  CacheManifest manifest;
  bool cache_changed = false;   // true only if a failure could not be rolled back
  bool rolled_back = false;     // files were installed, then taken out again: the cache is as it was
  std::string rollback_error;   // why the roll-back was incomplete
};

/// Reads and type-checks the manifest of `file` only (no unpacking).
bool ReadArchiveManifest(const std::string& file, CacheManifest* manifest, std::string* err);

/// Whether `file` may be imported under `trust` (archive_key.h), from its manifest and signature only.
/// kOk, kUntrusted or kCorrupt, with `err`. ImportCache checks again on the bytes it unpacks.
ImportResult CheckArchiveTrust(const std::string& file, const ArchiveTrust& trust, std::string* err);

/// Unpacks `file` into `dir`, all or nothing: every entry is streamed into a
/// staging dir inside `dir/.dflash/` with its size bounded by the manifest and
/// its SHA-256 checked; then the files are renamed in, READY markers last. A
/// failure at any step takes back what was renamed in (restoring files it
/// replaced) and removes the staging dir; `report` says whether that worked.
/// The manifest must match `here` (torch version, device) unless `force`, and the archive must be
/// trusted (`trust`: signed with the user's key, or vouched for) before anything is written: kUntrusted.
/// REQUIRES: the caller holds the cache's gate.
ImportResult ImportCache(const std::string& file, const std::string& dir, const ArchiveFacts& here, bool force,
                         const ArchiveTrust& trust, ImportReport* report, std::string* err);

}  // namespace dflash
