// The node launchers of one run, coordinated through Redis (docs/multinode.md,
// "The store"): this node's registration with a TTL, the start barrier, failures
// published for every node, restart rounds across nodes, and the other nodes'
// launchers watched so a dead one is noticed within store_ttl + a poll.
//
// O(1) store work per node per period ("One watcher"): each node refreshes its own
// registration and reads the session's few keys; one node, the watcher (a lease),
// scans every registration each poll and publishes a loss for all; one deputy (a
// lease) checks the watcher's lease each poll and takes the watch over the moment
// it lapses; a stream (StoreDoorbell) tells every node at once that there is news.
//
// A thread of its own with its own synchronous RedisClient (docs/design.md says
// why not an async client in the supervisor's loop): it never touches the
// supervisor; it queues Events and makes event_fd() readable, and the loop
// thread takes them. Requests from the loop (a failure to publish, a round) are
// queued the other way and wake the thread. Keys: dflash:<run_id>:node:<r>, and
// per session (node 0's instance nonce) dflash:<run_id>:<session>:{failed,round,
// stopped:<n>,done:<r>}.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/duration.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/signal_fd.h"
#include "launcher/cluster/peer_tracker.h"
#include "launcher/cluster/store_doorbell.h"
#include "launcher/cluster/store_rules.h"
#include "launcher/core/node_culprit.h"
#include "store/redis_client.h"

namespace dflash {

struct CoordinatorOptions {
  StoreUrl url;
  std::string run_id;
  int nnodes = 1;
  int node_rank = 0;
  Millis ttl{5000};
  Millis barrier_timeout{300000};
  Millis outage{30000};
  StoreAuth auth;  ///< AUTH on every connection (store/store_auth.h)
};

class NodeCoordinator {
 public:
  struct Event {
    enum class Kind {
      kInfo,        ///< `text` for supervisor.log and the console
      kWarn,
      kBarrier,     ///< every node registered and seen alive: start
      kStop,        ///< stop the run: `culprit` (a node), `text` the reason, `record` the failure
      kBeginRound,  ///< round `round` began: stop every process for it
      kStartRound,  ///< every node has stopped for `round`: start again
    };
    Kind kind = Kind::kInfo;
    int round = 0;
    NodeCulprit culprit;  ///< kStop: who (the verdict names it, launcher/core/node_culprit.h)
    std::string text;
    nlohmann::json record;  ///< kStop: {node, process, exit_code, reason}
    /// kStop: the run's exit code: 70 (another node failed, was lost, the store was), or 76: this node
    /// was left behind (its registration gone, replaced or expired, or node 0's session ended).
    int exit_code = exit_code::kNodeFailed;
  };

  explicit NodeCoordinator(CoordinatorOptions options);
  ~NodeCoordinator();  ///< stops the thread (without publishing anything)
  NodeCoordinator(const NodeCoordinator&) = delete;
  NodeCoordinator& operator=(const NodeCoordinator&) = delete;

  /// On the calling thread, before anything starts: reaches the store (retrying
  /// for `outage`), then claims this node's registration. Another live launcher
  /// holding it: false, exit 69, `err` names it. A stale one (an earlier run of
  /// the same id): taken over at once when its launcher is provably dead on this
  /// host, else waited for (it expires within ttl unless it is refreshed, which
  /// proves it live). Unreachable store: false, exit 69. `notes`: what it did.
  /// A signal of `stop` (if given) ends the wait between tries: false, exit 128+N.
  /// One store call in flight still runs out its timeout first (ttl / 3, at most 2 s).
  bool Register(std::string* err, int* exit_code, std::vector<std::string>* notes, SignalFd* stop = nullptr);
  /// Starts the thread: heartbeats, the watch, the requests. Its first Events
  /// come before the barrier (kBarrier once every node is seen alive).
  bool Start(std::string* err);
  /// Readable (EFD) when Events wait; O_CLOEXEC.
  int event_fd() const { return event_fd_.get(); }
  std::vector<Event> TakeEvents();
  /// The nodes that have not joined the start barrier (for the barrier's error): read on a
  /// connection of its own (O(N), once); node 0 alone while its session is not known yet.
  std::vector<int> Missing();
  /// "watcher", "deputy" or "" (tests, and the bench that counts who scans).
  std::string Role();

  // --- requests from the supervisor's loop (queued; the thread carries them out) ---
  /// This node's failure ended its run (no restart left): first one published wins.
  void PublishFailure(const std::string& process, int exit_code, const std::string& reason);
  /// Ask every node for the round after `current` (if nobody has yet).
  void RequestRound(int current, const std::string& why);
  /// Every process of this node has stopped for `round`.
  void RoundStopped(int round);
  /// The run ended here with `exit_code`: publish done (and a failure, if non-zero
  /// and none was), unregister, end the thread. Waits at most ~2 s for the store.
  void Finish(int exit_code, const std::string& reason);

