#include "spool/spool_ring.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc >= 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>

#include "common/fd.h"

namespace dflash::spool {
namespace {

bool Finished(const SpoolPaths& paths, const std::string& producer) {
  struct stat st {};
  return ::stat(paths.EndMarker(producer).c_str(), &st) == 0;
}

}  // namespace

void EmptyFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  // A second name's bytes are not ours to drop.
  if (fd && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) (void)::ftruncate(fd.get(), 0);
}

void TruncateFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
}

void DropFile(const std::string& path) {
  EmptyFile(path);
  ::unlink(path.c_str());
}

bool RingEnabled() {
  const char* v = std::getenv("DFLASH_SPOOL_RING");
  return !(v && std::string(v) == "0");
}

namespace {

/// Whether the ring takes frame file `f`, at `path`: on, large enough, its producer still publishing.
bool Takes(const SpoolPaths& paths, const std::string& path, const std::string& f, std::string* producer) {
  int64_t seq;
  struct stat st {};  // the size first: a small frame's ack pays one syscall for the ring
  return RingEnabled() && ::lstat(path.c_str(), &st) == 0 && st.st_size >= kRingMinBytes &&
         ParseFrameFile(f, producer, &seq) && !Finished(paths, *producer);
}

}  // namespace

bool RecycleCommitted(const SpoolPaths& paths, const std::string& pending_path, const std::string& frame) {
  std::string producer;
  if (!Takes(paths, pending_path, frame, &producer)) return false;
  const std::string free_path = paths.Free() + "/" + frame;
  if (RenameNoReplace(pending_path, free_path) != 0) return false;
  if (Finished(paths, producer)) DropFile(free_path);  // it finished as we handed the file back
  return true;
}

bool Recycle(const SpoolPaths& paths, const std::string& done_path) {
  const std::string f = done_path.substr(done_path.rfind('/') + 1);
  std::string producer;
  if (!Takes(paths, done_path, f, &producer)) return false;
  const std::string hold = paths.Tmp() + "/" + f + std::string(layout::kTmpExt);
  UniqueFd fd(::open(hold.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return false;
  fd.reset();
  if (::renameat2(AT_FDCWD, hold.c_str(), AT_FDCWD, done_path.c_str(), RENAME_EXCHANGE) != 0) {
    DropFile(hold);  // no exchange here (or done/<f> moved on): the caller truncates as before the ring
    return false;
  }
  const std::string free_path = paths.Free() + "/" + f;
  if (RenameNoReplace(hold, free_path) != 0) {
    DropFile(hold);
    return true;
  }
  if (Finished(paths, producer)) DropFile(free_path);  // it finished as we handed the file back
  return true;
}

std::vector<std::pair<std::string, int64_t>> FreeFiles(const SpoolPaths& paths, const std::string& owner) {
  std::vector<std::pair<std::string, int64_t>> out;
  std::vector<std::string> names;
  std::string ignored;
  if (!ListFrames(paths.Free(), &names, &ignored)) return out;
  for (const std::string& n : names) {
    if (n.rfind(owner + "-", 0) != 0) continue;
    struct stat st {};
    const std::string p = paths.Free() + "/" + n;
    // Plain files with one name only: anything else standing there is never written over nor dropped.
    if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1)
      out.emplace_back(p, static_cast<int64_t>(st.st_blocks) * 512);
  }
  return out;
}

UniqueFd OpenFreeFile(const std::string& free_path, const std::string& tmp, uint64_t size) {
  if (::rename(free_path.c_str(), tmp.c_str()) != 0) return UniqueFd();
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));  // a FIFO must not block
  struct stat st {};
  bool ok = fd && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == ::geteuid();
  const off_t n = static_cast<off_t>(size);
  if (ok && st.st_size != n) ok = ::ftruncate(fd.get(), n) == 0;
  if (ok && st.st_blocks * 512 < n) ok = ::posix_fallocate(fd.get(), 0, n) == 0;
  if (ok) return fd;
  fd.reset();
  DropFile(tmp);
  return UniqueFd();
}

void DropFree(const SpoolPaths& paths, const std::string& owner) {
  for (const auto& [p, bytes] : FreeFiles(paths, owner)) DropFile(p);
}

void RemoveRingLeftovers(const SpoolPaths& paths) {
  std::vector<std::string> tmp, done;
  std::string ignored;
  if (!ListDir(paths.Tmp(), &tmp, &ignored) || !ListFrames(paths.Done(), &done, &ignored)) return;
  const std::set<std::string> acked(done.begin(), done.end());
  const std::string_view ext = layout::kTmpExt;
  for (const std::string& n : tmp)
    if (n.size() > ext.size() && std::string_view(n).substr(n.size() - ext.size()) == ext &&
        acked.count(n.substr(0, n.size() - ext.size())))
      DropFile(paths.Tmp() + "/" + n);
}

}  // namespace dflash::spool
