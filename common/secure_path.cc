#include "common/secure_path.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/fd.h"
#include "common/split.h"

namespace dflash {

std::string FormatMode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

namespace {

std::string Who(const struct stat& st) {
  return UserNameOf(st.st_uid) + " (uid " + std::to_string(st.st_uid) + ")";
}

std::string Me() {
  uid_t me = ::geteuid();
  return UserNameOf(me) + ", uid " + std::to_string(me);
}

const char* Writers(mode_t m) {
  return (m & S_IWGRP) && (m & S_IWOTH) ? "group and others" : (m & S_IWGRP) ? "its group" : "others";
}

/// Whether `path` carries a POSIX access ACL: then its group bits are the ACL's mask, and named users
/// and groups may write through it whatever its owning group is.
bool HasAccessAcl(const std::string& path) {
  return ::lgetxattr(path.c_str(), "system.posix_acl_access", nullptr, 0) > 0;
}

/// Write bits that let someone else in: others always; the group unless it is provably our private
/// group (GroupWritersBesidesMe) and no ACL names anyone else.
bool OthersCanWrite(const std::string& path, const struct stat& st) {
  if (st.st_mode & S_IWOTH) return true;
  if (!(st.st_mode & S_IWGRP)) return false;
  return HasAccessAcl(path) || !GroupWritersBesidesMe(st.st_gid).empty();
}

/// "mode 0770; alice (uid 1001) has root as primary group": the mode, and who else the group bit lets in
/// when the group alone can write (with others, that says enough).
std::string ModeAndWho(const std::string& path, const struct stat& st) {
  std::string out = "mode " + FormatMode(st.st_mode);
  if (!(st.st_mode & S_IWGRP) || (st.st_mode & S_IWOTH)) return out;
  std::string who = HasAccessAcl(path) ? "and the users and groups its ACL names (getfacl " + path + ")"
                                       : GroupWritersBesidesMe(st.st_gid);
  return who.empty() ? out : out + "; " + who;
}

/// A path's components, without the empty ones of "//" or a leading or trailing "/".
std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts = SplitOn(path, '/');
  parts.erase(std::remove(parts.begin(), parts.end(), std::string()), parts.end());
  return parts;
}

std::string Parent(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
}

std::string Join(const std::string& dir, const std::string& name) { return dir == "/" ? "/" + name : dir + "/" + name; }

}  // namespace

std::string UserNameOf(uid_t uid) {
  struct passwd pw {};
  struct passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) return found->pw_name;
  return std::to_string(uid);
}

namespace {

std::string AskWhoElseIsInGroup(gid_t gid);

}  // namespace

std::string GroupWritersBesidesMe(gid_t gid) {
  // Asked once per group and user: a cache tree of a umask-002 user has thousands of group-writable entries,
  // and each answer enumerates every passwd entry (which NSS may fetch from a directory service).
  static std::mutex mu;
  static std::map<std::pair<uid_t, gid_t>, std::string> known;
  const auto key = std::make_pair(::geteuid(), gid);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  std::string who = AskWhoElseIsInGroup(gid);
  std::lock_guard<std::mutex> lock(mu);
  return known.emplace(key, who).first->second;
}

