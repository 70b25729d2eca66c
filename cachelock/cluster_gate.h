// The cluster-wide compile gate: what a process that became the LOCAL leader for a key (no READY in its
// node's cache) does before it compiles, when the run has a store (DFLASH_STORE). The local two-level
// gate stays the fast path inside a node: only local leaders come here, one per node at a time.
//
//   kernels published in the store  -> fetch, check, import into the local cache (all or nothing, as
//                                       `dflash-launch cache import`): reuse, no compile
//   nobody holds the cluster lease   -> take it (fresh fencing token), compile, then publish the cache
//                                       archive with that token still current (cachelock/cluster_lease.h)
//   another node holds it            -> wait (progress lines, idle hint, timeout) until its kernels are
//                                       published (fetch them) or its lease expires (take over)
//   the store cannot be reached, or its kernels are refused (corrupt, another torch, unsigned, forged),
//   or this process has no run secret to sign and verify with
//                                    -> compile locally, with a warning: never hang, never pretend
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cachelock/cache_archive.h"
#include "cachelock/cluster_lease.h"
#include "common/duration.h"
#include "contract/defaults.h"
#include "contract/gate_facts.h"
#include "store/redis_client.h"

namespace dflash {

struct ClusterGateOptions {
  StoreUrl store;
  std::string key;        ///< the gate key: the same on every node for the same compile
  std::string cache_dir;  ///< this node's cache (its local gate is held by the caller)
  ArchiveFacts here;      ///< this process's torch version and device: what imported kernels must match
  std::string role;       ///< "drafter:0", in the lease holder record
  Millis lease_ttl = kDefaultClusterLeaseTtl;
  Millis timeout = kDefaultGateTimeout;  ///< bound on waiting for another node's lease
  Millis progress_every{5000};
  Millis poll{250};  ///< how often a waiter asks the store
  Millis idle_hint = kDefaultGateIdleHint;  ///< judged over max(idle_hint, lease_ttl): renewals carry the CPU
  Millis io_timeout{2000};  ///< connect and each command
  std::function<void(const std::string&)> on_progress;  ///< "waiting for gate K: cluster lease held by ..."
  std::function<void(const std::string&)> on_hint;      ///< the remote leader is not compiling
  std::string scratch_dir;  ///< where archives are staged on their way; empty: $TMPDIR, else /tmp
  StoreAuth auth;           ///< AUTH on every connection to the store
  /// The run's secret: signs what this process publishes, verifies what it fetches. Empty: the gate
  /// is not used (what it ships is code every process loads: it never ships or loads it unsigned).
  std::string sign_key;
};


struct ClusterDecision {
  ClusterOutcome outcome = ClusterOutcome::kLocalFallback;  ///< contract/gate_facts.h
  int64_t token = 0;          ///< kLeader: the fencing token
  bool took_over = false;     ///< kLeader after waiting: the holder's lease expired (or it let go unpublished)
  ClusterHolder previous;     ///< the holder it waited on (took_over)
  uint64_t fetched_bytes = 0; ///< kFetched: archive size
  double fetch_s = 0;         ///< kFetched: fetch + check + import
  double wait_s = 0;          ///< time spent waiting on another node's lease
  std::string from;           ///< kFetched: who compiled: "drafter:0 on host n0 in 31.2 s"
  std::string warning;        ///< kLocalFallback: why, for the console and summary.json
};

class ClusterGate {
 public:
  explicit ClusterGate(ClusterGateOptions options);
  ~ClusterGate();  ///< stops renewing and releases a lease still held (the next one takes it at once)
  ClusterGate(const ClusterGate&) = delete;
  ClusterGate& operator=(const ClusterGate&) = delete;

  /// REQUIRES: the caller holds this node's gate for options.key as its leader. Decides as the header
  /// says. False only when waiting for another node timed out (`err` names the holder): exit 75.
  bool Resolve(ClusterDecision* d, std::string* err);

  /// kLeader: renews the lease every TTL/3 from a thread until Publish or Abandon. `tree_token` is the
  /// local gate's holder mark (DFLASH_GATE_HOLDER) of the compiling tree, whose CPU time the renewals
  /// carry for other nodes' idle hint.
  void StartRenewing(const std::string& tree_token);
  /// kLeader, once the local READY is published and while the local gate is still held: exports the
  /// cache and publishes it, fenced by the token. False with `err` when nothing was published (the
  /// lease was lost, the store is down, export failed); the local READY stands either way.
  bool Publish(double compile_s, uint64_t* archive_bytes, std::string* err);
  /// Lets go of the lease now, unpublished.
  void Abandon();

  /// kLeader: the renewer found the lease no longer ours.
  bool lost() const;

 private:
  bool FetchAndImport(ClusterDecision* d, std::string* why);
  std::string ScratchDir() const;
  void StopRenewing();

  ClusterGateOptions o_;
  ClusterLease lease_;
  ClusterHolder me_;
  std::thread renewer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool lost_ = false;
};

}  // namespace dflash
