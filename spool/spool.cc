#include "spool/spool.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include "common/fd.h"
#include "common/private_files.h"
#include "spool/frame_transport.h"
#include "spool/spool_commit.h"
#include "spool/spool_order.h"
#include "spool/spool_ring.h"

namespace dflash::spool {
namespace {

namespace m = layout::manifest;

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

bool MakeDir(const std::string& dir, std::string* err) {
  PathUse use;
  use.what = "spool dir";
  use.harm = "they could replace the hidden-state frames and the shared weights";
  return MakePrivateDir(dir, FileMode::Private(), use, nullptr, err);
}

namespace {

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

/// [[first_seq, last_seq, checkpoint or null], ...]: `producer`'s consecutive sequence numbers committed by the
/// same checkpoint (dflash_launch.spool.dirs._runs).
nlohmann::ordered_json CommittedRuns(const std::string& producer, const std::set<int64_t>& seqs,
                                     const std::map<std::pair<std::string, int64_t>, std::string>& by) {
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  auto ck = [&](int64_t s) {
    auto it = by.find({producer, s});
    return it == by.end() ? nlohmann::ordered_json() : nlohmann::ordered_json(it->second);
  };
  for (int64_t s : seqs) {
    nlohmann::ordered_json c = ck(s);
    if (!runs.empty() && runs.back()[1].get<int64_t>() == s - 1 && runs.back()[2] == c) runs.back()[1] = s;
    else runs.push_back({s, s, c});
  }
  return runs;
}

struct Candidate {
  int64_t seq;
  std::string producer, file;
  bool operator<(const Candidate& o) const { return seq != o.seq ? seq < o.seq : producer < o.producer; }
};

}  // namespace

int RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  if (::link(from.c_str(), to.c_str()) != 0) return errno;
  ::unlink(from.c_str());
  return 0;
}

bool ListDir(const std::string& dir, std::vector<std::string>* names, std::string* err, bool dirs_only) {
  names->clear();
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return true;
    *err = ErrnoMessage("opendir(" + dir + ")", errno);
    return false;
  }
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    if (dirs_only && e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
    names->push_back(std::move(n));
  }
  ::closedir(d);
  return true;
}

bool SpoolPaths::Create(std::string* err) const {
  // mkdir -p of the root: its parent (/dev/shm/dflash-<uid>-<name>) may not exist yet.
  if (!MakeDir(root, err)) return false;
  // Not pending/: only a consumer that checkpoints makes it (HoldForCheckpoint), and a failed run keeps a spool
  // that has it for `run --resume` (launcher/commands/run_command.cc).
  for (const std::string& d : {Tmp(), Ready(), Claimed(), Done(), Rejected(), Producers(), Free()})
    if (!MakeDir(d, err)) return false;
  return true;
}

bool ListFrames(const std::string& dir, std::vector<std::string>* files, std::string* err) {
  std::vector<std::string> all;
  if (!ListDir(dir, &all, err)) return false;
  files->clear();
  std::string p;
  int64_t s;
  for (std::string& f : all)
    if (ParseFrameFile(f, &p, &s)) files->push_back(std::move(f));
  return true;
}

bool ListPendingFrames(const SpoolPaths& paths, std::vector<std::string>* files, std::string* err) {
  files->clear();
  std::vector<std::string> consumers, names;
  if (!ListDir(paths.Pending(), &consumers, err, true)) return false;
  int64_t position;
  std::string frame;
  for (const std::string& c : consumers) {
    if (!ListDir(paths.PendingOf(c), &names, err)) return false;
    for (const std::string& n : names)
      if (ParsePendingName(n, &position, &frame)) files->push_back(frame);
  }
  return true;
}

Deadline DeadlineIn(double timeout_s) {
  using Clock = std::chrono::steady_clock;
  if (timeout_s < 0) return std::nullopt;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

bool SleepBefore(const Deadline& deadline, int64_t* delay_us, int64_t max_us) {
  auto d = std::chrono::microseconds(*delay_us);
  if (deadline) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= *deadline) return false;
    d = std::min(d, std::chrono::duration_cast<std::chrono::microseconds>(*deadline - now) +
                        std::chrono::microseconds(1));
  }
  std::this_thread::sleep_for(d);
  *delay_us = std::min(max_us, *delay_us * 2);
  return true;
}

