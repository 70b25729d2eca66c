#include "spool/spool_commit.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "spool/spool_ring.h"

namespace dflash::spool {

bool PendingFramesOf(const SpoolPaths& paths, const std::string& consumer, std::vector<PendingFrame>* out,
                     std::string* err) {
  out->clear();
  std::vector<std::string> names;
  const std::string dir = paths.PendingOf(consumer);
  if (!ListDir(dir, &names, err)) return false;
  for (const std::string& n : names) {
    PendingFrame p;
    if (ParsePendingName(n, &p.position, &p.frame)) {
      p.path = dir + "/" + n;
      out->push_back(std::move(p));
    }
  }
  std::sort(out->begin(), out->end(), [](const PendingFrame& a, const PendingFrame& b) {
    return a.position != b.position ? a.position < b.position : a.frame < b.frame;
  });
  return true;
}

std::string CommitRecord(const std::string& checkpoint) {
  // json.dumps({"checkpoint": path}): ", " / ": " separators, non-ASCII as \uXXXX (ensure_ascii).
  return "{\"" + std::string(layout::kRecordCheckpointKey) +
         "\": " + nlohmann::json(checkpoint).dump(-1, ' ', /*ensure_ascii=*/true) + "}\n";
}

void CommittedBy(const std::string& done_file, std::string* checkpoint, bool* has) {
  *has = false;
  // O_NONBLOCK: a FIFO planted in done/ reads as no record instead of stopping a restore.
  UniqueFd fd(::open(done_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd) return;
  char buf[4096];
  ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n <= 0) return;
  nlohmann::json j = nlohmann::json::parse(std::string(buf, static_cast<size_t>(n)), nullptr, false);
  const std::string key(layout::kRecordCheckpointKey);
  if (j.is_object() && j.contains(key) && j[key].is_string()) {
    *checkpoint = j[key].get<std::string>();
    *has = true;
  }
}

bool CommitsInto(const SpoolPaths& paths, const std::string& checkpoint_dir,
                 std::map<std::string, std::vector<std::string>>* out, std::string* err) {
  out->clear();
  std::vector<std::string> names;
  if (!ListDir(paths.Done(), &names, err)) return false;
  std::string by;
  bool has = false;
  for (const std::string& n : names) {
    CommittedBy(paths.Done() + "/" + n, &by, &has);
    size_t slash = by.rfind('/');
    if (has && slash != std::string::npos && by.compare(0, slash, checkpoint_dir) == 0 &&
        slash == checkpoint_dir.size())
      (*out)[by].push_back(n);
  }
  for (auto& [checkpoint, frames] : *out) std::sort(frames.begin(), frames.end());
  return true;
}

bool CommitPending(const SpoolPaths& paths, const std::map<std::string, int64_t>& positions,
                   const std::string& checkpoint, int* committed, std::string* err, const MayDrop* may_drop) {
  *committed = 0;
  const std::string record = CommitRecord(checkpoint);
  std::vector<PendingFrame> pending;
  for (const auto& [consumer, position] : positions) {
    if (!PendingFramesOf(paths, consumer, &pending, err)) return false;
    for (const PendingFrame& p : pending) {
      if (p.position >= position) break;
      const std::string tmp = paths.Tmp() + "/" + p.frame + std::string(layout::kCommitTmpExt);
      const std::string done = paths.Done() + "/" + p.frame;
      {
        UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!fd) {
          *err = ErrnoMessage("open(" + tmp + ")", errno);
          return false;
        }
        if (!WriteAll(fd.get(), record, err)) return false;
      }
      if (int e = RenameNoReplace(tmp, done)) {
        ::unlink(tmp.c_str());
        if (e != EEXIST) {
          *err = ErrnoMessage("rename(" + tmp + ", " + done + ")", e);
          return false;
        }
        std::string by;
        bool has = false;
        CommittedBy(done, &by, &has);
        if (!has || by != checkpoint) {
          *err = "frame " + p.frame + " was committed before (done/ has it) and again by " + checkpoint +
                 ": it entered the model twice; the checkpoint dir and the spool disagree";
          return false;
        }
        // This commit, repeated (a kill between the record's rename and the unlink): finish it.
      }
      // Its bytes: back to the producer (the ring), or gone. Emptied before the unlink: the C++ consumer maps
      // nothing of a frame after its ack, and a mapping it kept (safetensors::MapCache) must not hold the pages
      // of an unlinked file.
      const bool drop = !may_drop || (*may_drop)(consumer, p.frame);
      if (drop && RecycleCommitted(paths, p.path, p.frame)) {
        ++*committed;
        continue;
      }
      if (drop) EmptyFile(p.path);
      if (::unlink(p.path.c_str()) != 0 && errno != ENOENT) {
        *err = ErrnoMessage("unlink(" + p.path + ")", errno);
        return false;
      }
      ++*committed;
    }
  }
  return true;
}

}  // namespace dflash::spool
