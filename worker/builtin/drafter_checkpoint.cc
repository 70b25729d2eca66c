#include "worker/builtin/drafter_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/fd.h"
#include "spool/safetensors.h"
#include "spool/spool_commit.h"

namespace dflash::builtin {
namespace {

constexpr char kFormat[] = "dflash-builtin-checkpoint/1";

bool Integer(const safetensors::Metadata& m, const std::string& key, int64_t* out) {
  auto it = m.find(key);
  if (it == m.end() || it->second.empty()) return false;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (*end || v < 0) return false;
  *out = v;
  return true;
}

/// Every parameter and the optimizer's state into <tmp>/drafter.safetensors, fsynced.
bool WriteState(const std::string& file, const Drafter& d, const safetensors::Metadata& meta, std::string* err) {
  Params all = d.params(), state = d.OptimizerState();
  all.insert(all.end(), state.begin(), state.end());
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    *err = ErrnoMessage("open(" + file + ")", errno);
    return false;
  }
  if (!safetensors::WriteFd(fd.get(), meta, RefsOf(all), err)) return false;
  if (::fsync(fd.get()) != 0) {
    *err = ErrnoMessage("fsync(" + file + ")", errno);
    return false;
  }
  return true;
}

/// "frames a, b, c" (the first 8, then "and N more").
std::string FrameList(const std::vector<std::string>& frames) {
  std::string out = frames.size() == 1 ? "frame " : std::to_string(frames.size()) + " frames ";
  for (size_t i = 0; i < frames.size() && i < 8; ++i) out += (i ? ", " : "") + frames[i];
  if (frames.size() > 8) out += " and " + std::to_string(frames.size() - 8) + " more";
  return out;
}

bool StillThere(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

/// The refusal when done/ names checkpoints (`gone`) that a restore of `restored` ("" for none) does not cover.
std::string UncoveredMessage(const std::map<std::string, std::vector<std::string>>& commits,
                             const std::vector<std::string>& gone, const std::string& restored) {
  std::string out = "done/ holds frames committed by ";
  for (size_t i = 0; i < gone.size(); ++i)
    out += (i ? "; " : "") + gone[i] + (StillThere(gone[i]) ? "" : " (gone)") + ": " + FrameList(commits.at(gone[i]));
  out += ". They trained only into " + std::string(gone.size() == 1 ? "that checkpoint" : "those checkpoints") +
         "; resuming from " + (restored.empty() ? "none (step 0)" : restored) +
         " would skip them, and a new checkpoint could take the name. fix: put back what was removed (a copy of " +
         gone.back() + ") and resume; or start over: a new run (new run id, so a fresh spool) with another [run] "
         "checkpoint_dir. Never remove the newest checkpoint to resume from the one before: its frames are in done/";
  return out;
}

}  // namespace

DrafterCheckpoints::DrafterCheckpoints(std::string dir, const CheckpointOptions& o, CheckpointIdentity me)
    : dir_(std::move(dir), o.keep, kFile), o_(o), me_(std::move(me)) {}

RestoreResult DrafterCheckpoints::Restore(Drafter* drafter, spool::SpoolConsumer* consumer, int64_t* step,
                                          std::string* path, std::vector<std::string>* notes, std::string* err) {
  *step = 0;
  path->clear();
  notes->clear();
  int removed = 0;
  std::vector<std::pair<int64_t, std::string>> all;
  std::map<std::string, std::vector<std::string>> commits;  // done/'s frames by the checkpoint of this dir they name
  if (!dir_.Open(&removed, err) || !dir_.Committed(&all, err) ||
      !spool::CommitsInto(consumer->paths(), dir_.dir(), &commits, err))
    return RestoreResult::kFailed;
  // Newest first; a damaged one is passed over only if it committed nothing (item 5 of issue #55).
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string& ck = it->second;
    bool damaged = false;
    RestoreResult r = RestoreFrom(ck, commits, drafter, consumer, step, notes, &damaged, err);
    if (!damaged) {
      if (r == RestoreResult::kOk) *path = ck;
      return r;
    }
    if (auto c = commits.find(ck); c != commits.end()) {
      *err = "checkpoint " + ck + " is damaged (" + *err + ") and committed " + FrameList(c->second) +
             " (done/ names it): no other checkpoint trained on them, so none restores exactly; fix: put back a "
             "good copy of " + ck + ", or start over: a new run (new run id, so a fresh spool) with another [run] "
             "checkpoint_dir";
      return RestoreResult::kRefused;
    }
    std::string aside, damage = *err;
    if (!dir_.SetAside(ck, &aside, err)) return RestoreResult::kFailed;
    notes->push_back("checkpoint " + ck + " is damaged (" + damage + "); it committed no frames, so the one before "
                     "it is as good: set aside as " + aside);
  }
  // None (left): a fresh start is exact only if no frame in done/ went into a checkpoint of this dir.
  if (std::vector<std::string> gone = CheckpointDir::Uncovered(commits, -1, ""); !gone.empty()) {
    *err = UncoveredMessage(commits, gone, "");
    return RestoreResult::kRefused;
  }
  return consumer->HoldForCheckpoint(err) && consumer->Restore(0, "", err) ? RestoreResult::kOk
                                                                          : RestoreResult::kFailed;
}

