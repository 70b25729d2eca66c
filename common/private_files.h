// The files a run writes (its log dir, run dir, attempt dirs, logs, events,
// summary; the spool) made so that they are ours and private: never through a
// link or a directory someone else could swap, never into a file someone else
// planted, 0700/0600 unless a group was asked to read them. One helper for all:
// the same walk as the cache dir's (common/secure_path.h), then every new
// component made and opened beneath a verified directory fd, O_NOFOLLOW.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/fd.h"
#include "common/secure_path.h"

namespace dflash {

/// The modes of what we create. Private by default; with a group, dirs 0750 and
/// files 0640 owned by that group (a user shares a run's logs with it).
struct FileMode {
  mode_t dir = 0700;
  mode_t file = 0600;
  gid_t group = static_cast<gid_t>(-1);  ///< -1: our own

  static FileMode Private() { return {}; }
  static FileMode Group(gid_t g) { return {0750, 0640, g}; }
};

/// mkdir -p `dir` the safe way: the path passes CheckSecurePath(dir, use), every
/// missing component is made (with m.dir) and opened beneath its parent's fd
/// without following a link, and the last directory must be ours, a real
/// directory and writable by nobody else (else: refused, naming it and the fix).
/// `*out` (if given) gets its fd; `*created` whether we made the last one.
bool MakePrivateDir(const std::string& dir, const FileMode& m, const PathUse& use, UniqueFd* out,
                    std::string* err, bool* created = nullptr);

/// Opens `name` (one component, no '/') in the verified directory `dirfd` with
/// `flags` (O_CREAT is added) and O_NOFOLLOW: refused unless it ends up a regular
/// file of ours with a single link; a file we create gets m.file and m.group.
/// -1 and `*err` on refusal.
int OpenPrivateFileAt(int dirfd, const std::string& name, int flags, const FileMode& m, std::string* err);

/// MakePrivateDir of `path`'s directory, then OpenPrivateFileAt of its name.
/// `use` names the directory in a refusal ("run dir").
int OpenPrivateFile(const std::string& path, int flags, const FileMode& m, const PathUse& use, std::string* err);

/// WriteFileAtomic, privately: a temp file made O_EXCL in the verified directory,
/// then renamed over `path`'s name there.
bool WritePrivateFileAtomic(const std::string& path, std::string_view data, const FileMode& m, const PathUse& use,
                            std::string* err);

/// The PathUse of a run's own directories (<log_dir>/<run_id>, its attempt dirs).
PathUse RunDirUse();

}  // namespace dflash