bool DefaultMaxBytes(const std::string& root, int64_t* out, std::string* err) {
  const char* given = std::getenv("DFLASH_SPOOL_MAX_BYTES");
  if (given && *given) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(given, &end, 10);
    if (errno != 0 || end == given || *end != '\0') {
      *err = std::string("DFLASH_SPOOL_MAX_BYTES='") + given + "' is not a byte count";
      return false;
    }
    if (n <= 0) {
      *err = std::string("DFLASH_SPOOL_MAX_BYTES='") + given + "' must be positive";
      return false;
    }
    *out = n;
    return true;
  }
  struct statvfs st {};
  if (::statvfs(root.c_str(), &st) != 0) {
    *err = ErrnoMessage("statvfs(" + root + ")", errno);
    return false;
  }
  *out = std::max<int64_t>(1, static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize) / 2);
  return true;
}

bool CommittedRecords(const SpoolPaths& paths, std::map<std::string, std::string>* out, std::string* err) {
  out->clear();
  std::vector<std::string> names;
  if (!ListFrames(paths.Done(), &names, err)) return false;
  for (const std::string& f : names) {
    std::string ck;
    bool has = false;
    CommittedBy(paths.Done() + "/" + f, &ck, &has);
    if (has && !ck.empty()) (*out)[f] = ck;
  }
  return true;
}

bool ConsumerCount(const SpoolPaths& paths, int* out, std::string* err) {
  std::vector<std::string> names;
  if (!ListDir(paths.Claimed(), &names, err, true)) return false;
  *out = static_cast<int>(names.size());
  return true;
}

void Backoff::Sleep() {
  std::this_thread::sleep_for(std::chrono::microseconds(us_));
  us_ = std::min(max_us_, us_ * 2);
}

// ---------------------------------------------------------------------------

bool SpoolBytes(const SpoolPaths& paths, int64_t* bytes, std::string* err, const std::string& owner) {
  std::vector<std::string> dirs = {paths.Ready(), paths.Tmp(), paths.Free()}, names;
  if (!ListDir(paths.Claimed(), &names, err, true)) return false;
  for (const std::string& c : names) dirs.push_back(paths.ClaimedBy(c));
  *bytes = 0;
  for (const std::string& d : dirs) {
    std::string ignored;
    if (!ListDir(d, &names, &ignored)) continue;  // a consumer's dir removed meanwhile
    for (const std::string& n : names) {
      if (!owner.empty() && n.rfind(owner + "-", 0) != 0) continue;
      struct stat st {};
      if (::lstat((d + "/" + n).c_str(), &st) == 0) *bytes += static_cast<int64_t>(st.st_blocks) * 512;
    }  // else claimed or acknowledged meanwhile
  }
  return true;
}

SpoolProducer::SpoolProducer(std::string root, std::string name, int max_ready, int64_t max_bytes)
    : paths_{std::move(root)}, transport_(std::make_unique<LocalDirTransport>(paths_.root)), name_(std::move(name)),
      max_ready_(std::max(1, max_ready)), max_bytes_(std::max<int64_t>(0, max_bytes)) {}
SpoolProducer::~SpoolProducer() = default;
SpoolProducer::SpoolProducer(SpoolProducer&&) noexcept = default;

bool SpoolProducer::Open(std::string* err) {
  if (!transport_->Open("", err)) return false;
  if (max_bytes_ == 0) {
    struct statvfs st {};
    if (::statvfs(paths_.root.c_str(), &st) != 0) {
      *err = ErrnoMessage("statvfs(" + paths_.root + ")", errno);
      return false;
    }
    max_bytes_ = std::max<int64_t>(1, static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize) / 2);
  }
  std::vector<std::string> names;
  if (!ListDir(paths_.Tmp(), &names, err)) return false;
  for (const std::string& n : names) {
    std::string p;
    int64_t s;
    const std::string_view ext = layout::kTmpExt;
    bool mine = (n.size() > ext.size() && std::string_view(n).substr(n.size() - ext.size()) == ext &&
                 ParseFrameFile(std::string_view(n).substr(0, n.size() - ext.size()), &p, &s) && p == name_) ||
                n.find("@" + name_ + std::string(ext)) != std::string::npos;
    if (mine && ::unlink((paths_.Tmp() + "/" + n).c_str()) == 0) ++removed_tmp_;
  }
  finished_ = FileExists(paths_.EndMarker(name_));
  // Resume after the highest sequence number this producer has anywhere. The
  // scan follows the frames' own direction (ready -> claimed -> done/rejected),
  // so a frame moving while we look is seen in the later directory.
  int64_t max_seq = -1;
  for (FrameState state : {FrameState::kReady, FrameState::kClaimed, FrameState::kPending, FrameState::kDone,
                           FrameState::kRejected}) {
    if (!transport_->List(state, "", &names, err)) return false;
    for (const std::string& f : names) {
      std::string p;
      int64_t s;
      if (ParseFrameFile(f, &p, &s) && p == name_) max_seq = std::max(max_seq, s);
    }
  }
  next_seq_ = max_seq + 1;
  return true;
}

