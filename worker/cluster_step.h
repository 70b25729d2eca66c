// A local leader's turn at the cluster-wide gate (docs/cachelock.md, "Cluster-wide gate"): fetch the kernels
// another node published, take the cluster lease and compile, or wait for another node's; and Inductor's own
// Redis remote caches where they are asked for.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cachelock/cluster_gate.h"
#include "cachelock/gate.h"
#include "common/status.h"
#include "worker/gated_run.h"
#include "worker/protocol.h"

namespace dflash {

using Say = std::function<void(const std::string&)>;
using Report = std::function<void(const NotifyFields&)>;

/// Inductor's own Redis remote caches, for what they carry (docs/cachelock.md): the FX-graph and
/// AOTAutograd entries (on GPU with the Triton kernels bundled in) and autotuning results. On CPU a
/// remote FX hit still rebuilds the C++ kernels, which is why the cluster gate ships the cache archive.
/// Whatever the payload's environment (the role's env) already sets is left as it is.
void AddInductorRemoteCacheEnv(const std::string& store, std::vector<std::pair<std::string, std::string>>* env);

/// A local leader with a store: fetch the cluster's kernels, or take the cluster lease, or wait for
/// another node's (cachelock/cluster_gate.h). On return `*lead` says whether we compile, and `*cluster`
/// holds the lease when we do it for the cluster. Not ok: waiting for another node timed out (75); the
/// caller says it.
Status ResolveCluster(const GatedRunOptions& o, CompileGate& gate, std::unique_ptr<ClusterGate>* cluster,
                   ClusterDecision* cd, bool* lead, const Say& say, const Say& warn, const Report& report);

}  // namespace dflash
