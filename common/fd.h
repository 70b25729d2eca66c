// Owned file descriptors and the few fd helpers every module needs.
#pragma once

#include <string>
#include <string_view>

namespace dflash {

/// Owns one file descriptor and closes it once. Every fd in this project is
/// opened O_CLOEXEC: a child must see nothing but what was given to it.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

/// Writes all of `data`, retrying on EINTR and short writes.
bool WriteAll(int fd, std::string_view data, std::string* err);

/// Reads a whole (small) file; false with `err` set if it cannot.
bool ReadFile(const std::string& path, std::string* out, std::string* err);

/// Reads `fd` to its end into `out`, retrying on EINTR; false with `err` (naming `what`) on a read error or
/// once more than `limit` bytes came (`*too_big` then true, if given): a file that should be small and is not.
bool ReadAllFrom(int fd, const std::string& what, size_t limit, std::string* out, std::string* err,
                 bool* too_big = nullptr);

/// Writes `data` to `path` atomically: temp file beside it, fsync, rename,
/// fsync of the directory. Readers see the old content or the new, never half.
bool WriteFileAtomic(const std::string& path, std::string_view data, std::string* err,
                     unsigned mode = 0644);

/// mkdir -p: creates the missing directories of `dir` with `mode` (existing
/// ones are left as they are).
bool MakeDirs(const std::string& dir, unsigned mode, std::string* err);

/// `strerror(errno)` with the call that failed: "open(/x): No such file or directory".
std::string ErrnoMessage(std::string_view what, int errnum);

}  // namespace dflash
