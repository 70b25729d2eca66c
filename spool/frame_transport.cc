#include "spool/frame_transport.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "spool/spool_commit.h"

namespace dflash::spool {
namespace {

/// Entries of `dir` (not . and ..) for which `keep` holds; with `subdirs`, those of its subdirectories instead.
/// A missing directory counts 0: the metrics look at a spool that may come and go.
template <typename Keep>
int64_t CountIn(const std::string& dir, Keep keep, bool subdirs = false) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  int64_t n = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (subdirs) {
      if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN) n += CountIn(dir + "/" + e->d_name, keep);
      continue;
    }
    n += keep(std::string_view(e->d_name));
  }
  ::closedir(d);
  return n;
}

bool IsFrame(std::string_view name) {
  std::string p;
  int64_t s;
  return ParseFrameFile(name, &p, &s);
}

bool IsPending(std::string_view name) {
  int64_t pos;
  std::string f;
  return ParsePendingName(name, &pos, &f);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

std::string LocalDirTransport::StateDir(FrameState state) const {
  switch (state) {
    case FrameState::kWriting: return paths_.Tmp();
    case FrameState::kReady: return paths_.Ready();
    case FrameState::kClaimed: return paths_.Claimed();
    case FrameState::kPending: return paths_.Pending();
    case FrameState::kDone: return paths_.Done();
    case FrameState::kRejected: return paths_.Rejected();
  }
  return paths_.root;
}

bool LocalDirTransport::Open(const std::string& consumer, std::string* err) {
  return paths_.Create(err) && (consumer.empty() || MakeDir(paths_.ClaimedBy(consumer), err));
}

bool LocalDirTransport::List(FrameState state, const std::string& consumer, std::vector<std::string>* frames,
                             std::string* err) {
  frames->clear();
  if (state == FrameState::kPending) {
    if (consumer.empty()) return ListPendingFrames(paths_, frames, err);
    std::vector<PendingFrame> pending;
    if (!PendingFramesOf(paths_, consumer, &pending, err)) return false;
    for (PendingFrame& p : pending) frames->push_back(std::move(p.frame));
    return true;
  }
  if (state != FrameState::kClaimed) return ListFrames(StateDir(state), frames, err);
  if (!consumer.empty()) return ListFrames(paths_.ClaimedBy(consumer), frames, err);
  std::vector<std::string> consumers, names;
  if (!Consumers(FrameState::kClaimed, &consumers, err)) return false;
  for (const std::string& c : consumers) {
    std::string ignored;  // a consumer's dir removed meanwhile
    if (ListFrames(paths_.ClaimedBy(c), &names, &ignored)) frames->insert(frames->end(), names.begin(), names.end());
  }
  return true;
}

bool LocalDirTransport::Consumers(FrameState state, std::vector<std::string>* consumers, std::string* err) {
  return ListDir(state == FrameState::kPending ? paths_.Pending() : paths_.Claimed(), consumers, err, true);
}

bool LocalDirTransport::Has(FrameState state, const std::string& frame) {
  return Exists(StateDir(state) + "/" + frame);
}

FrameCounts LocalDirTransport::Count(bool with_done) {
  FrameCounts c;
  struct stat st {};
  if (paths_.root.empty() || ::stat(paths_.root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return c;
  c.present = true;
  c.writing = CountIn(paths_.Tmp(), [](std::string_view) { return true; });  // temporary names: every entry
  c.ready = CountIn(paths_.Ready(), IsFrame);
  c.claimed = CountIn(paths_.Claimed(), IsFrame, true);
  c.pending = CountIn(paths_.Pending(), IsPending, true);
  if (with_done) c.done = CountIn(paths_.Done(), IsFrame);
  c.rejected = CountIn(paths_.Rejected(), IsFrame);
  return c;
}

std::string LocalDirTransport::Where(FrameState state, const std::string& consumer, const std::string& frame,
                                     int64_t position) {
  switch (state) {
    case FrameState::kWriting: return paths_.Tmp() + "/" + frame + std::string(layout::kTmpExt);
    case FrameState::kClaimed: return paths_.ClaimedBy(consumer) + "/" + frame;
    case FrameState::kPending: return paths_.PendingOf(consumer) + "/" + PendingName(position, frame);
    default: return StateDir(state) + "/" + frame;
  }
}

int LocalDirTransport::Publish(const std::string& producer, const std::string& frame) {
  return RenameNoReplace(Where(FrameState::kWriting, producer, frame), paths_.Ready() + "/" + frame);
}

int LocalDirTransport::Claim(const std::string& frame, const std::string& consumer) {
  // The claim: whoever renames first owns it; the others get ENOENT.
  return ::rename((paths_.Ready() + "/" + frame).c_str(), Where(FrameState::kClaimed, consumer, frame).c_str()) == 0
             ? 0
             : errno;
}

int LocalDirTransport::TakeOver(const std::string& from, const std::string& frame, const std::string& consumer) {
  return ::rename(from.c_str(), Where(FrameState::kClaimed, consumer, frame).c_str()) == 0 ? 0 : errno;
}

int LocalDirTransport::Ack(const std::string& at, const std::string& frame) {
  return RenameNoReplace(at, paths_.Done() + "/" + frame);
}

int LocalDirTransport::Hold(const std::string& at, const std::string& frame, const std::string& consumer,
                            int64_t position) {
  return ::rename(at.c_str(), Where(FrameState::kPending, consumer, frame, position).c_str()) == 0 ? 0 : errno;
}

bool LocalDirTransport::Reject(const std::string& at, const std::string& frame, const std::string& reason,
                               std::string* err) {
  const std::string to = paths_.Rejected() + "/" + frame;
  if (!WriteFileAtomic(to + std::string(layout::kReasonExt), reason + "\n", err, 0600)) return false;
  if (::rename(at.c_str(), to.c_str()) != 0) {
    *err = ErrnoMessage("rename(" + at + ", rejected/)", errno);
    return false;
  }
  return true;
}

bool LocalDirTransport::MarkEnd(const std::string& producer, int64_t frames, std::string* err) {
  nlohmann::ordered_json j = {{layout::kEndProducerKey, producer}, {layout::kEndFramesKey, frames}};
  return WriteFileAtomic(paths_.EndMarker(producer), j.dump() + "\n", err, 0600);
}

bool LocalDirTransport::Ends(std::map<std::string, int64_t>* ends, std::string* err) {
  ends->clear();
  std::vector<std::string> names;
  if (!ListDir(paths_.Producers(), &names, err)) return false;
  const std::string key(layout::kEndFramesKey);
  for (const std::string& f : names) {
    std::string producer, text, ignored;
    if (!layout::ParseEndMarkerFile(f, &producer) || !ReadFile(paths_.Producers() + "/" + f, &text, &ignored))
      continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object() && j.contains(key) && j[key].is_number_integer()) (*ends)[producer] = j[key].get<int64_t>();
  }
  return true;
}

bool LocalDirTransport::EndCount(int* n, std::string* err) {
  *n = 0;
  std::vector<std::string> names;
  if (!ListDir(paths_.Producers(), &names, err)) return false;
  std::string p;
  for (const std::string& f : names) *n += layout::ParseEndMarkerFile(f, &p);
  return true;
}

}  // namespace dflash::spool
