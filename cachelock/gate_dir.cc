#include "cachelock/gate_dir.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "common/fd.h"
#include "common/hash.h"
#include "common/inductor_layout.h"
#include "common/secure_path.h"

namespace dflash {
namespace {

std::string UserName(uid_t uid) {
  struct passwd pw {};
  struct passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) return found->pw_name;
  return std::to_string(uid);
}

// mkdir -p, new components 0700. Existing components are left as they are.
bool MakeDirs(const std::filesystem::path& p, std::string* err) {
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return true;
    *err = fmt::format("{} exists and is not a directory", p.string());
    return false;
  }
  if (p.has_parent_path() && p.parent_path() != p && !MakeDirs(p.parent_path(), err)) return false;
  if (::mkdir(p.c_str(), 0700) != 0 && errno != EEXIST) {
    *err = ErrnoMessage("mkdir(" + p.string() + ")", errno);
    return false;
  }
  return true;
}

// A subdirectory we own: created 0700, never followed through a symlink.
bool MakePrivateSubdir(const std::string& path, std::string* err) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    *err = ErrnoMessage("mkdir(" + path + ")", errno);
    return false;
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    *err = ErrnoMessage("lstat(" + path + ")", errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *err = fmt::format("refusing {}: it is not a directory (a symlink?); fix: rm {} (it is recreated)",
                       path, path);
    return false;
  }
  return CheckPrivateDir(path, err);
}

}  // namespace

std::string GateLayout::ReadyPath(const std::string& key) const {
  return ready_dir + "/" + key + ".json";
}

bool CheckPrivateDir(const std::string& path, std::string* err) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *err = ErrnoMessage("stat(" + path + ")", errno);
    return false;
  }
  uid_t me = ::geteuid();
  if (st.st_uid != me) {
    *err = fmt::format(
        "refusing gate dir {}: it is owned by {} (uid {}), not by you ({}, uid {}); whoever owns it can "
        "forge READY markers; fix: chown {} {} (or use a directory of your own)",
        path, UserName(st.st_uid), st.st_uid, UserName(me), me, me, path);
    return false;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    const char* who = (st.st_mode & S_IWGRP) && (st.st_mode & S_IWOTH) ? "group and others"
                      : (st.st_mode & S_IWGRP)                         ? "its group"
                                                                       : "others";
    *err = fmt::format(
        "refusing gate dir {}: it is writable by {} (mode {:04o}), who could forge READY markers; "
        "fix: chmod go-w {}",
        path, who, st.st_mode & 07777, path);
    return false;
  }
  return true;
}

bool LocateGate(const std::string& dir, GateLayout* out, std::string* err) {
  std::error_code ec;
  std::filesystem::path canon = std::filesystem::canonical(dir, ec);
  if (ec) {
    *err = fmt::format("gate dir {}: {}", dir, ec.message());
    return false;
  }
  GateLayout l;
  l.dir = canon.string();
  l.meta_dir = l.dir + "/.dflash";
  l.ready_dir = l.meta_dir + "/ready";
  l.lock_path = l.meta_dir + "/gate.lock";
  l.holder_path = l.meta_dir + "/holder.json";
  // POSIX semaphore names are at most NAME_MAX-4 bytes: hash the path, keep the uid readable.
  l.local_name = fmt::format("dflash-{}-{}", ::geteuid(), Sha256Hex(l.dir).substr(0, 16));
  l.local_sem_path = "/dev/shm/sem." + l.local_name;
  l.local_owner_path = "/dev/shm/" + l.local_name + ".owner";
  *out = std::move(l);
  return true;
}

bool PrepareGateDir(const std::string& dir, GateLayout* out, std::string* err) {
  if (dir.empty()) {
    *err = "gate dir is empty";
    return false;
  }
  if (!CheckSecurePath(dir, err)) return false;
  if (!MakeDirs(std::filesystem::path(dir), err)) return false;
  if (!LocateGate(dir, out, err)) return false;
  if (!CheckPrivateDir(out->dir, err)) return false;
  if (!MakePrivateSubdir(out->meta_dir, err)) return false;
  if (!MakePrivateSubdir(out->ready_dir, err)) return false;
  return CheckPrivateTree(out->dir, InductorReads, err);
}

bool ReadTrustedMarker(const std::string& path, std::string* text, std::string* err) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    int e = errno;
    *err = e == ENOENT ? "absent"
           : e == ELOOP ? fmt::format("{} is a symlink: not trusted (a marker is a file written by the gate); "
                                      "fix: rm {}", path, path)
                        : ErrnoMessage("open(" + path + ")", e);
    return false;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    *err = fmt::format("{} is not a regular file: not trusted; fix: rm {}", path, path);
    return false;
  }
  if (st.st_uid != ::geteuid()) {
    *err = fmt::format("{} is owned by {} (uid {}), not by you: not trusted (anyone could promise a warm cache); "
                       "fix: rm {}", path, UserName(st.st_uid), st.st_uid, path);
    return false;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    *err = fmt::format("{} is writable by others (mode {:04o}): not trusted; fix: chmod go-w {}", path,
                       st.st_mode & 07777, path);
    return false;
  }
  bool too_big = false;
  if (ReadAllFrom(fd.get(), path, 1u << 20, text, err, &too_big)) return true;
  if (too_big) *err = path + " is larger than 1 MiB: not a READY marker";
  return false;
}

}  // namespace dflash
