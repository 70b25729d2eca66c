// The hidden-state spool: frames from target processes to drafter processes
// on one host, through a plain directory (default under /dev/shm) and atomic
// rename(2). No daemon, no locks, no shared memory segment: every state of a
// frame is the directory it is in, so whatever process dies, the spool says
// exactly what was published, claimed and acknowledged. docs/builtin.md has
// the protocol; dflash_launch/spool/__init__.py speaks it too.
//
//   <root>/tmp/                      a producer writes a frame here first
//   <root>/ready/<p>-<seq>.safetensors   published (rename from tmp/, never replaces)
//   <root>/claimed/<consumer>/...    claimed by exactly one consumer (rename from ready/)
//   <root>/pending/<consumer>/<pos>.<f>  acknowledged by a checkpointing consumer, awaiting its checkpoint
//   <root>/done/...                  acknowledged after the training step (emptied: its bytes go to free/ or are
//                                    truncated), or
//                                    committed with a checkpoint (holding {"checkpoint": "<path>"})
//   <root>/rejected/... (+ .reason)  violated the contract; never acknowledged
//   <root>/producers/<p>.done        a producer's end: {"frames": n}
//   <root>/free/<p>-<seq>...         acknowledged frames' files, for producer p to write over (spool_ring.h)
//   <root>/weights.safetensors       the target's embedding and LM head (first publisher wins)
// The names are contract/spool_layout.h's: spelled there once, for every side.
#pragma once

#include <csignal>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/fd.h"
#include "contract/spool_layout.h"
#include "spool/safetensors.h"

namespace dflash::spool {

/// "<producer>-<seq as 10 digits>.safetensors" and its inverse (contract/spool_layout.h).
using layout::FrameFile;
using layout::ParseFrameFile;

/// The directories of one spool.
struct SpoolPaths {
  std::string root;
  std::string Tmp() const { return layout::Under(root, layout::kTmp); }
  std::string Ready() const { return layout::Under(root, layout::kReady); }
  std::string Claimed() const { return layout::Under(root, layout::kClaimed); }
  std::string ClaimedBy(const std::string& consumer) const { return Claimed() + "/" + consumer; }
  /// Acknowledged by a consumer that checkpoints, awaiting the checkpoint that covers it
  /// (dflash_launch.Checkpoint, docs/checkpoints.md): pending/<consumer>/<position:010d>.<frame>.
  std::string Pending() const { return layout::Under(root, layout::kPending); }
  std::string PendingOf(const std::string& consumer) const { return Pending() + "/" + consumer; }
  std::string Done() const { return layout::Under(root, layout::kDone); }
  std::string Rejected() const { return layout::Under(root, layout::kRejected); }
  std::string Producers() const { return layout::Under(root, layout::kProducers); }
  /// producers/<producer>.done: its end marker.
  std::string EndMarker(const std::string& producer) const {
    return Producers() + "/" + layout::EndMarkerFile(producer);
  }
  std::string Weights() const { return layout::Under(root, layout::kWeightsFile); }
  std::string BudgetLock() const { return layout::Under(root, layout::kBudgetLock); }
  /// The ring's files: acknowledged frames' bytes kept for their producer's next frames (spool_ring.h).
  std::string Free() const { return layout::Under(root, layout::kFree); }
  /// mkdir -p of the root (0700) and every subdirectory.
  bool Create(std::string* err) const;
};

/// The bytes the spool's frames hold against the byte budget (allocated
/// blocks): ready/, tmp/, free/ and every claimed/<consumer>/; not done/
/// (acknowledged frames are emptied). dflash_launch.spool.write.spool_bytes counts the same. `owner`: that producer's
/// frames only.
bool SpoolBytes(const SpoolPaths& paths, int64_t* bytes, std::string* err, const std::string& owner = "");

/// rename(2) that never replaces: 0, or the errno (EEXIST: `to` is there). A frame name seen twice is a bug to
/// report, not a file to overwrite. tmpfs and every local fs we care about support RENAME_NOREPLACE; elsewhere
/// link+unlink gives the same answer.
int RenameNoReplace(const std::string& from, const std::string& to);

/// The entries of `dir` (none if it does not exist); `dirs_only`: its subdirectories.
bool ListDir(const std::string& dir, std::vector<std::string>* names, std::string* err, bool dirs_only = false);

/// mkdir -p, 0700, the safe way (common/private_files.h): a spool dir that is a link, another user's, or writable
/// by others is refused, not joined; the drafters would train on whatever frames and weights its owner puts there.
bool MakeDir(const std::string& dir, std::string* err);

/// The names of the frame files in `dir` (other entries are ignored).
bool ListFrames(const std::string& dir, std::vector<std::string>* files, std::string* err);

/// The frames under pending/<every consumer>/, their "<position>." prefix taken off.
bool ListPendingFrames(const SpoolPaths& paths, std::vector<std::string>* files, std::string* err);

/// Sleeps 100 µs, doubling up to `max_us`, until Reset(): a poll that costs
/// nothing when frames flow and little when they do not.
class Backoff {
 public:
  explicit Backoff(int64_t max_us = 10'000) : max_us_(max_us) {}
  void Sleep();
  void Reset() { us_ = 100; }

 private:
  int64_t us_ = 100, max_us_;
};

class SpoolProducer {
 public:
  /// `max_ready`: Publish waits while ready/ holds this many unconsumed frames.
  /// `max_bytes`: and while the spool's frames (SpoolBytes) and the new one
  /// would pass this byte budget; 0: half the spool filesystem's free space
  /// at Open (dflash_launch.spool.write.default_max_bytes, the same rule).
  SpoolProducer(std::string root, std::string name, int max_ready, int64_t max_bytes = 0);

