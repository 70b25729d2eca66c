// What one node launcher concludes about the others from what it reads in the
// coordination store: who has been seen alive (its heartbeat counter advanced
// under one instance nonce), who is gone (its registration vanished without a
// "done", it was replaced by another instance, or its heartbeat stalled), and
// the grace everyone gets after the store itself was away. Pure: no store, no
// clock of its own (node_coordinator.cc feeds it; peer_tracker_test.cc fakes it).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/duration.h"

namespace dflash {

/// One peer's registration as read in one poll.
struct PeerView {
  bool present = false;   ///< its dflash:<run>:node:<r> key exists
  std::string nonce;      ///< the instance that wrote it
  long long heartbeat = 0;
  bool done = false;      ///< it published dflash:<run>:<session>:done:<r> (a clean end, not a death)
};

class PeerTracker {
 public:
  /// `ttl`: a registration lives this long unrefreshed (refreshed every ttl/3).
  PeerTracker(int nnodes, int self, Millis ttl);

  void Observe(int node, const PeerView& view, SteadyTime now);
  /// The store was away (or restarted, empty): every peer gets a full ttl from
  /// `now` to show up again before its absence counts.
  void Grace(SteadyTime now);
  /// Every node of the run joined this session's start barrier: each was alive then, so from now
  /// on its registration gone (or another instance's) is a loss, even to a watcher that never saw it
  /// before (one that took over the watch from a lost node).
  void PassedBarrier();

  /// Its heartbeat advanced under one nonce since we first looked: a live
  /// launcher, not a stale record of an earlier run.
  bool SeenAlive(int node) const { return peers_[static_cast<size_t>(node)].alive; }
  std::string Nonce(int node) const { return peers_[static_cast<size_t>(node)].nonce; }
  bool Done(int node) const { return peers_[static_cast<size_t>(node)].done; }
  /// The peers not seen alive yet (the start barrier's "missing").
  std::vector<int> NotSeenAlive() const;
  bool AllSeenAlive() const { return NotSeenAlive().empty(); }
  /// The first peer, seen alive once, that is gone now, and why ("launcher lost":
  /// its registration expired; "replaced": another instance took its node; "heartbeat
  /// stalled"). A peer that is done is never lost.
  std::optional<std::pair<int, std::string>> Lost(SteadyTime now) const;

 private:
  struct Peer {
    bool seen = false;  ///< observed present at least once
    bool alive = false;
    bool done = false;
    bool present = false;
    bool replaced = false;
    std::string nonce;
    long long heartbeat = 0;
    SteadyTime changed{};  ///< when its heartbeat last advanced (or grace began)
    SteadyTime absent_since{};
  };
  int nnodes_, self_;
  Millis ttl_;
  SteadyTime grace_until_{};
  std::vector<Peer> peers_;
};

}  // namespace dflash
