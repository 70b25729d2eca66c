#include "launcher/plan/holder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "common/printable.h"
#include "common/secure_path.h"

namespace dflash {

HolderLockResult TryHolderLock(const std::string& path, const std::string& record, UniqueFd* out,
                               std::string* holder, unsigned mode, int* failed_errno) {
  int ignored = 0;
  int& failed = failed_errno ? *failed_errno : ignored;
  bool writable = true;
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd && errno == EACCES) {  // another user's lock file: reading is enough to lock it
    writable = false;
    fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  }
  if (!fd) {
    failed = errno;
    *holder = ErrnoMessage("open(" + path + ")", errno);
    return HolderLockResult::kFailed;
  }
  int rc;
  do {
    rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno != EWOULDBLOCK) {
      failed = errno;
      *holder = ErrnoMessage("flock(" + path + ")", errno);
      return HolderLockResult::kFailed;
    }
    char buf[512];
    ssize_t n = ::pread(fd.get(), buf, sizeof buf - 1, 0);
    std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    // Whoever made the file wrote these bytes (in the shared port lock dir, any local user): they reach the
    // terminal as text, never as escape sequences, and a file that is not ours says whose it is.
    struct stat st {};
    std::string whose;
    if (::fstat(fd.get(), &st) == 0 && st.st_uid != ::geteuid())
      whose = " (its lock file " + path + " is " + UserNameOf(st.st_uid) + "'s, uid " + std::to_string(st.st_uid) + ")";
    *holder = text.empty() ? "another dflash-launch that has not written its name yet (" + path + ")" + whose
                           : Printable(text) + whose;
    return HolderLockResult::kHeld;
  }
  if (writable) {
    // Ours now: the previous holder's record (if it died) is replaced, not appended to.
    std::string line = record + "\n";
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), line.data(), line.size(), 0) < 0) {
      failed = errno;
      *holder = ErrnoMessage("write(" + path + ")", errno);
      return HolderLockResult::kFailed;
    }
  }
  *out = std::move(fd);
  return HolderLockResult::kAcquired;
}

std::string HolderRecord(const std::string& what) {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  char stamp[64];
  std::time_t t = std::time(nullptr);
  struct tm tm {};
  ::gmtime_r(&t, &tm);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return "dflash-launch pid " + std::to_string(::getpid()) + " on host " + host + ", " + what + ", since " + stamp;
}

}  // namespace dflash
