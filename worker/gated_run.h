// A payload behind the compile gate: take the gate on the payload's behalf,
// run it (lead: it compiles; reuse: READY is there, it loads the cache), and
// when the leader's payload is ready publish READY and release the gate while
// the payload keeps running. What `dflash-worker --gate-dir` and
// `dflash-cachelock run` both are.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cachelock/cluster_lease.h"  // kDefaultClusterLeaseTtl
#include "cachelock/records.h"
#include "common/duration.h"
#include "contract/defaults.h"
#include "contract/ready_spec.h"

namespace dflash {

struct GatedRunOptions {
  std::string name;               ///< "drafter:1": in messages and gate records
  std::vector<std::string> argv;  ///< the payload
  ReadySpec ready;                ///< when the payload counts as ready (timeout 0: forever)
  Millis stop_grace{10'000};

  /// The gate; an empty dir runs the payload ungated.
  std::string gate_dir;
  std::string gate_key;
  Millis gate_timeout = kDefaultGateTimeout;
  Millis progress_every{std::chrono::seconds(5)};
  /// While waiting: a leader whose processes used almost no CPU for this long
  /// is reported with the likely cause (blocked on its peers); 0: never.
  Millis idle_hint = kDefaultGateIdleHint;
  std::string torch_version;  ///< recorded in READY
  /// The files of a derived key with their hashes (--gate-sources): into
  /// READY, and a leader compares them with an older READY of its role to name
  /// the file whose edit changed the key.
  std::vector<ReadySource> sources;
  std::string gpu_identity;   ///< recorded in READY and shipped archives, checked on fetch (--gpu-identity)
  /// The CPU the payload compiles for (common/cpu_identity.h), from this host and the ATEN_CPU_CAPABILITY the
  /// payload gets; empty: RunGatedPayload works it out. Recorded in READY and archives, checked on fetch, and its
  /// tag put in the payload's TORCH_COMPILE_CACHE_KEY_TAG.
  std::string cpu_identity;
  /// TORCHINDUCTOR_COMPILE_THREADS for the payload once it leads (--leader-compile-threads:
  /// the host's share; the launcher gave every gated process 1, a follower's value). Empty: unchanged.
  std::string leader_compile_threads;
  /// A warm-up (gate mode "warmup", `seed`): on reuse run nothing; as the
  /// leader, stop the payload once it is ready (or take its exit 0), publish,
  /// and exit 0 -- the role's real processes start after us, on a warm cache.
  bool warmup = false;
  /// The payload's DFLASH_METRICS_FILE: Inductor's hit counters there count
  /// as a leader's honest readiness when the cache did not change.
  std::string metrics_file;
  /// Publish only when the cache shows the compile (see RunGatedPayload). On for the
  /// Inductor caches dflash-worker fronts; `dflash-cachelock run` guards any
  /// script's output, which need not land in the gate's dir, so it is off there.
  bool require_cache_change = true;

  /// The cluster-wide gate (docs/cachelock.md, "Cluster-wide gate"): the store URL
  /// (`redis://host:port[/db]`, dflash-worker reads $DFLASH_STORE) that a LOCAL
  /// leader consults before it compiles: fetch the kernels another node
  /// published, or take the cluster lease, compile and publish them. Empty: the
  /// local gate alone. With DFLASH_INDUCTOR_REMOTE_CACHE=1 (opt-in: what it
  /// stores is unsigned, docs/cachelock.md) the payload also gets Inductor's Redis
  /// remote caches (TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1, ...) unless its env sets them.
  std::string cluster_store;
  /// $DFLASH_STORE_SECRET_FILE: a 0600 file with the store's password, which is also the run's
  /// secret the cluster gate signs and verifies with; $DFLASH_STORE_USER: the ACL user. No secret:
  /// the cluster gate is not used (local compile, with a warning).
  std::string cluster_secret_file;
  std::string cluster_user;
  /// A private store's run id (DFLASH_STORE_PRIVATE=1, DFLASH_RUN_ID): AUTH sends PrivateStoreAuthPassword of the
  /// secret, never the secret, which only signs. Empty: the secret is the store's password.
  std::string cluster_private_run_id;
  bool inductor_remote_cache = false;  ///< $DFLASH_INDUCTOR_REMOTE_CACHE=1
  Millis cluster_lease_ttl = kDefaultClusterLeaseTtl;  ///< $DFLASH_GATE_LEASE_TTL
  std::string device = "cpu";  ///< "cpu" or "cuda": in the shipped archive's manifest, checked on import

  /// Lines for people (gate decisions, progress, failures): the entry point says them (on its stderr, which is
  /// the attempt's log); unset, they are said nowhere.
  std::function<void(const std::string& line)> say;
  /// Report to the parent through $NOTIFY_SOCKET (the supervisor): MAINPID,
  /// READY=1 when the payload is ready, STATUS= lines, X_DFLASH_GATE_* facts,
  /// how the payload ended. Off for dflash-cachelock run.
  bool report = true;
  /// Also say "<name> ready" and each STATUS= line.
  bool verbose = false;
};

/// Runs the payload to its end; returns the exit code to exit with: the
/// payload's (128+N for signal N), 127/126 if it could not be executed, 75 on
/// a gate or readiness timeout, 73 if the gate dir is unusable, 64 for a bad key.
///
/// READY is a promise, so the leader publishes it only when its payload was
/// ready while alive (or, as a warm-up, exited 0) AND the cache shows it: new
/// entries, or Inductor hits in its metrics file. Otherwise nothing is
/// published and a warning (X_DFLASH_GATE_WARNING=) says why. Before a leader
/// runs its payload, whatever is left of a dead leader's tree is killed; a
/// leader whose payload ends unready kills its own leftovers before letting go.
int RunGatedPayload(const GatedRunOptions& options);

/// --gate-sources: one "<sha256 or -> <path>" per line (Plan::GateSources writes it).
std::vector<ReadySource> ParseGateSources(const std::string& text);

}  // namespace dflash