  /// Creates the layout, removes this producer's leftovers in tmp/ (a frame
  /// half-written when it died), and resumes after the highest sequence number
  /// it has anywhere in the spool. finished() if its end marker is there.
  bool Open(std::string* err);
  bool finished() const { return finished_; }
  int64_t next_seq() const { return next_seq_; }
  int removed_tmp() const { return removed_tmp_; }

  /// Writes the frame to tmp/, then renames it into ready/ under the next
  /// sequence number (RENAME_NOREPLACE: a clash is an error, never an
  /// overwrite). First waits while ready/ holds max_ready frames or the byte
  /// budget has no room for this one (then writes it holding the spool's
  /// budget.lock, as the Python producer does, so producers together stay
  /// within it); the wait is added to waited_s(). A frame larger than the
  /// whole budget, or a filesystem that cannot hold it (ENOSPC), is an error
  /// with nothing published and nothing lost. `metadata` gets "producer" and "seq".
  bool Publish(safetensors::Metadata metadata, const std::vector<safetensors::TensorRef>& tensors, int64_t* seq,
               std::string* err);
  double waited_s() const { return waited_s_; }

  /// producers/<name>.done: no more frames from this producer.
  bool Finish(std::string* err);

  /// Publishes <root>/<file> once for the whole spool: the first publisher
  /// wins, later ones (identical replicas) leave it. `*won` if we wrote it.
  bool PublishShared(const std::string& file, const safetensors::Metadata& metadata,
                     const std::vector<safetensors::TensorRef>& tensors, bool* won, std::string* err);

 private:
  /// Returns holding <root>/budget.lock (flock, in `lock`) once `size` more bytes fit; `*reuse`: a file of this
  /// producer's in free/ to write the frame over (its bytes counted already), or empty for a new file.
  bool WaitForRoom(uint64_t size, UniqueFd* lock, std::string* reuse, std::string* err);

  SpoolPaths paths_;
  std::string name_;
  int max_ready_;
  int64_t max_bytes_;
  int64_t next_seq_ = 0;
  int removed_tmp_ = 0;
  bool finished_ = false;
  double waited_s_ = 0;
};

/// A frame this consumer holds: claimed/<consumer>/<file>.
struct ClaimedFrame {
  std::string file;
  std::string path;
  std::string producer;
  int64_t seq = -1;
  bool taken_back = false;  // claimed by an earlier attempt of this consumer, or delivered again after a restore
};

class SpoolConsumer {
 public:
  /// `producers`: how many producers will mark their end (DFLASH_SPOOL_PRODUCERS);
  /// 0 means unknown: the consumer never decides on its own that the spool ended.
  SpoolConsumer(std::string root, std::string name, int producers);

