// The spool's transport seam (issue #56 item 2): where a frame's states are kept and how it moves between them,
// behind one interface, so that a second transport (several nodes: bytes over RDMA, states in a store; issue #57)
// is written once, here, for the C++ roles, the launcher and Python alike. SpoolProducer, SpoolConsumer, SpoolOrder
// and the launcher's frame counts go through it.
//
// A frame is named by contract/spool_layout.h's FrameFile everywhere; a transport keeps, for each frame, one state
// (FrameState) and, while a consumer holds it, whose it is. Every move is atomic and says who won: two consumers
// claiming one frame, one gets it. A frame's bytes are reached through Where(): the path of a file this process can
// map (LocalDirTransport: the frame's file itself).
//
// What stays beside the seam, on the local directory only: the byte budget and the ring of reused files
// (spool_ring.h: they manage the pages of a local filesystem) and the commit of pending frames with a checkpoint
// (spool_commit.h). A remote transport brings its own budget.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "spool/spool.h"

namespace dflash::spool {

enum class FrameState { kWriting, kReady, kClaimed, kPending, kDone, kRejected };

/// How many frames are in each state (claimed and pending: every consumer's together).
struct FrameCounts {
  bool present = false;  ///< the spool exists
  int64_t writing = 0, ready = 0, claimed = 0, pending = 0, done = 0, rejected = 0;
};

class FrameTransport {
 public:
  virtual ~FrameTransport() = default;

  /// Every state's place (Create: made if missing); a consumer's own claim place too when `consumer` is given.
  virtual bool Open(const std::string& consumer, std::string* err) = 0;

  // ---- what is where ----
  /// The frames in `state`; claimed and pending: `consumer`'s (its pending frames by their frame name), or every
  /// consumer's when `consumer` is empty. In no particular order.
  virtual bool List(FrameState state, const std::string& consumer, std::vector<std::string>* frames,
                    std::string* err) = 0;
  /// The consumers that hold frames in `state` (kClaimed or kPending).
  virtual bool Consumers(FrameState state, std::vector<std::string>* consumers, std::string* err) = 0;
  /// Whether `frame` is in `state` (kDone or kRejected: no owner).
  virtual bool Has(FrameState state, const std::string& frame) = 0;
  /// The frames in each state; `with_done` false leaves done 0 (done/ only grows: its count is the costly one).
  virtual FrameCounts Count(bool with_done) = 0;
  /// Where `consumer`'s `frame` in `state` is, as a path this process can map (claimed: its claim; pending: the
  /// pending name at `position`).
  virtual std::string Where(FrameState state, const std::string& consumer, const std::string& frame,
                            int64_t position = 0) = 0;

  // ---- the moves: 0, or an errno (ENOENT: not there any more -- another consumer was first) ----
  /// A frame written at Where(kWriting, producer, frame) becomes ready; never replaces (EEXIST: a seq clash).
  virtual int Publish(const std::string& producer, const std::string& frame) = 0;
  /// ready -> claimed by `consumer`: exactly one claimer wins.
  virtual int Claim(const std::string& frame, const std::string& consumer) = 0;
  /// The frame at `from` (another consumer's claim or pending frame, or this one's replay) -> claimed by `consumer`.
  virtual int TakeOver(const std::string& from, const std::string& frame, const std::string& consumer) = 0;
  /// The frame at `at` -> done; never replaces (EEXIST: acknowledged before).
  virtual int Ack(const std::string& at, const std::string& frame) = 0;
  /// The frame at `at` -> pending for `consumer` at `position` (replaces: a replayed frame goes back under its
  /// new position).
  virtual int Hold(const std::string& at, const std::string& frame, const std::string& consumer, int64_t position) = 0;
  /// The frame at `at` -> rejected, with `reason` beside it.
  virtual bool Reject(const std::string& at, const std::string& frame, const std::string& reason,
                      std::string* err) = 0;

  // ---- producers' ends ----
  /// `producer` published `frames` frames and ends.
  virtual bool MarkEnd(const std::string& producer, int64_t frames, std::string* err) = 0;
  /// {producer: frames} of the ends marked so far (an end still being written is not there yet).
  virtual bool Ends(std::map<std::string, int64_t>* ends, std::string* err) = 0;
  /// How many producers marked their end (cheaper than Ends: names only).
  virtual bool EndCount(int* n, std::string* err) = 0;
};

/// Today's transport, the default: one directory on a local filesystem (/dev/shm by default), a state per
/// subdirectory, every move one rename(2) (contract/spool_layout.h has the layout).
class LocalDirTransport final : public FrameTransport {
 public:
  explicit LocalDirTransport(std::string root) : paths_{std::move(root)} {}
  const SpoolPaths& paths() const { return paths_; }

  bool Open(const std::string& consumer, std::string* err) override;
  bool List(FrameState state, const std::string& consumer, std::vector<std::string>* frames,
            std::string* err) override;
  bool Consumers(FrameState state, std::vector<std::string>* consumers, std::string* err) override;
  bool Has(FrameState state, const std::string& frame) override;
  FrameCounts Count(bool with_done) override;
  std::string Where(FrameState state, const std::string& consumer, const std::string& frame,
                    int64_t position = 0) override;
  int Publish(const std::string& producer, const std::string& frame) override;
  int Claim(const std::string& frame, const std::string& consumer) override;
  int TakeOver(const std::string& from, const std::string& frame, const std::string& consumer) override;
  int Ack(const std::string& at, const std::string& frame) override;
  int Hold(const std::string& at, const std::string& frame, const std::string& consumer, int64_t position) override;
  bool Reject(const std::string& at, const std::string& frame, const std::string& reason, std::string* err) override;
  bool MarkEnd(const std::string& producer, int64_t frames, std::string* err) override;
  bool Ends(std::map<std::string, int64_t>* ends, std::string* err) override;
  bool EndCount(int* n, std::string* err) override;

 private:
  std::string StateDir(FrameState state) const;
  SpoolPaths paths_;
};

}  // namespace dflash::spool