bool SpoolProducer::WaitForRoom(uint64_t size, UniqueFd* lock, std::string* reuse, std::string* err,
                                const Deadline& deadline, bool* not_yet) {
  // Each producer keeps to its share of the budget (DFLASH_SPOOL_PRODUCERS, what dflash-launch sets, or what the
  // caller said: set_producers), so the producers together stay within it.
  int producers = 1;
  if (producers_ > 0) producers = producers_;
  else if (const char* v = std::getenv("DFLASH_SPOOL_PRODUCERS")) producers = std::max(1, std::atoi(v));
  const int64_t share = max_bytes_ / producers;
  if (static_cast<int64_t>(size) > share) {
    *err = "a frame of " + std::to_string(size) + " bytes can never fit the spool's byte budget of " +
           std::to_string(share) + " bytes" +
           (producers > 1 ? " (this producer's share: " + std::to_string(max_bytes_) + " over " +
                                std::to_string(producers) + " producers)"
                          : std::string()) +
           "; fix: raise [run] spool_max_bytes (dflash-launch check says what one frame needs)";
    return false;
  }
  const std::string lock_path = paths_.BudgetLock();
  *lock = UniqueFd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!*lock) {
    *err = ErrnoMessage("open(" + lock_path + ")", errno);
    return false;
  }
  int64_t delay_us = 100;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> ready;
  bool waited = false;
  while (true) {
    if (!transport_->List(FrameState::kReady, "", &ready, err)) return false;
    // Its own frames and bytes only, against its share of the budget: a consumer in a fixed order (WorldSource)
    // waits for this producer's next frame while the others' fill ready/, so a shared bound could stop the one
    // producer it waits for.
    const std::string mine = name_ + "-";
    if (std::count_if(ready.begin(), ready.end(), [&](const std::string& f) { return f.rfind(mine, 0) == 0; }) <
        max_ready_) {
      // The lock spans the count and the allocation: a producer's own frames never pass its share.
      while (::flock(lock->get(), LOCK_EX) != 0)
        if (errno != EINTR) {
          *err = ErrnoMessage("flock(" + lock_path + ")", errno);
          return false;
        }
      int64_t held = 0;
      if (!SpoolBytes(paths_, &held, err, name_)) return false;
      // The ring's file that best takes the frame (the smallest that holds it, else the largest): its bytes are
      // counted already, only what the frame needs beyond them must fit. A frame under kRingMinBytes is never
      // written over one (its acks truncate) and looks at them only when they stand in its way.
      const bool small = static_cast<int64_t>(size) < kRingMinBytes;
      std::vector<std::pair<std::string, int64_t>> files;
      if (!small || held + static_cast<int64_t>(size) > share) files = FreeFiles(paths_, name_);
      std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
      auto best = std::find_if(files.begin(), files.end(),
                               [&](const auto& f) { return f.second >= static_cast<int64_t>(size); });
      if (best == files.end() && !files.empty()) best = files.end() - 1;
      if (small) best = files.end();
      const int64_t have = best == files.end() ? 0 : best->second;
      const int64_t need = std::max<int64_t>(0, static_cast<int64_t>(size) - have);
      const size_t others = files.size() - (best == files.end() ? 0 : 1);
      if (held + need > share && others > 0) {  // kept for frames of another size: room for this one first
        for (auto it = files.begin(); it != files.end(); ++it)
          if (it != best) DropFile(it->first);
        if (!SpoolBytes(paths_, &held, err, name_)) return false;
      }
      if (held + need <= share) {
        *reuse = best == files.end() ? std::string() : best->first;
        break;
      }
      ::flock(lock->get(), LOCK_UN);
    }
    waited = true;
    if (!SleepBefore(deadline, &delay_us, 20'000)) {
      waited_s_ += Since(t0);
      lock->reset();
      *not_yet = true;
      return true;
    }
  }
  if (waited) waited_s_ += Since(t0);
  return true;
}

