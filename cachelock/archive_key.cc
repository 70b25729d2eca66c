#include "cachelock/archive_key.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/fd.h"
#include "common/hash.h"
#include "common/private_files.h"
#include "store/store_auth.h"

namespace dflash {

std::string ArchiveKeyPath() {
  if (const char* p = std::getenv("DFLASH_ARCHIVE_KEY"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x == '/') return std::string(x) + "/dflash/archive.key";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/") + "/.config/dflash/archive.key";
}

bool LoadArchiveKey(bool create, std::string* key, std::string* err) {
  const std::string path = ArchiveKeyPath();
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) {
    if (!create) {
      *err = "you have no archive key (" + path + ": made by your first `cache export`)";
      return false;
    }
    const size_t slash = path.find_last_of('/');  // DFLASH_ARCHIVE_KEY may name a file here, or one in /
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    PathUse use;
    use.what = "archive key dir";
    use.harm = "they could replace the key that says which cache archives are yours";
    std::string secret;
    if (!MakePrivateDir(dir, FileMode::Private(), use, nullptr, err) || !RandomSecret(&secret, err)) return false;
    // O_EXCL, never unlink first: a key another export made meanwhile is the one, and is kept.
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd && !WriteAll(fd.get(), secret + "\n", err)) {
      ::unlink(path.c_str());
      return false;
    }
    if (!fd && errno != EEXIST) {
      *err = ErrnoMessage("create " + path, errno);
      return false;
    }
  }
  if (!ReadSecretFile(path, key, err)) {
    *err = "your archive key: " + *err;
    return false;
  }
  return true;
}

std::string SignManifest(std::string_view key, std::string_view manifest_text) {
  return HmacSha256Hex(key, "dflash-cache-archive/1\n" + std::string(manifest_text));
}

bool ArchiveTrusted(const ArchiveTrust& trust, std::string_view manifest_text, const std::string& signature,
                    bool has_signature, std::string* err) {
  if (trust.vouched) return true;
  const std::string vouch =
      "a cache archive is code (kernels Inductor loads, pickles it unpickles): import it only if you trust "
      "whoever made it, with --trust";
  if (!has_signature) {
    *err = "the archive is not signed (not made by `cache export` of this version, or its signature was removed); " +
           vouch;
    return false;
  }
  if (trust.key.empty()) {
    *err = "the archive is signed, but you have no archive key to check it with (" + ArchiveKeyPath() + "); " + vouch;
    return false;
  }
  if (!ConstantTimeEqual(signature, SignManifest(trust.key, manifest_text))) {
    *err = "the archive is not signed with your archive key (" + ArchiveKeyPath() +
           "): another user's or another machine's export, or changed since; " + vouch;
    return false;
  }
  return true;
}

}  // namespace dflash