namespace {

std::string AskWhoElseIsInGroup(gid_t gid) {
  const uid_t uid = ::geteuid();
  const std::string gname = "group " + std::to_string(gid);
  struct passwd pw {};
  struct passwd* me = nullptr;
  char pbuf[1024];
  if (::getpwuid_r(uid, &pw, pbuf, sizeof pbuf, &me) != 0 || !me) return "you have no passwd entry to compare";
  struct group gr {};
  struct group* g = nullptr;
  std::vector<char> gbuf(16384);
  if (::getgrgid_r(gid, &gr, gbuf.data(), gbuf.size(), &g) != 0 || !g) return gname + " has no group entry";
  const std::string my_name = me->pw_name;
  const gid_t my_gid = me->pw_gid;
  const std::string group_name = g->gr_name;
  bool listed_me = false;
  for (char** m = g->gr_mem; m && *m; ++m) {
    if (std::string(*m) != my_name) return std::string(*m) + " is a member of " + group_name;
    listed_me = true;
  }
  // Members by primary group are not listed in /etc/group: every passwd entry is asked (getpwent enumerates
  // what NSS will; a directory service that does not enumerate is not seen, so a group must also be ours).
  // An entry that does not fit, or NSS failing, must not read as the end of the list (that would pass the group):
  // a longer buffer for the one, a refusal for the other. The cursor is the process's: one walk at a time.
  static std::mutex walk;
  std::lock_guard<std::mutex> one_walk(walk);
  std::string other;
  ::setpwent();
  struct passwd e {};
  struct passwd* found = nullptr;
  std::vector<char> ebuf(1024);
  int rc = 0;
  while (other.empty()) {
    rc = ::getpwent_r(&e, ebuf.data(), ebuf.size(), &found);
    if (rc == ERANGE && ebuf.size() < (1u << 20)) {
      ebuf.resize(ebuf.size() * 2);  // glibc reads the same entry again
      continue;
    }
    if (rc != 0 || !found) break;
    if (found->pw_gid == gid && found->pw_uid != uid)
      other = std::string(found->pw_name) + " (uid " + std::to_string(found->pw_uid) + ") has " + group_name +
              " as primary group";
  }
  ::endpwent();
  if (!other.empty()) return other;
  if (rc != 0 && rc != ENOENT)
    return "the users whose primary group is " + group_name + " cannot be listed (" + std::strerror(rc) + ")";
  // pam_umask's usergroups, the reason a umask of 002 is safe, never applies to root: root's files have no
  // private group, and a group-write bit on them is someone else's way in.
  if (uid == 0) return "you are root, and root has no user private group (pam_umask: usergroups skips root)";
  if (listed_me || (gid == my_gid && group_name == my_name)) return "";
  return group_name + " is not your user private group";
}

}  // namespace

bool GroupIsOnlyMe(gid_t gid) { return GroupWritersBesidesMe(gid).empty(); }

bool CheckSecurePath(const std::string& path, std::string* err) { return CheckSecurePath(path, PathUse{}, err); }

bool CheckSecurePath(const std::string& path, const PathUse& use, std::string* err) {
  if (path.empty()) {
    *err = "the " + use.what + " is empty";
    return false;
  }
  std::string abs = path;
  if (abs[0] != '/') {
    char cwd[PATH_MAX];
    if (!::getcwd(cwd, sizeof cwd)) {
      *err = ErrnoMessage("getcwd", errno);
      return false;
    }
    abs = std::string(cwd) + "/" + path;
  }
  const uid_t me = ::geteuid();
  std::deque<std::string> todo;
  for (auto& p : Split(abs)) todo.push_back(std::move(p));
  std::string cur = "/";
  int links = 0;
  auto refuse = [&](const std::string& why) {
    *err = "refusing " + use.what + " " + path + ": " + why;
    return false;
  };
  struct stat st {};
  if (::lstat("/", &st) != 0) return refuse(ErrnoMessage("lstat(/)", errno));
  while (!todo.empty()) {
    std::string comp = todo.front();
    todo.pop_front();
    if (comp == ".") continue;
    if (comp == "..") {
      cur = Parent(cur);
      continue;
    }
    // `cur` is a real directory that passed; before descending, its writers must be only us or root.
    if (::lstat(cur.c_str(), &st) != 0) return refuse(ErrnoMessage("lstat(" + cur + ")", errno));
    if (st.st_uid != me && st.st_uid != 0)
      return refuse(cur + " is owned by " + Who(st) + ", who could replace " + comp +
                    " with a link of their own; fix: use a directory whose every parent is yours or root's (or chown " +
                    std::to_string(me) + " " + cur + ")");
    if (OthersCanWrite(cur, st) && !(st.st_mode & S_ISVTX))
      return refuse(cur + " is writable by " + Writers(st.st_mode) + " (" + ModeAndWho(cur, st) +
                    ", not sticky), who could swap " + comp + " for a link of their own; fix: chmod go-w " + cur);
    std::string next = Join(cur, comp);
    if (::lstat(next.c_str(), &st) != 0) {
      if (errno == ENOENT) return true;  // the rest is created by us, 0700, under a parent only we can write
      return refuse(ErrnoMessage("lstat(" + next + ")", errno));
    }
    if (S_ISLNK(st.st_mode)) {
      if (st.st_uid != me && st.st_uid != 0)
        return refuse("it is reached through the symlink " + next + " owned by " + Who(st) +
                      ", not by you or root: its owner decides where it leads; fix: use the real path, or remove the "
                      "link (rm " + next + ")");
      if (++links > 40) return refuse("too many levels of symbolic links at " + next);
      char target[PATH_MAX];
      ssize_t n = ::readlink(next.c_str(), target, sizeof target - 1);
      if (n < 0) return refuse(ErrnoMessage("readlink(" + next + ")", errno));
      target[n] = '\0';
      std::vector<std::string> parts = Split(target);
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) todo.push_front(*it);
      if (target[0] == '/') cur = "/";
      continue;
    }
    if (!S_ISDIR(st.st_mode)) return refuse(next + " is not a directory");
    cur = next;
  }
  // The directory itself: ours, and nobody else's to write (or, for a shared
  // parent, held to the rule of the directories above: we only add our own entry).
  if (::lstat(cur.c_str(), &st) != 0) return refuse(ErrnoMessage("lstat(" + cur + ")", errno));
  if (use.shared_parent) {
    if (st.st_uid != me && st.st_uid != 0)
      return refuse("it is owned by " + Who(st) + ", not by you or root, who could replace what we make in it; "
                    "fix: use a directory of your own (or chown " + std::to_string(me) + " " + cur + ")");
    if (OthersCanWrite(cur, st) && !(st.st_mode & S_ISVTX))
      return refuse("it is writable by " + std::string(Writers(st.st_mode)) + " (" + ModeAndWho(cur, st) +
                    ", not sticky), who could swap what we make in it for a link of their own; fix: chmod go-w " +
                    cur + " (or chmod +t " + cur + " for a shared one)");
    return true;
  }
  if (st.st_uid != me)
    return refuse("it is owned by " + Who(st) + ", not by you (" + Me() + "); " + use.harm + "; fix: chown " +
                  std::to_string(me) + " " + cur + " (or use a directory of your own)");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return refuse("it is writable by " + std::string(Writers(st.st_mode)) + " (mode " + FormatMode(st.st_mode) +
                  "): " + use.harm + "; fix: chmod go-w " + cur);
  return true;
}