  /// Before Finish, on the calling thread (its own connection), while this node's
  /// registration is still refreshed: waits until no other node is registered,
  /// at most `max`. Node 0 does this after a clean end, because a peer still at
  /// the start barrier learns the run's session only from node 0's live record.
  bool LingerWhilePeersRegistered(Millis max, std::vector<int>* left);

  /// After Finish, on the calling thread: waits until no other node is registered
  /// (each done or gone), at most `max`. False: `left` names those still there.
  bool WaitForPeers(Millis max, std::vector<int>* left);

  std::string NodeKey(int node) const;
  std::string SessionKey(const std::string& what) const;

 private:
  bool WaitForPeersWith(RedisClient& client, Millis max, std::vector<int>* left);
  void Loop();
  bool Heartbeat(std::string* err);
  bool CarryOutRequests(std::string* err);

  // --- the watch, once per poll (node_coordinator_watch.cc) ---
  enum class WatchRole { kNone, kWatcher, kDeputy };
  /// What one read of the store holds beside the peers (those go to peers_).
  struct StoreView {
    SteadyTime now{};        ///< when it was read
    std::string failed;      ///< the session's failure record ("": none)
    std::string round_text;  ///< the session's round ("": none)
    long long stopped = 0;   ///< the nodes stopped for the round this node waits on
    std::vector<int> finished;  ///< while waiting in a round: the other nodes that ended
  };
  /// Reads the store and acts on it: the barrier, a failure, a lost peer, the rounds. False: the store failed.
  bool Watch(std::string* err);
  /// Before the start barrier: node 0's registration until it is seen alive (the session), then this
  /// node joins the session's barrier set; kBarrier once every node has. O(1) a poll.
  bool Arrive(std::string* err);
  /// After it, O(1): this node's watch role and the session's keys (kPoll).
  bool Poll(int waiting_round, StoreView* view, std::string* err);
  /// The watcher, O(N) on this node only: every node's registration into peers_ (kScan).
  bool Scan(std::string* err);
  /// A valid failure record of another node: stop for it (true). An invalid one is ignored (false).
  bool StopForFailure(const std::string& failed);
  /// The watcher: a peer lost or replaced: published for every node, then stopped for the record the
  /// store kept (true), so this node names it as every other does.
  bool StopForLostPeer(SteadyTime now);
  /// A round another node asked for begins; the barrier of the round this node waits on starts it or gives up.
  void FollowRounds(const StoreView& view, int waiting_round, std::string* err);

  void Emit(Event e);
  void Info(const std::string& text);
  /// Stop with exit 76: the run has moved on without this node (docs/multinode.md).
  void LeftBehind(const std::string& why);
  /// An invalid record in the store: a warning, once per distinct text; it is not acted on.
  void Ignore(const std::string& what);
  bool ClaimOnce(bool* claimed, nlohmann::json* holder, std::string* err);
  std::vector<std::string> RecordArgs() const;

  CoordinatorOptions o_;
  RedisClient client_;
  std::string nonce_, host_, pid_scope_, started_;
  pid_t pid_ = 0;
  unsigned long long pid_start_ = 0;
  long long heartbeat_ = 0;
  UniqueFd event_fd_;
  std::thread thread_;

  std::mutex mu_;  // guards everything below
  std::condition_variable wake_;
  bool quit_ = false;
  bool poke_ = false;            // something to do now (a request, the news): the loop's wait ends
  std::string shared_session_;   // session_, for Missing() on the caller's thread
  WatchRole shared_role_ = WatchRole::kNone;
  std::deque<Event> events_;
  nlohmann::json failure_;       // to publish (null: none)
  int round_request_ = -1;       // the round it was in when it asked (-1: none)
  std::string round_why_;
  int round_stopped_ = -1;       // the round this node stopped for (-1: none)
  bool finish_ = false, finished_ = false;
  int finish_code_ = 0;
  std::string finish_reason_;

  // The thread's own state (no lock: only the thread touches it after Start).
  std::unique_ptr<PeerTracker> peers_;
  std::unique_ptr<StoreOutage> outage_;
  std::unique_ptr<RoundBarrier> rounds_;
  std::string session_;
  bool barrier_passed_ = false, stop_sent_ = false, failure_published_ = false;
  int round_seen_ = 0;
  uint64_t registered_conn_ = 0;  // client_'s connection on which our registration was last seen
  std::string last_ignored_;
  SteadyTime last_heartbeat_{};
  WatchRole role_ = WatchRole::kNone;
  std::unique_ptr<StoreDoorbell> doorbell_;  // once the barrier is passed; reset after the thread ends
};

}  // namespace dflash
