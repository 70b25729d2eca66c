// What export (cache_archive.cc) and import (cache_import.cc) share: libarchive
// handles, the manifest entry, and the one buffer size every byte streams through.
#pragma once

#include <archive.h>
#include <archive_entry.h>

#include <cstddef>
#include <memory>
#include <string>

#include "cachelock/cache_manifest.h"

namespace dflash {

constexpr const char* kManifestName = "manifest.json";
/// Every file's bytes pass through one buffer of this size, in either direction.
constexpr size_t kArchiveChunk = 256 * 1024;

using ArchiveReader = std::unique_ptr<archive, int (*)(archive*)>;
using ArchivePtrW = std::unique_ptr<archive, int (*)(archive*)>;

/// A tar reader of `file` (any compression libarchive knows). Null with `err`.
ArchiveReader OpenArchiveForRead(const std::string& file, std::string* err);

/// Reads the first entry (must be manifest.json, at most 64 MiB) and type-checks it.
/// Reads the first entry, the manifest (`text`, if given, gets its exact bytes: what is signed).
bool ReadManifestEntry(archive* a, const std::string& file, CacheManifest* manifest, std::string* err,
                       std::string* text = nullptr);

/// Reads the next header; if it is the signature entry (archive_key.h), its value into `signature`
/// (`*signed_` true). `*pending` is the first content entry's header, still to be read (null: the
/// archive has no more entries). False: the archive is corrupt (`err`).
bool ReadSignatureEntry(archive* a, const std::string& file, std::string* signature, bool* signed_,
                        archive_entry** pending, std::string* err);

}  // namespace dflash