  /// Creates the layout and takes back the frames an earlier attempt of this
  /// consumer (same name) claimed and never acknowledged.
  bool Open(std::string* err);

  /// The next frame: first those taken back, then the oldest in ready/ (lowest
  /// seq, then producer name), claimed by rename: exactly one consumer wins.
  /// Polls with back-off while nothing is ready. `*end` when every producer
  /// has finished and nothing is left to claim, or (StopWhen) a stop came.
  bool Next(ClaimedFrame* frame, bool* end, std::string* err);

  /// Next stops waiting for frames (`*end`, stopped()) once `*flag` is non-zero (a signal handler sets it).
  void StopWhen(const volatile std::sig_atomic_t* flag) { stop_ = flag; }
  bool stopped() const { return stopped_; }

  /// After the step: into done/ (RENAME_NOREPLACE: acknowledging a frame twice
  /// is an error), then its bytes handed back to its producer (spool::Recycle)
  /// or truncated. REQUIRES: nothing maps the frame any more. Holding for a checkpoint:
  /// into pending/<consumer>/<position>.<frame>, bytes kept, until Commit.
  /// Either way position() moves on by one.
  bool Ack(const ClaimedFrame& frame, std::string* err);

  /// From now on Ack leaves frames pending (pending/<consumer>/) for the checkpoint that covers them
  /// (dflash_launch.spool.source.SpoolSource.hold_for_checkpoint; docs/checkpoints.md).
  bool HoldForCheckpoint(std::string* err);

  /// Back to `position`, as a restored checkpoint recorded it (0: none). With `checkpoint` (its path) the frames
  /// pending before `position` are committed first (a kill may have come between its rename and its commit); the
  /// frames pending at or after it are delivered again by Next, first and in their order.
  bool Restore(int64_t position, const std::string& checkpoint, std::string* err);

  /// The checkpoint at `checkpoint` committed, having recorded `position`: this consumer's frames pending before
  /// it move to done/ with its record (spool::CommitPending). `*committed`: how many.
  bool Commit(int64_t position, const std::string& checkpoint, int* committed, std::string* err);

  /// Into rejected/, with <file>.reason; never acknowledged.
  bool Reject(const ClaimedFrame& frame, const std::string& reason, std::string* err);

  /// spool::WriteManifestIfFinal for this consumer's spool.
  bool WriteManifestIfFinal(const std::string& path, bool* written, std::string* err);

  int taken_back() const { return taken_back_; }
  int acked() const { return acked_; }
  /// Frames handed to training and acknowledged so far, counted from the restored checkpoint's position: what a
  /// checkpoint records.
  int64_t position() const { return position_; }
  int committed() const { return committed_; }
  double waited_s() const { return waited_s_; }
  const SpoolPaths& paths() const { return paths_; }
  const std::string& name() const { return name_; }

 private:
  bool ProducersDone(bool* all, std::string* err);

  SpoolPaths paths_;
  std::string name_;
  int producers_;
  std::vector<std::string> take_back_;
  std::map<std::string, std::string> replay_;  // frame -> its pending path, delivered again after Restore
  bool hold_ = false, stopped_ = false;
  const volatile std::sig_atomic_t* stop_ = nullptr;
  int64_t position_ = 0;
  int taken_back_ = 0, acked_ = 0, committed_ = 0;
  double waited_s_ = 0;
};

/// If the spool is final (every one of `producers` finished; nothing ready or
/// claimed), writes its manifest to `path` and sets `*written`. Called by a
/// consumer after each ack and by a producer after its end marker: whoever
/// makes the state final sees it, and everyone who sees it writes the same.
bool WriteManifestIfFinal(const std::string& root, int producers, const std::string& path, bool* written,
                          std::string* err);

/// What the spool holds now: per producer its end marker's count and the
/// sequence numbers acknowledged in done/, missing or unexpected; what is
/// still ready, claimed or rejected. `*final` if every one of `producers`
/// finished and nothing is ready or claimed.
bool Manifest(const std::string& root, int producers, nlohmann::ordered_json* out, bool* final, std::string* err);

}  // namespace dflash::spool
