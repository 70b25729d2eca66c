// Who vouches for a cache archive. An archive is code: its kernels are shared
// objects Inductor dlopens, its FX-graph, AOTAutograd and precompile entries are
// pickles it unpickles, its Python wrappers are imported; whoever wrote one runs
// code in every process that loads the cache. So `cache export` signs what it
// writes with the exporting user's own key, and `cache import` takes only an
// archive signed with the importing user's key, unless the user vouches for it
// (`--trust`). The cluster-wide gate has its own signature (the run's secret,
// cachelock/cluster_lease.h) and vouches for its archives itself.
#pragma once

#include <string>
#include <string_view>

namespace dflash {

/// The signature entry, right after manifest.json: HMAC-SHA256 of the manifest's
/// exact bytes, which name every file's size and SHA-256 (each checked on import).
inline constexpr const char* kSignatureName = "manifest.sig";

/// What an import is told to trust.
struct ArchiveTrust {
  std::string key;       ///< the importing user's archive key: a signature under it is trusted
  bool vouched = false;  ///< the caller vouches for the archive (--trust; the cluster gate after its own check)
};

/// $DFLASH_ARCHIVE_KEY, else $XDG_CONFIG_HOME/dflash/archive.key, else ~/.config/dflash/archive.key.
std::string ArchiveKeyPath();

/// Reads the user's archive key (a 0600 file of theirs, one line). `create`: makes one (32 random
/// bytes in hex, 0600, its dir 0700; O_EXCL, so two exports at once agree) if there is none.
/// False with `err` if it cannot be read (or, without `create`, does not exist).
bool LoadArchiveKey(bool create, std::string* key, std::string* err);

/// The signature of a manifest's bytes under `key` (64 hex digits).
std::string SignManifest(std::string_view key, std::string_view manifest_text);

/// Whether the archive may be imported: vouched for, or `signature` is the manifest's under
/// `trust.key`. False: `err` says why (unsigned, signed with another key, no key) and how to vouch.
bool ArchiveTrusted(const ArchiveTrust& trust, std::string_view manifest_text, const std::string& signature,
                    bool has_signature, std::string* err);

}  // namespace dflash