bool SpoolProducer::Publish(safetensors::Metadata metadata, const std::vector<safetensors::TensorRef>& tensors,
                            int64_t* seq, std::string* err, double timeout_s, bool* not_yet, int* err_no) {
  if (not_yet) *not_yet = false;
  if (err_no) *err_no = 0;
  const int64_t s = next_seq_;
  const std::string file = FrameFile(name_, s);
  const std::string tmp = transport_->Where(FrameState::kWriting, name_, file);
  metadata[std::string(layout::meta::kProducer)] = name_;
  metadata[std::string(layout::meta::kSeq)] = std::to_string(s);
  uint64_t size = 0;
  if (!safetensors::EncodedSize(metadata, tensors, &size, err)) return false;
  {
    UniqueFd budget;  // held until the frame's pages are allocated and written
    std::string reuse;
    bool later = false;
    if (!WaitForRoom(size, &budget, &reuse, err, not_yet ? DeadlineIn(timeout_s) : Deadline(), &later)) return false;
    if (later) {
      *not_yet = true;
      return true;
    }
    int e = 0;
    UniqueFd over = reuse.empty() ? UniqueFd() : OpenFreeFile(reuse, tmp, size);
    if (over) {
      if (!safetensors::WriteFd(over.get(), metadata, tensors, err)) {
        over.reset();
        ::unlink(tmp.c_str());
        return false;
      }
    } else if (!safetensors::WriteFile(tmp, metadata, tensors, err, /*exclusive=*/false, &e)) {
      if (err_no) *err_no = e;
      if (e == ENOSPC)
        *err = "the spool's filesystem cannot hold a frame of " + std::to_string(size) + " bytes (" + *err +
               "): nothing was published and no frame is lost; fix: give the spool room (a larger /dev/shm: docker "
               "--shm-size, or [run] spool_dir on a larger tmpfs) or a smaller [run] spool_max_bytes so producers "
               "wait for the drafters before the filesystem fills";
      return false;
    }
  }
  // No fsync: the spool lives in RAM (/dev/shm) and only has to survive the
  // death of a process, which rename-after-write already covers.
  if (int e = transport_->Publish(name_, file)) {
    ::unlink(tmp.c_str());
    *err = e == EEXIST ? "frame " + file + " is already published: sequence number clash (two producers named " +
                             name_ + "?)"
                       : ErrnoMessage("rename(" + tmp + ", ready/" + file + ")", e);
    return false;
  }
  next_seq_ = s + 1;
  if (seq) *seq = s;
  return true;
}

bool SpoolProducer::Finish(std::string* err) {
  if (!transport_->MarkEnd(name_, next_seq_, err)) return false;
  DropFree(paths_, name_);  // after the marker: no consumer hands a file back from now on
  finished_ = true;
  return true;
}

bool SpoolProducer::PublishShared(const std::string& file, const safetensors::Metadata& metadata,
                                  const std::vector<safetensors::TensorRef>& tensors, bool* won, std::string* err) {
  *won = false;
  const std::string dest = paths_.root + "/" + file;
  if (FileExists(dest)) return true;
  const std::string tmp = paths_.Tmp() + "/" + file + "@" + name_ + std::string(layout::kTmpExt);
  if (!safetensors::WriteFile(tmp, metadata, tensors, err, /*exclusive=*/false)) return false;
  int e = RenameNoReplace(tmp, dest);
  if (e == 0) {
    *won = true;
    return true;
  }
  ::unlink(tmp.c_str());
  if (e == EEXIST) return true;  // another replica was first: same bytes
  *err = ErrnoMessage("rename(" + tmp + ", " + dest + ")", e);
  return false;
}

// ---------------------------------------------------------------------------

SpoolConsumer::SpoolConsumer(std::string root, std::string name, int producers)
    : SpoolConsumer(root, std::move(name), producers, std::make_unique<LocalDirTransport>(root)) {}
SpoolConsumer::SpoolConsumer(std::string root, std::string name, int producers,
                             std::unique_ptr<FrameTransport> transport)
    : paths_{std::move(root)}, transport_(std::move(transport)), name_(std::move(name)), producers_(producers) {}
SpoolConsumer::~SpoolConsumer() = default;
SpoolConsumer::SpoolConsumer(SpoolConsumer&&) noexcept = default;

bool SpoolConsumer::SetOrder(int rank, int world, int64_t start_round, std::string* err) {
  auto order = std::make_unique<SpoolOrder>(transport_.get(), producers_, rank, world, start_round);
  if (!order->Open(err)) return false;
  order_ = std::move(order);
  finding_.reset();
  return true;
}

const std::vector<std::string>& SpoolConsumer::order_skipped() const {
  static const std::vector<std::string> none;
  return order_ ? order_->skipped() : none;
}

