#include "cachelock/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "cachelock/fork_guard.h"

namespace dflash {

RecordFile::~RecordFile() {
  if (fd_) UnguardFd(fd_.get());
}

bool RecordFile::Open(const std::string& path, std::string* err) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    *err = ErrnoMessage("open(" + path + ")", errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    *err = ErrnoMessage("fstat(" + path + ")", errno);
    return false;
  }
  if (st.st_uid != ::geteuid() || !S_ISREG(st.st_mode)) {
    *err = fmt::format("refusing {}: owned by uid {}, not by you (uid {}), or not a regular file; "
                       "fix: remove it as its owner (rm {})",
                       path, st.st_uid, ::geteuid(), path);
    return false;
  }
  if (fd_) UnguardFd(fd_.get());
  fd_ = std::move(fd);
  path_ = path;
  GuardFdAcrossFork(fd_.get());
  return true;
}

bool RecordFile::Write(const std::string& text, std::string* err) {
  if (text.size() >= kSlotSize) {
    *err = fmt::format("record for {} is {} bytes, more than {}", path_, text.size(), kSlotSize - 1);
    return false;
  }
  std::string slot = text;
  slot.resize(kSlotSize - 1, ' ');
  slot.push_back('\n');
  ssize_t n;
  do {
    n = ::pwrite(fd_.get(), slot.data(), slot.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(slot.size())) {
    *err = n < 0 ? ErrnoMessage("pwrite(" + path_ + ")", errno) : "short write to " + path_;
    return false;
  }
  return true;
}

void RecordFile::Clear() {
  // A blank slot, not ftruncate: on ext4 freeing and reallocating the block on
  // every hand-off costs more than the lock itself. Best effort: a record left
  // behind is judged stale by its pid and start time.
  std::string err;
  Write("", &err);
}

std::string RecordFile::Read() const {
  std::string out(kSlotSize, '\0');
  ssize_t n;
  do {
    n = ::pread(fd_.get(), out.data(), out.size(), 0);
  } while (n < 0 && errno == EINTR);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

}  // namespace dflash
