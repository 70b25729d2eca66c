#include "common/fd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

namespace dflash {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

int UniqueFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the fd is gone either way.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string ErrnoMessage(std::string_view what, int errnum) {
  return std::string(what) + ": " + std::strerror(errnum);
}

bool WriteAll(int fd, std::string_view data, std::string* err) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (err) *err = ErrnoMessage("write", errno);
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool ReadFile(const std::string& path, std::string* out, std::string* err) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (err) *err = ErrnoMessage("open(" + path + ")", errno);
    return false;
  }
  std::string ignored;
  return ReadAllFrom(fd.get(), path, SIZE_MAX, out, err ? err : &ignored);
}

bool ReadAllFrom(int fd, const std::string& what, size_t limit, std::string* out, std::string* err, bool* too_big) {
  out->clear();
  if (too_big) *too_big = false;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = ErrnoMessage("read(" + what + ")", errno);
      return false;
    }
    if (n == 0) return true;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > limit) {
      if (too_big) *too_big = true;
      *err = what + " is larger than " + std::to_string(limit) + " bytes";
      return false;
    }
  }
}

bool MakeDirs(const std::string& dir, unsigned mode, std::string* err) {
  std::filesystem::path cur;
  for (const auto& part : std::filesystem::path(dir)) {
    cur /= part;
    std::error_code ec;
    if (std::filesystem::is_directory(cur, ec)) continue;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
      if (err) *err = ErrnoMessage("mkdir(" + cur.string() + ")", errno);
      return false;
    }
  }
  return true;
}

bool WriteFileAtomic(const std::string& path, std::string_view data, std::string* err,
                     unsigned mode) {
  std::filesystem::path p(path);
  std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  std::string tmp = dir + "/." + p.filename().string() + ".tmp." + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd) {
    if (err) *err = ErrnoMessage("open(" + tmp + ")", errno);
    return false;
  }
  if (!WriteAll(fd.get(), data, err)) {
    ::unlink(tmp.c_str());
    return false;
  }
  if (::fsync(fd.get()) != 0) {
    if (err) *err = ErrnoMessage("fsync(" + tmp + ")", errno);
    ::unlink(tmp.c_str());
    return false;
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    if (err) *err = ErrnoMessage("rename(" + tmp + ")", errno);
    ::unlink(tmp.c_str());
    return false;
  }
  // The rename is durable only once the directory entry is.
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd) ::fsync(dfd.get());
  return true;
}

}  // namespace dflash
