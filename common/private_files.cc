#include "common/private_files.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

namespace dflash {
namespace {

std::vector<std::string> PathComponents(const std::string& abs) {
  std::vector<std::string> parts;
  for (const auto& p : std::filesystem::path(abs)) {
    std::string s = p.string();
    if (!s.empty() && s != "/") parts.push_back(s);
  }
  return parts;
}

std::string Prefix(const std::vector<std::string>& parts, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += "/" + parts[i];
  return s.empty() ? "/" : s;
}

/// Sets what we created to the asked mode (the umask took bits away) and group.
bool Own(int fd, mode_t mode, const FileMode& m, const std::string& path, std::string* err) {
  if (m.group != static_cast<gid_t>(-1) && ::fchown(fd, static_cast<uid_t>(-1), m.group) != 0) {
    *err = ErrnoMessage("chgrp " + std::to_string(m.group) + " " + path, errno);
    return false;
  }
  if (::fchmod(fd, mode) != 0) {
    *err = ErrnoMessage("chmod " + FormatMode(mode) + " " + path, errno);
    return false;
  }
  return true;
}

std::string Owner(const struct stat& st) { return UserNameOf(st.st_uid) + " (uid " + std::to_string(st.st_uid) + ")"; }

}  // namespace

PathUse RunDirUse() {
  PathUse u;
  u.what = "run dir";
  u.harm = "they could read the run's output, or turn what it writes into writes to files of their choosing";
  return u;
}

bool MakePrivateDir(const std::string& dir, const FileMode& m, const PathUse& use, UniqueFd* out, std::string* err,
                    bool* created) {
  if (created) *created = false;
  if (!CheckSecurePath(dir, use, err)) return false;
  std::error_code ec;
  std::string abs = std::filesystem::absolute(dir, ec).lexically_normal().string();
  if (ec) {
    *err = "refusing " + use.what + " " + dir + ": " + ec.message();
    return false;
  }
  while (abs.size() > 1 && abs.back() == '/') abs.pop_back();
  const std::vector<std::string> parts = PathComponents(abs);
  // The deepest part that exists: checked above (its links are ours or root's,
  // its parents writable by nobody else unless sticky), so opened by path.
  size_t have = parts.size();
  struct stat st {};
  while (have > 0 && ::stat(Prefix(parts, have).c_str(), &st) != 0) --have;
  UniqueFd cur(::open(Prefix(parts, have).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!cur) {
    *err = ErrnoMessage("open(" + Prefix(parts, have) + ")", errno);
    return false;
  }
  const uid_t me = ::geteuid();
  bool made = false;
  for (size_t i = have; i < parts.size(); ++i) {
    const std::string path = Prefix(parts, i + 1);
    made = ::mkdirat(cur.get(), parts[i].c_str(), 0700) == 0;
    if (!made && errno != EEXIST) {
      *err = ErrnoMessage("mkdir(" + path + ")", errno);
      return false;
    }
    UniqueFd next(::openat(cur.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) {
      *err = "refusing " + use.what + " " + dir + ": " + path + " appeared as a symlink or a non-directory while " +
             "we made it (another user racing us?); fix: remove it (rm " + path + ")";
      return false;
    }
    if (::fstat(next.get(), &st) != 0) {
      *err = ErrnoMessage("fstat(" + path + ")", errno);
      return false;
    }
    if (st.st_uid != me) {
      *err = "refusing " + use.what + " " + dir + ": " + path + " was made by " + Owner(st) +
             " while we made it; fix: remove it and run again";
      return false;
    }
    if (made && !Own(next.get(), m.dir, m, path, err)) return false;
    cur = std::move(next);
  }
  // What we hand out: the directory behind the fd, checked again (the walk above
  // was by path; this is the one we write beneath).
  if (::fstat(cur.get(), &st) != 0) {
    *err = ErrnoMessage("fstat(" + abs + ")", errno);
    return false;
  }
  if (!use.shared_parent && (st.st_uid != me || (st.st_mode & (S_IWGRP | S_IWOTH)))) {
    *err = "refusing " + use.what + " " + dir + ": it is owned by " + Owner(st) + ", mode " + FormatMode(st.st_mode) +
           "; " + use.harm + "; fix: use a directory of your own, writable by you alone";
    return false;
  }
  if (created) *created = made;
  if (out) *out = std::move(cur);
  return true;
}

int OpenPrivateFileAt(int dirfd, const std::string& name, int flags, const FileMode& m, std::string* err) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    *err = "refusing the file name '" + name + "'";
    return -1;
  }
  // Never truncate before we know whose file it is; never block on a planted FIFO.
  const bool trunc = flags & O_TRUNC;
  const int base = (flags & ~(O_TRUNC | O_CREAT | O_EXCL)) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK;
  UniqueFd fd(::openat(dirfd, name.c_str(), base | O_CREAT | O_EXCL, m.file));
  const bool made = static_cast<bool>(fd);
  if (!fd && errno == EEXIST && !(flags & O_EXCL)) fd.reset(::openat(dirfd, name.c_str(), base));
  if (!fd) {
    int e = errno;
    struct stat st {};
    if ((e == ELOOP || e == ENXIO || e == EEXIST) && ::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      const char* kind = S_ISLNK(st.st_mode) ? "a symlink" : S_ISREG(st.st_mode) ? "already there" : "not a file";
      *err = "refusing to write " + name + ": it is " + kind + " (owner " + Owner(st) +
             "); nothing of ours is written through it; fix: remove it";
    } else {
      *err = ErrnoMessage("open(" + name + ")", e);
    }
    return -1;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    *err = ErrnoMessage("fstat(" + name + ")", errno);
    return -1;
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1) {
    *err = "refusing to write " + name + ": it is " +
           (!S_ISREG(st.st_mode) ? std::string("not a regular file")
            : st.st_uid != ::geteuid() ? "owned by " + Owner(st)
                                       : "a hard link (" + std::to_string(st.st_nlink) + " names)") +
           "; fix: remove it";
    return -1;
  }
  if (made && !Own(fd.get(), m.file, m, name, err)) return -1;
  int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl >= 0) ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  if (trunc && ::ftruncate(fd.get(), 0) != 0) {
    *err = ErrnoMessage("truncate(" + name + ")", errno);
    return -1;
  }
  return fd.release();
}

