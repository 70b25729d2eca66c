// Portable compile-cache archives (`dflash-launch cache export|import`): a tar
// (zstd, or gzip for .tar.gz/.tgz) written with libarchive, its first entry a
// manifest naming the torch version, the device kind, the READY keys and every
// file's size and SHA-256. Import checks the manifest against this machine,
// unpacks beside the cache, verifies every hash, and only then renames the
// files in, READY markers last.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace dflash {

struct ArchiveFacts {
  std::string torch_version;  // what the cache was built with (this machine's, for import)
  std::string device;         // "cpu" or "cuda"
};

/// Writes `file` (atomically: temp + rename) from the cache in `dir`.
/// REQUIRES: the caller holds the cache's gate (no leader is writing).
bool ExportCache(const std::string& dir, const std::string& file, const ArchiveFacts& facts,
                 nlohmann::json* manifest, std::string* err);

enum class ImportResult { kOk, kMismatch, kCorrupt, kIo };

/// Reads the manifest of `file` only (no unpacking).
bool ReadArchiveManifest(const std::string& file, nlohmann::json* manifest, std::string* err);

/// Unpacks `file` into `dir`. The manifest must match `here` (torch version,
/// device) unless `force`; a mismatch or a corrupted archive leaves the cache
/// untouched. REQUIRES: the caller holds the cache's gate.
ImportResult ImportCache(const std::string& file, const std::string& dir, const ArchiveFacts& here, bool force,
                         nlohmann::json* manifest, std::string* err);

}  // namespace dflash