bool WalkTree(const std::string& dir, const std::function<bool(const std::string&, const struct stat&)>& visit,
              std::string* err) {
  UniqueFd root(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!root) {
    *err = ErrnoMessage("open(" + dir + ")", errno);
    return false;
  }
  // One open directory per level: a deep tree costs fds only as deep as it is.
  std::function<bool(int, const std::string&)> walk = [&](int dfd, const std::string& prefix) -> bool {
    int fd = ::dup(dfd);
    if (fd < 0) {
      *err = ErrnoMessage("dup", errno);
      return false;
    }
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    std::unique_ptr<DIR, int (*)(DIR*)> d(::fdopendir(fd), ::closedir);
    if (!d) {
      ::close(fd);
      *err = ErrnoMessage("opendir(" + dir + "/" + prefix + ")", errno);
      return false;
    }
    while (struct dirent* e = ::readdir(d.get())) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st {};
      if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
      std::string rel = prefix.empty() ? name : prefix + "/" + name;
      if (!visit(rel, st) || !S_ISDIR(st.st_mode)) continue;
      UniqueFd sub(::openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
      if (!sub) {
        if (errno == ENOENT) continue;
        *err = ErrnoMessage("open(" + dir + "/" + rel + ")", errno);
        return false;
      }
      if (!walk(sub.get(), rel)) return false;
    }
    return true;
  };
  return walk(root.get(), "");
}

