#include "worker/builtin/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "common/fd.h"
#include "common/private_files.h"
#include "spool/spool.h"

namespace dflash::builtin {
namespace {

constexpr char kTmpPrefix[] = ".tmp-";

/// step-N (10 digits) -> N; -1 for any other name (Python's checkpoint._NAME, without its ".k" tail saves).
int64_t StepOf(const std::string& name) {
  if (name.size() != 15 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool FsyncDir(const std::string& dir, std::string* err) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || ::fsync(fd.get()) != 0) {
    *err = ErrnoMessage("fsync(" + dir + ")", errno);
    return false;
  }
  return true;
}

bool RemoveTree(const std::string& path, std::string* err) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);  // never follows a link inside: removes the link
  if (ec) *err = "cannot remove " + path + ": " + ec.message();
  return !ec;
}

}  // namespace

CheckpointDir::CheckpointDir(std::string dir, int keep, std::string file)
    : dir_(std::move(dir)), file_(std::move(file)), keep_(std::max(1, keep)) {}

std::string CheckpointDir::StepName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%010lld", static_cast<long long>(step));
  return name;
}

bool CheckpointDir::Open(int* removed, std::string* err) {
  *removed = 0;
  PathUse use;
  use.what = "checkpoint dir";
  use.harm = "they could replace the weights a restarted drafter resumes from";
  if (!MakePrivateDir(dir_, FileMode::Private(), use, nullptr, err)) return false;
  std::vector<std::string> names;
  if (!spool::ListDir(dir_, &names, err)) return false;
  for (const std::string& n : names) {
    if (n.rfind(kTmpPrefix, 0) != 0) continue;
    if (!RemoveTree(dir_ + "/" + n, err)) return false;
    ++*removed;
  }
  return true;
}

bool CheckpointDir::Committed(std::vector<std::pair<int64_t, std::string>>* out, std::string* err) const {
  out->clear();
  std::vector<std::string> names;
  if (!spool::ListDir(dir_, &names, err)) return false;
  for (const std::string& n : names) {
    int64_t step = StepOf(n);
    struct stat st {};
    if (step >= 0 && ::stat((dir_ + "/" + n + "/" + file_).c_str(), &st) == 0 && S_ISREG(st.st_mode))
      out->emplace_back(step, dir_ + "/" + n);
  }
  std::sort(out->begin(), out->end());
  return true;
}

bool CheckpointDir::Save(int64_t step, const std::function<bool(const std::string&, std::string*)>& write,
                         std::string* path, std::string* err, const std::function<void()>& before_commit) {
  const std::string name = StepName(step), tmp = dir_ + "/" + kTmpPrefix + name, final_path = dir_ + "/" + name;
  if (!RemoveTree(tmp, err)) return false;  // a failed save of the same step, in this process
  if (::mkdir(tmp.c_str(), 0700) != 0) {
    *err = ErrnoMessage("mkdir(" + tmp + ")", errno);
    return false;
  }
  if (!write(tmp, err) || !FsyncDir(tmp, err)) {
    std::string ignored;
    RemoveTree(tmp, &ignored);
    return false;
  }
  if (before_commit) before_commit();
  // rename(2) of a directory onto a non-empty one fails (ENOTEMPTY): a committed checkpoint is never replaced.
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    *err = errno == ENOTEMPTY || errno == EEXIST
               ? "checkpoint " + final_path + " exists already: two processes writing checkpoints into " + dir_ +
                     "?"
               : ErrnoMessage("rename(" + tmp + ", " + final_path + ")", errno);
    std::string ignored;
    RemoveTree(tmp, &ignored);
    return false;
  }
  if (!FsyncDir(dir_, err)) return false;  // the rename is the commit: on disk before the frames are
  *path = final_path;
  return true;
}

bool CheckpointDir::Prune(std::string* err) {
  std::vector<std::pair<int64_t, std::string>> all;
  if (!Committed(&all, err)) return false;
  for (size_t i = 0; i + static_cast<size_t>(keep_) < all.size(); ++i) {
    // Renamed out of the committed names first: a kill mid-removal leaves a .tmp-* that the next Open removes,
    // never a step-N without its file, which no later Prune would see.
    const std::string doomed = dir_ + "/" + kTmpPrefix + "old-" + StepName(all[i].first);
    std::string ignored;
    RemoveTree(doomed, &ignored);  // a leftover of the same name (Open removes them; a hand-made one, say)
    if (::rename(all[i].second.c_str(), doomed.c_str()) != 0) {
      *err = ErrnoMessage("rename(" + all[i].second + ", " + doomed + ")", errno);
      return false;
    }
    if (!RemoveTree(doomed, err)) return false;
  }
  return true;
}

bool CheckpointDir::SetAside(const std::string& path, std::string* aside, std::string* err) {
  const std::string base = dir_ + "/damaged-" + path.substr(path.rfind('/') + 1);
  for (int k = 1; k <= 1000; ++k) {
    *aside = k == 1 ? base : base + "." + std::to_string(k);
    // RENAME_NOREPLACE: an earlier damaged one of the same name stays what it is.
    int e = spool::RenameNoReplace(path, *aside);
    if (e == 0) return FsyncDir(dir_, err);
    if (e != EEXIST && e != ENOTEMPTY) {
      *err = ErrnoMessage("rename(" + path + ", " + *aside + ")", e);
      return false;
    }
  }
  *err = "cannot set " + path + " aside: " + base + " and 999 more names are taken";
  return false;
}

std::vector<std::string> CheckpointDir::Uncovered(const std::map<std::string, std::vector<std::string>>& commits,
                                                  int64_t restored_step, const std::string& restored) {
  std::vector<std::string> out;
  for (const auto& [path, frames] : commits) {
    if (path == restored) continue;
    int64_t step = StepOf(path.substr(path.rfind('/') + 1));
    // A name that is no step-N of ours: unknown, so never taken as covered.
    if (step < 0 || step >= restored_step) out.push_back(path);
  }
  return out;
}

}  // namespace dflash::builtin