double SpoolConsumer::waited_s() const { return waited_s_ + (order_ ? order_->waited_s() : 0.0); }

bool SpoolConsumer::PendingBytes(int64_t* out, std::string* err) const {
  *out = 0;
  std::vector<std::string> names;
  const std::string dir = paths_.PendingOf(name_);
  if (!ListDir(dir, &names, err)) return false;
  for (const std::string& n : names) {
    struct stat st {};
    if (::lstat((dir + "/" + n).c_str(), &st) == 0) *out += static_cast<int64_t>(st.st_blocks) * 512;
  }  // else committed meanwhile
  return true;
}

std::vector<std::string> SpoolConsumer::HeldElsewhere(const std::string& f) {
  std::vector<std::string> out, consumers;
  std::string ignored;
  if (transport_->Consumers(FrameState::kClaimed, &consumers, &ignored))
    for (const std::string& c : consumers)
      if (c != name_) out.push_back(transport_->Where(FrameState::kClaimed, c, f));
  if (transport_->Consumers(FrameState::kPending, &consumers, &ignored))
    for (const std::string& c : consumers) {
      if (c == name_) continue;
      std::vector<PendingFrame> pending;
      if (!PendingFramesOf(paths_, c, &pending, &ignored)) continue;
      for (const PendingFrame& p : pending)
        if (p.frame == f) out.push_back(p.path);
    }
  return out;
}

