// The spool's frames in one fixed order, whatever the timing: what a DDP world's ranks are dealt, so a restarted
// world replays exactly what the killed one would have stepped on (docs/checkpoints.md; Python's WorldSource
// walks it through the C ABI).
//
// The order: producers by name, sequence numbers in turns -- cycle c takes frame c of each producer (sorted by
// name) that publishes more than c frames. With producers A (3 frames) and B (1): A0 B0 A1 A2. Rank r of a world
// of W takes entries r, r + W, r + 2W, ...: round k of the world is entries kW .. kW + W - 1.
//
// An entry is known once its producer published it (it is somewhere in the spool) or said how many it publishes
// (its end marker); until then the ranks wait: a slow producer paces the world. The producers' names must all be
// known before cycle 0 (each producer's first frame or its end marker names it); the count comes from
// DFLASH_SPOOL_PRODUCERS.
//
// A frame quarantined in rejected/ before the walk began is not in the order: every rank skips it alike (each
// builds its order at the world's start, when rejected/ holds the same frames for all), so a world stopped by a
// bad frame resumes past it, in step. A frame is rejected only by the round that meets it, and that round ends the
// world (exit 65): every checkpoint the world resumes from lies before it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "spool/frame_transport.h"
#include "spool/spool.h"

namespace dflash::spool {

class SpoolOrder {
 public:
  /// Rank `rank` of a world of `world`, from round `start_round` (a restored checkpoint's), over `transport`
  /// (not owned; it outlives the order).
  SpoolOrder(FrameTransport* transport, int producers, int rank, int world, int64_t start_round);
  /// The same over the local directory `paths`.
  SpoolOrder(SpoolPaths paths, int producers, int rank, int world, int64_t start_round);
  ~SpoolOrder();

  /// Reads rejected/ (the frames out of the order). False when the producer count is unknown (<= 0).
  bool Open(std::string* err);

  enum class Step { kEntry, kEnd, kNotYet };
  /// This rank's next entry (*producer, *seq: kEntry), the order's end before it (kEnd), or kNotYet when
  /// `deadline` passed with the entry not known yet (call again: the walk resumes where it was).
  bool Next(const Deadline& deadline, Step* step, std::string* producer, int64_t* seq, std::string* err);

  /// The rejected frames the walk passed, in order.
  const std::vector<std::string>& skipped() const { return skipped_; }
  double waited_s() const { return waited_s_; }
  int64_t index() const { return index_; }

 private:
  bool Scan(std::string* err);
  /// 1: `prod` publishes frame `cycle`; 0: it does not; -1: not known yet.
  int Has(const std::string& prod, int64_t cycle) const;
  bool Ended() const;
  /// The next entry of the whole order (any rank's): kEntry, kEnd or kNotYet.
  bool NextEntry(const Deadline& deadline, Step* step, std::string* producer, int64_t* seq, std::string* err);

  std::unique_ptr<FrameTransport> own_;
  FrameTransport* transport_;
  int producers_, rank_, world_;
  int64_t skip_;                           // entries before this rank's first: start_round * world + rank
  std::optional<std::vector<std::string>> names_;  // the producers, sorted, once all are known
  std::map<std::string, int64_t> high_;    // producer -> highest seq seen anywhere
  std::map<std::string, int64_t> count_;   // producer -> frames it published (its end marker)
  int64_t cycle_ = 0;
  size_t slot_ = 0;
  int64_t index_ = 0;                      // entries walked so far
  std::set<std::string> rejected_;
  std::vector<std::string> skipped_;
  double waited_s_ = 0;
};

}  // namespace dflash::spool
