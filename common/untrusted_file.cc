#include "common/untrusted_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "common/fd.h"
#include "common/human_bytes.h"
#include "common/secure_path.h"

namespace dflash {
namespace {

/// What a non-regular file is, as a reason: "a FIFO, not a regular file".
std::string KindOf(mode_t m) {
  const char* kind = S_ISFIFO(m)   ? "a FIFO"
                     : S_ISDIR(m)  ? "a directory"
                     : S_ISCHR(m)  ? "a character device"
                     : S_ISBLK(m)  ? "a block device"
                     : S_ISSOCK(m) ? "a socket"
                     : S_ISLNK(m)  ? "a symlink"
                                   : "not a file";
  return std::string(kind) + ", not a regular file";
}

/// Why an open() failed, looking at what is there without following or opening it.
std::string OpenFailure(const std::string& path, int e) {
  struct stat st {};
  if ((e == ELOOP || e == ENOTDIR || e == ENXIO) && ::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
      return "a symlink" + (n > 0 ? " to " + std::string(target, static_cast<size_t>(n)) : std::string()) +
             ": never followed";
    }
    if (!S_ISREG(st.st_mode)) return KindOf(st.st_mode);
  }
  if (e == ELOOP || e == ENOTDIR) return "a symlink on its way: never followed";
  return ErrnoMessage("open", e);
}

}  // namespace

UntrustedRead ReadUntrustedFile(const std::string& path, const UntrustedFileRules& rules, std::string* out,
                                std::string* why) {
  out->clear();
  // O_NONBLOCK: a FIFO opens at once (writer or not) and is then refused by its fstat, never read.
  const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (rules.follow_link ? 0 : O_NOFOLLOW);
  UniqueFd fd;
  const std::string& base = rules.beneath;
  if (!base.empty()) {
    if (path.size() <= base.size() + 1 || path.compare(0, base.size(), base) != 0 || path[base.size()] != '/') {
      *why = "not under " + base;
      return UntrustedRead::kUnreadable;
    }
    UniqueFd dir(::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir) fd.reset(OpenBeneath(dir.get(), path.substr(base.size() + 1), flags));
  } else {
    fd.reset(::open(path.c_str(), flags));
  }
  if (!fd) {
    int e = errno;
    if (e == ENOENT) return UntrustedRead::kAbsent;
    *why = OpenFailure(path, e);
    return UntrustedRead::kUnreadable;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    *why = ErrnoMessage("fstat", errno);
    return UntrustedRead::kUnreadable;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = KindOf(st.st_mode);
    return UntrustedRead::kUnreadable;
  }
  if (!rules.any_owner && st.st_uid != ::geteuid()) {
    *why = "owned by " + UserNameOf(st.st_uid) + " (uid " + std::to_string(st.st_uid) + "), not by this run's user";
    return UntrustedRead::kUnreadable;
  }
  const std::string cap = "more than the " + std::to_string(rules.limit) + " bytes read of it";
  if (static_cast<uint64_t>(st.st_size) > rules.limit) {
    *why = HumanBytes(static_cast<uint64_t>(st.st_size)) + ", " + cap;
    return UntrustedRead::kUnreadable;
  }
  std::string err;
  bool too_big = false;
  if (!ReadAllFrom(fd.get(), "the file", rules.limit, out, &err, &too_big)) {  // it may grow while we read
    *why = too_big ? "grew to " + cap : err;
    out->clear();
    return UntrustedRead::kUnreadable;
  }
  return UntrustedRead::kOk;
}

std::string Unreadable(const std::string& why) { return "unreadable (" + why + ")"; }

}  // namespace dflash
