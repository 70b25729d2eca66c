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

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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

/// How long a call may wait: none, as long as it takes (a C++ role's loop); a time point, and the call returns
/// "not yet" once it passed (the C ABI: Python loops over short waits so its signal handlers run between them).
using Deadline = std::optional<std::chrono::steady_clock::time_point>;
/// A bound of `timeout_s` seconds from now; < 0: none.
Deadline DeadlineIn(double timeout_s);
/// Sleeps `*delay_us` (at most until `deadline`), then doubles it up to `max_us`; false, without sleeping, once
/// `deadline` passed.
bool SleepBefore(const Deadline& deadline, int64_t* delay_us, int64_t max_us);

/// The byte budget: $DFLASH_SPOOL_MAX_BYTES (dflash-launch sets it from [run] spool_max_bytes; an error if it is
/// not a positive count), else half the free space of the filesystem holding `root`
/// (dflash_launch.spool.write.default_max_bytes).
bool DefaultMaxBytes(const std::string& root, int64_t* out, std::string* err);

/// {frame: checkpoint} of done/'s commit records (a restore checks them against the checkpoints it can take).
bool CommittedRecords(const SpoolPaths& paths, std::map<std::string, std::string>* out, std::string* err);

/// How many consumers have claimed so far (claimed/<consumer>/ directories).
bool ConsumerCount(const SpoolPaths& paths, int* out, std::string* err);

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

class FrameTransport;

class SpoolProducer {
 public:
  /// `max_ready`: Publish waits while ready/ holds this many unconsumed frames.
  /// `max_bytes`: and while the spool's frames (SpoolBytes) and the new one
  /// would pass this byte budget; 0: half the spool filesystem's free space
  /// at Open (dflash_launch.spool.write.default_max_bytes, the same rule).
  SpoolProducer(std::string root, std::string name, int max_ready, int64_t max_bytes = 0);
  ~SpoolProducer();
  SpoolProducer(SpoolProducer&&) noexcept;

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
  /// With `not_yet`, the wait for room ends after `timeout_s` (< 0: none): true with *not_yet, nothing written.
  /// `*err_no`: ENOSPC when the filesystem could not hold the frame (nothing published), else 0.
  bool Publish(safetensors::Metadata metadata, const std::vector<safetensors::TensorRef>& tensors, int64_t* seq,
               std::string* err, double timeout_s = -1, bool* not_yet = nullptr, int* err_no = nullptr);
  double waited_s() const { return waited_s_; }
  /// How many producers share the byte budget (each keeps max_bytes / n); 0, the default: $DFLASH_SPOOL_PRODUCERS.
  void set_producers(int n) { producers_ = n; }
  /// The byte budget (after Open: the default's value when 0 was given).
  int64_t max_bytes() const { return max_bytes_; }

  /// producers/<name>.done: no more frames from this producer.
  bool Finish(std::string* err);

  /// Publishes <root>/<file> once for the whole spool: the first publisher
  /// wins, later ones (identical replicas) leave it. `*won` if we wrote it.
  bool PublishShared(const std::string& file, const safetensors::Metadata& metadata,
                     const std::vector<safetensors::TensorRef>& tensors, bool* won, std::string* err);

 private:
  /// Returns holding <root>/budget.lock (flock, in `lock`) once `size` more bytes fit; `*reuse`: a file of this
  /// producer's in free/ to write the frame over (its bytes counted already), or empty for a new file.
  /// `*not_yet`: `deadline` passed first (no lock held, nothing reserved).
  bool WaitForRoom(uint64_t size, UniqueFd* lock, std::string* reuse, std::string* err, const Deadline& deadline,
                   bool* not_yet);

  SpoolPaths paths_;
  std::unique_ptr<FrameTransport> transport_;  // the frames' states (frame_transport.h); the budget is paths_'
  std::string name_;
  int max_ready_;
  int64_t max_bytes_;
  int producers_ = 0;
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
  /// The consumer's position when it took the frame (Python's: samples handed out); -1: its acks so far.
  /// A checkpointing Ack names the pending file after it.
  int64_t position = -1;
};

class SpoolOrder;

/// The commit's say over a frame's bytes: false keeps them from the ring and from the truncate (a view of the
/// caller's, or a rank of another process, may still map the file): the pending file is only unlinked.
using MayDrop = std::function<bool(const std::string& consumer, const std::string& frame)>;

class SpoolConsumer {
 public:
  /// `producers`: how many producers will mark their end (DFLASH_SPOOL_PRODUCERS);
  /// 0 means unknown: the consumer never decides on its own that the spool ended.
  SpoolConsumer(std::string root, std::string name, int producers);
  /// The same over another transport of the frames' states (frame_transport.h); `root` keeps what stays local:
  /// the ring, the commit's pending/.
  SpoolConsumer(std::string root, std::string name, int producers, std::unique_ptr<FrameTransport> transport);
  ~SpoolConsumer();
  SpoolConsumer(SpoolConsumer&&) noexcept;

  /// Creates the layout and takes back the frames an earlier attempt of this
  /// consumer (same name) claimed and never acknowledged.
  bool Open(std::string* err);

