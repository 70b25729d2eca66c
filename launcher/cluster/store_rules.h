// What one node launcher concludes from the coordination store about its own
// standing and its restart rounds, apart from the peers (peer_tracker.h): when
// its registration means it was left behind, when a store outage ends the run
// here, when a round starts or is given up. Pure: no store, no clock of its own
// (node_coordinator.cc feeds it; store_rules_test.cc fakes it). docs/multinode.md
// says what each verdict means for the run.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/duration.h"

namespace dflash {

/// This node's registration after a refresh.
enum class Standing {
  kRegistered,  ///< refreshed (or recreated): all is well
  kRecreate,    ///< gone, but the connection is new since it was last seen: the store may have restarted
                ///< empty (every node finds itself gone then): register again
  kVanished,    ///< gone while one connection stayed up: deleted, or expired unrefreshed (this launcher was
                ///< paused or starved): the others have seen it lost, so it is left behind
  kReplaced,    ///< another instance holds this node: left behind
};
/// `refresh`: the kRefresh script's reply (1 refreshed, 2 gone, 0 held by another instance);
/// `new_connection`: the client reconnected since the registration was last seen.
Standing JudgeRefresh(long long refresh, bool new_connection);
/// After kRecreate, its reply (1 recreated, 0 held by another instance).
Standing JudgeRecreate(long long recreate);

/// The store away: the processes go on; this node stops once it stays away for longer than `outage`.
class StoreOutage {
 public:
  enum class Step {
    kBegan,    ///< the first failure: warn once
    kGoingOn,  ///< still away, within `outage`
    kTooLong,  ///< away for longer than `outage`: stop the run here
  };
  explicit StoreOutage(Millis outage) : outage_(outage) {}
  /// A call to the store failed at `now`.
  Step Failed(SteadyTime now);
  /// A call succeeded at `now`: how long the store was away, if it was (the peers then get a grace).
  std::optional<SteadyTime::duration> Back(SteadyTime now);
  bool away() const { return away_; }

 private:
  Millis outage_;
  bool away_ = false;
  SteadyTime since_{};
};

/// A restart round across the nodes (docs/multinode.md, "Restart rounds"): a node that stopped
/// for round N waits until every node has, then starts again; it gives the round up when a node
/// had already finished (it cannot join) or when not every node stopped within `timeout`.
class RoundBarrier {
 public:
  struct Verdict {
    enum class Kind { kNone, kStart, kGiveUp };
    Kind kind = Kind::kNone;
    int round = 0;
    std::string why;  ///< kGiveUp: the reason the run stops
  };
  RoundBarrier(int nnodes, Millis timeout) : nnodes_(nnodes), timeout_(timeout) {}
  /// The round this node waits in, given the round it said it stopped for; 0: none.
  int Waiting(int stopped_for) const { return stopped_for > started_ ? stopped_for : 0; }
  /// The last round started here (0: none).
  int started() const { return started_; }
  /// One poll while waiting in round `waiting` (Waiting()): `current` is the round the store
  /// holds now, `stopped` how many nodes said they stopped for `waiting`, `finished` the other
  /// nodes that are done. Starting it resets the timeout for the next.
  Verdict Poll(int waiting, int current, long long stopped, const std::vector<int>& finished, SteadyTime now);

 private:
  int nnodes_;
  Millis timeout_;
  int started_ = 0;
  std::optional<SteadyTime> waiting_since_;  ///< since the first poll of the round waited in
};

}  // namespace dflash
