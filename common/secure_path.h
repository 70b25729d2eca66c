// Who could change what a cache path means: the checks that keep another user
// from steering a root (or any) `cache clear/import/export`, or Inductor's
// loads, somewhere else. Modelled on OpenSSH's secure-path check (misc.c,
// safe_path): every component is lstat'ed, nothing is taken on a resolved path.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dflash {

/// Refuses `path` if anyone but us or root could make it lead somewhere else:
/// walking from `/`, every symlink on the way must be owned by us or root (its
/// owner decides where it points), every directory above the last must be owned
/// by us or root and not writable by group/others unless sticky (else its
/// writers could swap the next component), and the last directory must be ours
/// and not group/other-writable. Components that do not exist yet are fine (we
/// create them 0700). The error names the component and the fix.
bool CheckSecurePath(const std::string& path, std::string* err);

/// What a checked path is for: the words of its refusal, and how strict its
/// last directory is.
struct PathUse {
  std::string what = "cache dir";  ///< "refusing <what> <path>: ..."
  /// Why another owner (or writer) of the last directory matters.
  std::string harm = "they could plant code Inductor loads and forge READY markers";
  /// The last directory is only where we make our own (log_dir holds <run_id>/,
  /// spool_dir holds <run_id>/): it may be root's, or a sticky shared one, like
  /// any directory above.
  bool shared_parent = false;
};

/// CheckSecurePath for another kind of directory (logs, run dir, spool).
bool CheckSecurePath(const std::string& path, const PathUse& use, std::string* err);

/// Refuses a tree (under `dir`, never following a link) that holds anything
/// another user could have written and Inductor would load: a symlink, an entry
/// that is neither a file nor a directory, an entry owned by someone else, or one
/// writable by others (or by a group that is not our private group, or through
/// a POSIX ACL: a umask of 002 with a user private group is fine). The error names the first offender, how many more there are,
/// and the `chmod`/`chown`/`rm` that fixes them.
/// Only entries for which `covers(rel)` is true are checked (and descended into).
bool CheckPrivateTree(const std::string& dir, const std::function<bool(const std::string& rel)>& covers,
                      std::string* err);

/// Who besides us a group-write bit on a file of group `gid` lets in, as a
/// refusal says it ("alice (uid 1001) has root as primary group"), or "" when it
/// is our user private group: no other member listed in /etc/group, no other
/// user whose primary group it is (every passwd entry NSS enumerates), and named
/// after us or listing us. Never "" for root: a umask of 002 is pam_umask's
/// usergroups, which skips root, so a group-write bit on root's files is never
/// root's own doing. As OpenSSH's safe_path, plus the primary-group members it
/// does not count.
std::string GroupWritersBesidesMe(gid_t gid);
/// GroupWritersBesidesMe(gid).empty().
bool GroupIsOnlyMe(gid_t gid);

/// Opens `rel` (relative, no "." or ".." parts) beneath `dirfd`, refusing to
/// follow a symlink anywhere on the way (ELOOP/ENOTDIR). -1 with errno set.
/// `flags` gets O_NOFOLLOW | O_CLOEXEC added.
int OpenBeneath(int dirfd, const std::string& rel, int flags, mode_t mode = 0);

/// Creates the missing directories of `rel` beneath `dirfd` (0700), never
/// through a symlink. `created` (if given) gets each one made, outermost first.
bool MakeDirsBeneath(int dirfd, const std::string& rel, std::vector<std::string>* created, std::string* err);

/// Every entry under `dir` (lstat: links are reported, never followed), depth
/// first, directories before their contents. `visit(rel, st)` returns false to
/// skip a directory's contents. Entries that vanish mid-walk are skipped.
bool WalkTree(const std::string& dir, const std::function<bool(const std::string& rel, const struct stat& st)>& visit,
              std::string* err);

/// Removes `name` in `dirfd` and everything under it without following a link;
/// adds the number of non-directories removed to `*files`.
bool RemoveTreeAt(int dirfd, const std::string& name, uint64_t* files, std::string* err);

/// A mode's permission bits as people read them: "0755".
std::string FormatMode(mode_t m);

/// The user name of `uid` ("65534" if it has none).
std::string UserNameOf(uid_t uid);

}  // namespace dflash
