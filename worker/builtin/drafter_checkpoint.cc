#include "worker/builtin/drafter_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/fd.h"
#include "worker/builtin/safetensors.h"

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

}  // namespace

DrafterCheckpoints::DrafterCheckpoints(std::string dir, const CheckpointOptions& o)
    : dir_(std::move(dir), o.keep, kFile), o_(o) {}

bool DrafterCheckpoints::Restore(Drafter* drafter, spool::SpoolConsumer* consumer, int64_t* step, std::string* path,
                                 std::string* err) {
  *step = 0;
  path->clear();
  int removed = 0;
  std::vector<std::pair<int64_t, std::string>> all;
  if (!dir_.Open(&removed, err) || !dir_.Committed(&all, err)) return false;
  if (all.empty()) return consumer->HoldForCheckpoint(err) && consumer->Restore(0, "", err);
  const std::string& newest = all.back().second;
  const std::string file = newest + "/" + kFile;
  safetensors::File f;
  if (!f.Read(file, err)) {
    *err = "checkpoint " + newest + " cannot be read (" + *err + "); fix: remove it to resume from the one before, "
           "or use another checkpoint dir";
    return false;
  }
  const safetensors::Metadata& meta = f.header().metadata;
  int64_t s = 0, optimizer_step = 0, position = 0;
  auto format = meta.find("format");
  auto who = meta.find("consumer");
  if (format == meta.end() || format->second != kFormat || !Integer(meta, "step", &s) ||
      !Integer(meta, "optimizer_step", &optimizer_step) || !Integer(meta, "position", &position) ||
      who == meta.end()) {
    *err = file + " is not a builtin drafter checkpoint (" + kFormat +
           " with step, optimizer_step, position and consumer); fix: remove it, or use another checkpoint dir";
    return false;
  }
  if (who->second != consumer->name()) {
    *err = "checkpoint " + newest + " is of spool consumer " + who->second + ", this process is " +
           consumer->name() + ": its frames are not this process's to commit; fix: use another checkpoint dir";
    return false;
  }
  if (!drafter->LoadCheckpoint(f, optimizer_step, err)) {
    *err = "checkpoint " + newest + " does not match this drafter ([model]): " + *err +
           "; fix: the same [model] as the run that wrote it, or another checkpoint dir";
    return false;
  }
  if (!consumer->HoldForCheckpoint(err) || !consumer->Restore(position, newest, err)) return false;
  *step = s;
  *path = newest;
  last_step_ = s;
  return true;
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