RestoreResult DrafterCheckpoints::RestoreFrom(const std::string& ck,
                                              const std::map<std::string, std::vector<std::string>>& commits,
                                              Drafter* drafter, spool::SpoolConsumer* consumer, int64_t* step,
                                              std::vector<std::string>* notes, bool* damaged, std::string* err) {
  const std::string file = ck + "/" + kFile;
  safetensors::File f;
  if (!f.Read(file, err)) {  // truncated, garbled, unreadable: damaged
    *damaged = true;
    return RestoreResult::kFailed;
  }
  const std::string fix = "fix: move it out of " + dir_.dir() + ", or give this run another [run] checkpoint_dir";
  const safetensors::Metadata& meta = f.header().metadata;
  int64_t s = 0, optimizer_step = 0, position = 0;
  auto format = meta.find("format");
  auto who = meta.find("consumer");
  if (format == meta.end() || format->second != kFormat || !Integer(meta, "step", &s) ||
      !Integer(meta, "optimizer_step", &optimizer_step) || !Integer(meta, "position", &position) ||
      who == meta.end()) {
    *err = file + " is not a builtin drafter checkpoint (" + kFormat +
           " with step, optimizer_step, position and consumer); " + fix;
    return RestoreResult::kRefused;
  }
  CheckpointIdentity theirs;
  std::string why;
  CheckpointIdentity::Read read = CheckpointIdentity::From(meta, &theirs, &why);
  if (read == CheckpointIdentity::Read::kMalformed) {
    *err = "checkpoint " + ck + ": " + why + "; " + fix;
    return RestoreResult::kRefused;
  }
  IdentityCheck c = JudgeIdentity(me_, read == CheckpointIdentity::Read::kOk ? &theirs : nullptr, o_.adopt, ck);
  if (c.verdict == IdentityCheck::kRefuse) {
    *err = c.why;
    return RestoreResult::kRefused;
  }
  // Adopting one without identity: it consumed this spool if this spool's done/ names checkpoints of this dir.
  const bool same_spool = read == CheckpointIdentity::Read::kOk ? c.same_spool : !commits.empty();
  if (same_spool && who->second != consumer->name()) {
    *err = "checkpoint " + ck + " is of spool consumer " + who->second + ", this process is " + consumer->name() +
           ": its frames are not this process's to commit; " + fix;
    return RestoreResult::kRefused;
  }
  // Every frame done/ credits to a checkpoint of this dir must be in this one (or one before it, pruned).
  if (std::vector<std::string> gone = CheckpointDir::Uncovered(commits, s, ck); !gone.empty()) {
    *err = UncoveredMessage(commits, gone, ck);
    return RestoreResult::kRefused;
  }
  if (!drafter->LoadCheckpoint(f, optimizer_step, err)) {
    *err = "checkpoint " + ck + " does not match this drafter ([model]): " + *err +
           "; fix: the same [model] as the run that wrote it, or another [run] checkpoint_dir";
    return RestoreResult::kRefused;
  }
  if (c.verdict == IdentityCheck::kAdopt) notes->push_back(c.why);
  if (!consumer->HoldForCheckpoint(err) ||
      !consumer->Restore(same_spool ? position : 0, same_spool ? ck : std::string(), err))
    return RestoreResult::kFailed;
  *step = s;
  last_step_ = s;
  return RestoreResult::kOk;
}

bool DrafterCheckpoints::Save(const Drafter& drafter, spool::SpoolConsumer* consumer, int64_t steps_done,
                              std::string* path, int* committed, std::string* err) {
  auto t0 = std::chrono::steady_clock::now();
  *committed = 0;
  const int64_t position = consumer->position();
  safetensors::Metadata meta = {{"format", kFormat},
                                {"step", std::to_string(steps_done)},
                                {"optimizer_step", std::to_string(drafter.optimizer_step())},
                                {"position", std::to_string(position)},
                                {"consumer", consumer->name()}};
  me_.AddTo(&meta);
  auto write = [&](const std::string& tmp, std::string* e) { return WriteState(tmp + "/" + kFile, drafter, meta, e); };
  auto pause = [&] {
    if (o_.pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.pause_ms));
  };
  if (!dir_.Save(steps_done, write, path, err, pause)) return false;
  last_step_ = steps_done;
  ++written_;
  if (!consumer->Commit(position, *path, committed, err) || !dir_.Prune(err)) return false;
  blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                static_cast<double>(o_.pause_ms) / 1000.0;
  return true;
}

}  // namespace dflash::builtin