int OpenPrivateFile(const std::string& path, int flags, const FileMode& m, const PathUse& use, std::string* err) {
  std::filesystem::path p(path);
  UniqueFd dir;
  if (!MakePrivateDir(p.parent_path().empty() ? "." : p.parent_path().string(), m, use, &dir, err)) return -1;
  int fd = OpenPrivateFileAt(dir.get(), p.filename().string(), flags, m, err);
  if (fd < 0) *err = path + ": " + *err;
  return fd;
}

bool WritePrivateFileAtomic(const std::string& path, std::string_view data, const FileMode& m, const PathUse& use,
                            std::string* err) {
  std::filesystem::path p(path);
  UniqueFd dir;
  if (!MakePrivateDir(p.parent_path().empty() ? "." : p.parent_path().string(), m, use, &dir, err)) return false;
  const std::string name = p.filename().string();
  const std::string tmp = "." + name + ".tmp." + std::to_string(::getpid());
  ::unlinkat(dir.get(), tmp.c_str(), 0);  // a crashed writer's, with our pid: the dir is ours alone
  UniqueFd fd(OpenPrivateFileAt(dir.get(), tmp, O_WRONLY | O_EXCL, m, err));
  if (!fd) return false;
  bool ok = WriteAll(fd.get(), data, err);
  if (ok && ::fsync(fd.get()) != 0) {
    *err = ErrnoMessage("fsync(" + path + ")", errno);
    ok = false;
  }
  fd.reset();
  if (ok && ::renameat(dir.get(), tmp.c_str(), dir.get(), name.c_str()) != 0) {
    *err = ErrnoMessage("rename(" + path + ")", errno);
    ok = false;
  }
  if (!ok) {
    ::unlinkat(dir.get(), tmp.c_str(), 0);
    return false;
  }
  ::fsync(dir.get());
  return true;
}

}  // namespace dflash