bool CheckPrivateTree(const std::string& dir, const std::function<bool(const std::string&)>& covers,
                      std::string* err) {
  const uid_t me = ::geteuid();
  std::string first, fix;
  uint64_t bad = 0;
  auto flag = [&](const std::string& rel, std::string why, std::string how) {
    if (bad++ == 0) {
      first = dir + "/" + rel + " " + why;
      fix = std::move(how);
    }
  };
  bool ok = WalkTree(dir, [&](const std::string& rel, const struct stat& st) {
    if (!covers(rel)) return false;
    std::string path = dir + "/" + rel;
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = ::readlinkat(AT_FDCWD, path.c_str(), target, sizeof target - 1);
      std::string to = n >= 0 ? std::string(target, static_cast<size_t>(n)) : "?";
      flag(rel, "is a symlink (to " + to + "): Inductor would follow it out of the cache", "rm " + path);
      return false;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
      flag(rel, "is neither a file nor a directory", "rm " + path);
      return false;
    }
    if (st.st_uid != me) {
      flag(rel, "is owned by " + Who(st) + ", not by you (" + Me() + "): Inductor would load what they wrote",
           "chown -R " + std::to_string(me) + " " + path + " (or rm -r it)");
      return S_ISDIR(st.st_mode);
    }
    if (OthersCanWrite(path, st)) {
      flag(rel, "is writable by " + std::string(Writers(st.st_mode)) + " (" + ModeAndWho(path, st) +
                    "): they could plant code Inductor loads",
           "chmod -R go-w " + dir);
    }
    return true;
  }, err);
  if (!ok) return false;
  if (bad == 0) return true;
  *err = "refusing cache dir " + dir + ": " + first +
         (bad > 1 ? " (and " + std::to_string(bad - 1) + " more entries like it)" : "") + "; fix: " + fix;
  return false;
}

int OpenBeneath(int dirfd, const std::string& rel, int flags, mode_t mode) {
  std::vector<std::string> parts = Split(rel);
  if (parts.empty() || rel[0] == '/') {
    errno = EINVAL;
    return -1;
  }
  for (const std::string& p : parts)
    if (p == "." || p == "..") {
      errno = EINVAL;
      return -1;
    }
  UniqueFd cur;
  int at = dirfd;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int fd = ::openat(at, parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    cur.reset(fd);
    at = cur.get();
  }
  return ::openat(at, parts.back().c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

bool MakeDirsBeneath(int dirfd, const std::string& rel, std::vector<std::string>* created, std::string* err) {
  std::string sofar;
  for (const std::string& p : Split(rel)) {
    if (p == "." || p == "..") {
      *err = "refusing the path " + rel;
      return false;
    }
    sofar = sofar.empty() ? p : sofar + "/" + p;
    int rc = -1;
    {
      // mkdirat through a parent opened without following links.
      size_t slash = sofar.find_last_of('/');
      UniqueFd parent(slash == std::string::npos ? ::dup(dirfd)
                                                  : OpenBeneath(dirfd, sofar.substr(0, slash), O_RDONLY | O_DIRECTORY));
      if (!parent) {
        *err = ErrnoMessage("open(" + sofar.substr(0, slash) + ")", errno);
        return false;
      }
      std::string leaf = slash == std::string::npos ? sofar : sofar.substr(slash + 1);
      rc = ::mkdirat(parent.get(), leaf.c_str(), 0700);
      if (rc != 0 && errno != EEXIST) {
        *err = ErrnoMessage("mkdir(" + sofar + ")", errno);
        return false;
      }
      struct stat st {};
      if (::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) {
        *err = sofar + " is not a directory (a symlink?)";
        return false;
      }
    }
    if (rc == 0 && created) created->push_back(sofar);
  }
  return true;
}

bool RemoveTreeAt(int dirfd, const std::string& name, uint64_t* files, std::string* err) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return true;
    *err = ErrnoMessage("lstat(" + name + ")", errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) {
      *err = ErrnoMessage("unlink(" + name + ")", errno);
      return false;
    }
    ++*files;
    return true;
  }
  UniqueFd sub(::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!sub) {
    *err = ErrnoMessage("open(" + name + ")", errno);
    return false;
  }
  std::vector<std::string> names;
  {
    int fd = ::dup(sub.get());
    std::unique_ptr<DIR, int (*)(DIR*)> d(fd >= 0 ? ::fdopendir(fd) : nullptr, ::closedir);
    if (!d) {
      if (fd >= 0) ::close(fd);
      *err = ErrnoMessage("opendir(" + name + ")", errno);
      return false;
    }
    while (struct dirent* e = ::readdir(d.get())) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
  }
  for (const std::string& n : names)
    if (!RemoveTreeAt(sub.get(), n, files, err)) return false;
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    *err = ErrnoMessage("rmdir(" + name + ")", errno);
    return false;
  }
  return true;
}

}  // namespace dflash