  /// The next frame: first those taken back, then the oldest in ready/ (lowest
  /// seq, then producer name), claimed by rename: exactly one consumer wins.
  /// Polls with back-off while nothing is ready. `*end` when every producer
  /// has finished and nothing is left to claim, or (StopWhen) a stop came.
  /// With `not_yet`, waits at most `timeout_s` (< 0: no bound, 0: one look): true with *not_yet when nothing came.
  /// In a fixed order (SetOrder): the frame the order names next, wherever it is -- delivered again after a
  /// restore, claimed here (taken back), ready (claimed now), held by another consumer (taken over); an error when
  /// done/ has it and this consumer checkpoints (the checkpoint and the spool disagree), when it was rejected, or
  /// when it is nowhere for 60 s; a frame done/ has without a checkpoint (acknowledged by an earlier attempt) is
  /// passed. The 60 s run across calls that returned not yet.
  bool Next(ClaimedFrame* frame, bool* end, std::string* err, double timeout_s = -1, bool* not_yet = nullptr);

  /// From now on Next deals the spool's fixed order (spool_order.h): rank `rank` of `world`, from `start_round`.
  /// False when the producer count is unknown.
  bool SetOrder(int rank, int world, int64_t start_round, std::string* err);
  /// The quarantined frames the order passed, in order (none without an order).
  const std::vector<std::string>& order_skipped() const;

  /// Next stops waiting for frames (`*end`, stopped()) once `*flag` is non-zero (a signal handler sets it).
  void StopWhen(const volatile std::sig_atomic_t* flag) { stop_ = flag; }
  bool stopped() const { return stopped_; }

  /// After the step: into done/ (RENAME_NOREPLACE: acknowledging a frame twice
  /// is an error), then its bytes handed back to its producer (spool::Recycle)
  /// or truncated. REQUIRES: nothing maps the frame any more. Holding for a checkpoint:
  /// into pending/<consumer>/<position>.<frame>, bytes kept, until Commit.
  /// Either way position() moves on by one.
  /// `drop_bytes` false: the rename only, the bytes kept (a view still maps them); the caller hands them on later
  /// (spool::Recycle, else TruncateFile) once nothing maps the frame.
  bool Ack(const ClaimedFrame& frame, std::string* err, bool drop_bytes = true);

  /// From now on Ack leaves frames pending (pending/<consumer>/) for the checkpoint that covers them
  /// (dflash_launch.spool.source.SpoolSource.hold_for_checkpoint; docs/checkpoints.md).
  bool HoldForCheckpoint(std::string* err);

  /// Back to `position`, as a restored checkpoint recorded it (0: none). With `checkpoint` (its path) the frames
  /// pending before `position` are committed first (a kill may have come between its rename and its commit); the
  /// frames pending at or after it are delivered again by Next, first and in their order.
  bool Restore(int64_t position, const std::string& checkpoint, std::string* err);
  /// The same, committing first the frames pending before `positions` ({consumer: position}, the restored
  /// checkpoint's; empty: this consumer's `position`), with `may_drop`'s say over their bytes.
  bool Restore(int64_t position, const std::map<std::string, int64_t>& positions, const std::string& checkpoint,
               int* committed, std::string* err, const MayDrop* may_drop = nullptr);

  /// The checkpoint at `checkpoint` committed, having recorded `position`: this consumer's frames pending before
  /// it move to done/ with its record (spool::CommitPending). `*committed`: how many.
  bool Commit(int64_t position, const std::string& checkpoint, int* committed, std::string* err);
  /// The same for every consumer a checkpoint recorded ({consumer: position}: a world's ranks).
  bool Commit(const std::map<std::string, int64_t>& positions, const std::string& checkpoint, int* committed,
              std::string* err, const MayDrop* may_drop = nullptr);

  /// The bytes of the frames this consumer acknowledged that wait in pending/ for a checkpoint.
  bool PendingBytes(int64_t* out, std::string* err) const;

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
  /// Seconds Next waited for frames (the order's wait for its entries included).
  double waited_s() const;
  bool holding() const { return hold_; }
  const SpoolPaths& paths() const { return paths_; }
  const std::string& name() const { return name_; }

 private:
  bool ProducersDone(bool* all, std::string* err);
  bool NextInOrder(ClaimedFrame* frame, bool* end, std::string* err, const Deadline& deadline, bool* not_yet);
  /// The named frame `f`, wherever it is: *found (claimed here now), *pass (done/ has it, no checkpoint), or
  /// neither when `deadline` passed first.
  bool Find(const std::string& f, const Deadline& deadline, ClaimedFrame* frame, bool* found, bool* pass,
            std::string* err);
  /// Where other consumers hold `f`: claimed/<other>/f, pending/<other>/<pos>.f.
  std::vector<std::string> HeldElsewhere(const std::string& f);

  SpoolPaths paths_;
  std::unique_ptr<FrameTransport> transport_;  // every state move of a frame goes through it
  std::string name_;
  int producers_;
  std::vector<std::string> take_back_;
  std::map<std::string, std::string> replay_;  // frame -> its pending path, delivered again after Restore
  bool hold_ = false, stopped_ = false;
  const volatile std::sig_atomic_t* stop_ = nullptr;
  int64_t position_ = 0;
  int taken_back_ = 0, acked_ = 0, committed_ = 0;
  double waited_s_ = 0;
  std::unique_ptr<SpoolOrder> order_;
  std::optional<std::string> finding_;  // the order's entry being looked for (across not-yet returns)
  std::chrono::steady_clock::time_point finding_since_;
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
