// Where a gate lives on disk and in /dev/shm, and the checks that make it safe to trust.
#pragma once

#include <string>

namespace dflash {

/// Every path of one gate. The file lock, holder record and READY markers sit
/// in the cache dir (shared by all hosts that mount it); the named mutex and
/// its owner record are host-local, in /dev/shm, named per user and per
/// canonical dir so that two mounts of one dir on one host share one mutex.
struct GateLayout {
  std::string dir;               ///< canonical cache dir
  std::string meta_dir;          ///< <dir>/.dflash
  std::string ready_dir;         ///< <dir>/.dflash/ready
  std::string lock_path;         ///< <dir>/.dflash/gate.lock   level (b), the authority
  std::string holder_path;       ///< <dir>/.dflash/holder.json who holds level (b)
  std::string local_name;        ///< "dflash-<uid>-<16 hex>": the Boost named_mutex name
  std::string local_sem_path;    ///< /dev/shm/sem.<local_name>  level (a)
  std::string local_owner_path;  ///< /dev/shm/<local_name>.owner who holds level (a)

  std::string ReadyPath(const std::string& key) const;
};

/// Fills `out` for `dir` (which must exist) without creating anything.
bool LocateGate(const std::string& dir, GateLayout* out, std::string* err);

/// Refuses a cache dir reached through another user's symlink or below a
/// directory others could swap it in (CheckSecurePath); creates the cache dir,
/// `.dflash/` and `.dflash/ready/` where missing (0700); then refuses any of
/// them that another user could write to or that belongs to another user, and
/// any entry of the tree Inductor reads (sub-dirs, kernels, READY markers) that
/// is a symlink, another user's, or writable by others (CheckPrivateTree):
/// whoever can write there can plant pickles and .so files, or forge READY
/// markers and make every drafter trust a cache it never compiled. The error
/// names the reason and the exact `chmod`/`chown`/`rm` that fixes it.
bool PrepareGateDir(const std::string& dir, GateLayout* out, std::string* err);

/// The ownership/mode check alone, for one existing directory.
bool CheckPrivateDir(const std::string& path, std::string* err);

/// Reads a READY marker only if it can be trusted: a regular file (never a
/// symlink: opened O_NOFOLLOW), ours, not writable by others. False with the
/// reason otherwise ("absent" for ENOENT); an untrusted marker counts as absent.
bool ReadTrustedMarker(const std::string& path, std::string* text, std::string* err);

}  // namespace dflash
