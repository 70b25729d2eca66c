// The manifest of a cache archive (`manifest.json`, its first entry): what was
// exported, with which torch, for which device, and every file's size and
// SHA-256. Parsed with every field type-checked: a manifest is input from
// whoever handed over the archive, and a wrong type must be a clear refusal,
// never an uncaught nlohmann::type_error (SIGABRT) in the middle of an import.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dflash {

struct ManifestFile {
  std::string path;    // relative, checked by the importer
  uint64_t size = 0;   // exact: an entry that is longer or shorter is refused
  std::string sha256;  // 64 lower-case hex digits
};

struct CacheManifest {
  static constexpr const char* kFormat = "dflash-cache/1";
  static constexpr size_t kMaxBytes = 64u << 20;  // 64 MiB: ~400k files; more is not a manifest

  std::string torch_version;
  std::string device;  // "cpu" or "cuda"
  std::string gpu;     // the GPU identity it was compiled for (ArchiveFacts::gpu); empty in older archives
  std::string cpu;     // the CPU identity it was compiled for (ArchiveFacts::cpu); empty in older archives
  std::string host;
  int64_t created = 0;
  nlohmann::json keys = nlohmann::json::array();  // the READY records, as exported
  std::vector<ManifestFile> files;

  uint64_t TotalBytes() const;
  std::string Encode() const;
};

/// Parses and type-checks `text`. False with an error that names the field,
/// what it should be and what it is: `"torch_version" must be a string, got number 5`.
bool ParseManifest(std::string_view text, CacheManifest* out, std::string* err);

}  // namespace dflash