bool SpoolConsumer::Find(const std::string& f, const Deadline& deadline, ClaimedFrame* frame, bool* found,
                         bool* pass, std::string* err) {
  *found = *pass = false;
  ClaimedFrame c;
  c.file = f;
  ParseFrameFile(f, &c.producer, &c.seq);
  c.taken_back = true;
  if (auto replay = replay_.find(f); replay != replay_.end()) {
    c.path = replay->second;
    replay_.erase(replay);
    ++taken_back_;
    *frame = std::move(c);
    *found = true;
    return true;
  }
  const std::string mine = transport_->Where(FrameState::kClaimed, name_, f);
  c.path = mine;
  auto take = [&](bool taken_back) {
    c.taken_back = taken_back;
    taken_back_ += taken_back;
    *frame = std::move(c);
    *found = true;
    return true;
  };
  int64_t delay_us = 100;
  while (true) {
    if (FileExists(mine)) return take(true);
    if (int e = transport_->Claim(f, name_); e == 0) return take(false);
    else if (e != ENOENT) {
      *err = ErrnoMessage("claim of ready/" + f + " into " + mine, e);
      return false;
    }
    for (const std::string& other : HeldElsewhere(f)) {
      const int e = transport_->TakeOver(other, f, name_);
      if (e == 0) return take(true);  // taken over
      if (e != ENOENT) {
        *err = ErrnoMessage("rename(" + other + ", " + mine + ")", e);
        return false;
      }
    }
    if (transport_->Has(FrameState::kDone, f)) {
      if (hold_) {
        *err = name_ + ": frame " + f + " is next in the order at position " + std::to_string(position_) +
               " but done/ has it (a checkpoint committed it): the restored checkpoint and the spool disagree (was "
               "the checkpoint dir changed, or a newer checkpoint deleted?)";
        return false;
      }
      *pass = true;  // no checkpoint: acknowledged by an earlier attempt (at least once, as before)
      return true;
    }
    if (transport_->Has(FrameState::kRejected, f)) {
      *err = name_ + ": frame " + f + " is next in the order but was rejected (rejected/" + f +
             std::string(layout::kReasonExt) + ")";
      return false;
    }
    if (std::chrono::steady_clock::now() - finding_since_ > std::chrono::seconds(60)) {
      *err = name_ + ": frame " + f + " is next in the order but is nowhere in the spool";
      return false;
    }
    // Moving between directories as we looked: look again.
    if (!SleepBefore(deadline, &delay_us, 10'000)) return true;
  }
}

bool SpoolConsumer::NextInOrder(ClaimedFrame* frame, bool* end, std::string* err, const Deadline& deadline,
                                bool* not_yet) {
  using Clock = std::chrono::steady_clock;
  while (true) {
    // A stop flag is looked at every 100 ms of a wait.
    Deadline step = deadline;
    if (stop_) step = std::min(deadline.value_or(Clock::time_point::max()), Clock::now() + std::chrono::milliseconds(100));
    if (!finding_) {
      SpoolOrder::Step s;
      std::string producer;
      int64_t seq = 0;
      if (!order_->Next(step, &s, &producer, &seq, err)) return false;
      if (s == SpoolOrder::Step::kEnd) {
        *end = true;
        return true;
      }
      if (s == SpoolOrder::Step::kEntry) {
        finding_ = FrameFile(producer, seq);
        finding_since_ = Clock::now();
      }
    }
    if (finding_) {
      bool found = false, pass = false;
      if (!Find(*finding_, step, frame, &found, &pass, err)) return false;
      if (found || pass) finding_.reset();
      if (found) return true;
      if (pass) continue;
    }
    if (stop_ && *stop_) {
      stopped_ = *end = true;
      return true;
    }
    if (deadline && Clock::now() >= *deadline) {
      if (not_yet) *not_yet = true;
      return true;
    }
  }
}

bool SpoolConsumer::Open(std::string* err) {
  if (!transport_->Open(name_, err)) return false;
  RemoveRingLeftovers(paths_);
  if (!transport_->List(FrameState::kClaimed, name_, &take_back_, err)) return false;
  std::vector<Candidate> c;
  for (const std::string& f : take_back_) {
    Candidate k{0, "", f};
    ParseFrameFile(f, &k.producer, &k.seq);
    c.push_back(k);
  }
  std::sort(c.begin(), c.end());
  take_back_.clear();
  for (const Candidate& k : c) take_back_.push_back(k.file);
  return true;
}

bool SpoolConsumer::ProducersDone(bool* all, std::string* err) {
  *all = false;
  if (producers_ <= 0) return true;
  int n = 0;
  if (!transport_->EndCount(&n, err)) return false;
  *all = n >= producers_;
  return true;
}

bool SpoolConsumer::Next(ClaimedFrame* frame, bool* end, std::string* err, double timeout_s, bool* not_yet) {
  *end = false;
  if (not_yet) *not_yet = false;
  const Deadline deadline = not_yet ? DeadlineIn(timeout_s) : Deadline();
  if (order_) return NextInOrder(frame, end, err, deadline, not_yet);
  if (!take_back_.empty()) {
    ClaimedFrame f;
    f.file = take_back_.front();
    take_back_.erase(take_back_.begin());
    auto replay = replay_.find(f.file);
    f.path = replay != replay_.end() ? replay->second : transport_->Where(FrameState::kClaimed, name_, f.file);
    if (replay != replay_.end()) replay_.erase(replay);
    ParseFrameFile(f.file, &f.producer, &f.seq);
    f.taken_back = true;
    ++taken_back_;
    *frame = std::move(f);
    return true;
  }
  int64_t delay_us = 100;
  auto t0 = std::chrono::steady_clock::now();
  bool waited = false;
  std::vector<std::string> files;
  while (true) {
    if (!transport_->List(FrameState::kReady, "", &files, err)) return false;
    std::vector<Candidate> c;
    for (std::string& f : files) {
      Candidate k{0, "", std::move(f)};
      ParseFrameFile(k.file, &k.producer, &k.seq);
      c.push_back(std::move(k));
    }
    std::sort(c.begin(), c.end());
    for (const Candidate& k : c) {
      // The claim: exactly one consumer wins; the others get ENOENT.
      const int e = transport_->Claim(k.file, name_);
      if (e == 0) {
        if (waited) waited_s_ += Since(t0);
        *frame = {k.file, transport_->Where(FrameState::kClaimed, name_, k.file), k.producer, k.seq, false};
        return true;
      }
      if (e != ENOENT) {
        *err = ErrnoMessage("claim of ready/" + k.file + " by " + name_, e);
        return false;
      }
    }
    if (!c.empty()) continue;  // lost every race: look again at once
    bool all = false;
    if (!ProducersDone(&all, err)) return false;
    if (all) {
      // Markers first, then ready/: a producer publishes its last frame before its marker.
      if (!transport_->List(FrameState::kReady, "", &files, err)) return false;
      if (files.empty()) {
        if (waited) waited_s_ += Since(t0);
        *end = true;
        return true;
      }
      continue;
    }
    if (stop_ && *stop_) {
      stopped_ = *end = true;
      return true;
    }
    waited = true;
    if (!SleepBefore(deadline, &delay_us, 10'000)) {
      waited_s_ += Since(t0);
      *not_yet = true;
      return true;
    }
  }
}

bool SpoolConsumer::Ack(const ClaimedFrame& frame, std::string* err, bool drop_bytes) {
  if (hold_) {
    // Replaces (as Python's os.replace): a frame delivered again after a restore goes back under its new position.
    const int64_t at = frame.position >= 0 ? frame.position : position_;
    if (int e = transport_->Hold(frame.path, frame.file, name_, at)) {
      *err = ErrnoMessage("rename(" + frame.path + ", " + transport_->Where(FrameState::kPending, name_, frame.file, at) +
                              ")",
                          e);
      return false;
    }
    ++position_;
    ++acked_;
    return true;
  }
  const std::string to = transport_->Where(FrameState::kDone, name_, frame.file);
  if (int e = transport_->Ack(frame.path, frame.file)) {
    *err = e == EEXIST ? "frame " + frame.file + " was acknowledged before (done/ has it): producer " +
                             frame.producer + " published sequence number " + std::to_string(frame.seq) + " twice"
                       : ErrnoMessage("rename(" + frame.path + ", done/)", e);
    return false;
  }
  // The name is the record; the bytes go back to the producer (the ring), or go.
  if (drop_bytes && !Recycle(paths_, to)) TruncateFile(to);
  ++position_;
  ++acked_;
  return true;
}

bool SpoolConsumer::HoldForCheckpoint(std::string* err) {
  hold_ = true;
  return MakeDir(paths_.PendingOf(name_), err);
}

bool SpoolConsumer::Restore(int64_t position, const std::string& checkpoint, std::string* err) {
  int n = 0;
  return Restore(position, {}, checkpoint, &n, err);
}

bool SpoolConsumer::Restore(int64_t position, const std::map<std::string, int64_t>& positions,
                            const std::string& checkpoint, int* committed, std::string* err, const MayDrop* may_drop) {
  *committed = 0;
  if (!checkpoint.empty()) {
    std::map<std::string, int64_t> at = positions;
    if (at.empty()) at[name_] = position;
    if (!CommitPending(paths_, at, checkpoint, committed, err, may_drop)) return false;
    committed_ += *committed;
  }
  std::vector<PendingFrame> pending;
  if (!PendingFramesOf(paths_, name_, &pending, err)) return false;
  std::vector<std::string> order;
  replay_.clear();
  for (const PendingFrame& p : pending)
    if (p.position >= position) {
      order.push_back(p.frame);
      replay_[p.frame] = p.path;
    }
  for (std::string& f : take_back_)
    if (!replay_.count(f)) order.push_back(std::move(f));
  take_back_ = std::move(order);
  position_ = position;
  return true;
}

bool SpoolConsumer::Commit(int64_t position, const std::string& checkpoint, int* committed, std::string* err) {
  return Commit({{name_, position}}, checkpoint, committed, err);
}

bool SpoolConsumer::Commit(const std::map<std::string, int64_t>& positions, const std::string& checkpoint,
                           int* committed, std::string* err, const MayDrop* may_drop) {
  *committed = 0;
  if (!CommitPending(paths_, positions, checkpoint, committed, err, may_drop)) return false;
  committed_ += *committed;
  return true;
}

bool SpoolConsumer::Reject(const ClaimedFrame& frame, const std::string& reason, std::string* err) {
  return transport_->Reject(frame.path, frame.file, reason, err);
}

bool SpoolConsumer::WriteManifestIfFinal(const std::string& path, bool* written, std::string* err) {
  return spool::WriteManifestIfFinal(paths_.root, producers_, path, written, err);
}

bool WriteManifestIfFinal(const std::string& root, int producers, const std::string& path, bool* written,
                          std::string* err) {
  *written = false;
  if (producers <= 0) return true;
  // Cheap looks first (a few entries each): most calls end here.
  SpoolPaths paths{root};
  std::vector<std::string> names;
  if (!ListDir(paths.Producers(), &names, err)) return false;
  int finished = 0;
  std::string p;
  for (const std::string& f : names) finished += layout::ParseEndMarkerFile(f, &p);
  if (finished < producers) return true;
  if (!ListFrames(paths.Ready(), &names, err)) return false;
  if (!names.empty()) return true;
  if (!ListPendingFrames(paths, &names, err)) return false;
  if (!names.empty()) return true;  // a checkpoint commits them first
  nlohmann::ordered_json j;
  bool final = false;
  if (!Manifest(root, producers, &j, &final, err)) return false;
  if (!final) return true;
  if (!WriteFileAtomic(path, j.dump(2) + "\n", err, 0600)) return false;
  *written = true;
  return true;
}

bool Manifest(const std::string& root, int producers, nlohmann::ordered_json* out, bool* final, std::string* err) {
  SpoolPaths paths{root};
  std::vector<std::string> names;
  // Producers that finished, and how many frames each published.
  std::map<std::string, int64_t> published;
  if (!ListDir(paths.Producers(), &names, err)) return false;
  const std::string frames_key(layout::kEndFramesKey);
  for (const std::string& f : names) {
    std::string producer;
    if (!layout::ParseEndMarkerFile(f, &producer)) continue;
    std::string text;
    if (!ReadFile(paths.Producers() + "/" + f, &text, err)) return false;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    published[producer] = j.is_object() && j[frames_key].is_number() ? j[frames_key].get<int64_t>() : -1;
  }
  // In flow order (see SpoolProducer::Open).
  std::vector<std::string> ready, rejected;
  if (!ListFrames(paths.Ready(), &ready, err)) return false;
  int64_t claimed = 0;
  std::vector<std::string> consumers;
  if (!ListDir(paths.Claimed(), &consumers, err, true)) return false;
  for (const std::string& c : consumers) {
    if (!ListFrames(paths.ClaimedBy(c), &names, err)) return false;
    claimed += static_cast<int64_t>(names.size());
  }
  std::vector<std::string> pending;
  if (!ListPendingFrames(paths, &pending, err)) return false;
  std::map<std::string, std::set<int64_t>> done;
  // Which checkpoint committed each frame (its done/ record; "" for none: acknowledged without a checkpoint).
  std::map<std::pair<std::string, int64_t>, std::string> by;
  std::map<std::string, int64_t> by_checkpoint;
  if (!ListFrames(paths.Done(), &names, err)) return false;
  for (const std::string& f : names) {
    std::string p, ck;
    int64_t s;
    bool has = false;
    ParseFrameFile(f, &p, &s);
    done[p].insert(s);
    published.emplace(p, -1);  // frames from a producer that has not finished
    CommittedBy(paths.Done() + "/" + f, &ck, &has);
    if (has) {
      ++by_checkpoint[ck];
      by[{p, s}] = ck;
    }
  }
  if (!ListFrames(paths.Rejected(), &rejected, err)) return false;

  nlohmann::ordered_json per = nlohmann::ordered_json::object();
  int64_t total_pub = 0, total_done = 0, missing_total = 0, unexpected_total = 0;
  for (const auto& [p, n] : published) {
    const std::set<int64_t>& seqs = done[p];
    nlohmann::ordered_json missing = nlohmann::ordered_json::array(), unexpected = nlohmann::ordered_json::array();
    int64_t n_missing = 0, n_unexpected = 0;
    if (n >= 0) {
      for (int64_t s = 0; s < n; ++s)
        if (!seqs.count(s) && ++n_missing <= 20) missing.push_back(s);
      for (int64_t s : seqs)
        if (s >= n && ++n_unexpected <= 20) unexpected.push_back(s);
    }
    per[p] = {{m::kPublished, n >= 0 ? nlohmann::ordered_json(n) : nlohmann::ordered_json()},
              {m::kConsumed, seqs.size()},
              {m::kFirstSeq, seqs.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(*seqs.begin())},
              {m::kLastSeq, seqs.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(*seqs.rbegin())},
              {m::kMissing, n_missing},
              {m::kMissingSeqs, missing},
              {m::kUnexpected, n_unexpected},
              {m::kUnexpectedSeqs, unexpected},
              {m::kCommittedBy, CommittedRuns(p, seqs, by)}};
    total_pub += std::max<int64_t>(0, n);
    total_done += static_cast<int64_t>(seqs.size());
    missing_total += n_missing;
    unexpected_total += n_unexpected;
  }
  int64_t finished = 0;
  for (const auto& [p, n] : published) finished += n >= 0;
  *final = producers > 0 && finished >= producers && ready.empty() && claimed == 0 && pending.empty();
  nlohmann::ordered_json rej = nlohmann::ordered_json::array();
  for (const std::string& f : rejected) rej.push_back(f);
  *out = {{m::kFormat, layout::kManifestFormat},
          {m::kFinal, *final},
          {m::kProducersExpected, producers},
          {m::kProducersFinished, finished},
          {m::kFramesPublished, total_pub},
          {m::kFramesConsumed, total_done},
          {m::kReady, ready.size()},
          {m::kClaimed, claimed},
          {m::kPending, pending.size()},
          {m::kRejected, rej},
          {m::kCommittedByCheckpoint, by_checkpoint},
          {m::kExactlyOnce, *final && total_pub == total_done && missing_total == 0 && unexpected_total == 0 &&
                                rejected.empty()},
          {m::kProducers, per}};
  return true;
}

}  // namespace dflash::spool
