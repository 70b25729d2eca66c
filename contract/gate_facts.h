// The compile gate's facts about one attempt of a process, typed once: dflash-worker
// sends them as X_DFLASH_GATE_* notify fields (worker/protocol.h, where each value is
// parsed into its enum), the supervisor keeps them per attempt and writes them to
// summary.json's "gate", events.jsonl and the console. Each enum has one spelling
// table (contract/enum_names.h): the wire and summary.json use the same names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "contract/enum_names.h"

namespace dflash {

/// Where a gated worker stands with the compile gate (X_DFLASH_GATE_STATE).
enum class GateState { kWaiting, kLeading, kReusing, kReady, kUnpublished, kAbandoned };
inline constexpr EnumName<GateState> kGateStateNames[] = {
    {GateState::kWaiting, "waiting"}, {GateState::kLeading, "leading"},         {GateState::kReusing, "reusing"},
    {GateState::kReady, "ready"},     {GateState::kUnpublished, "unpublished"}, {GateState::kAbandoned, "abandoned"},
};
inline const char* GateStateName(GateState s) { return NameIn(kGateStateNames, s).data(); }  // literals: NUL-ended
inline bool ParseGateState(std::string_view text, GateState* out) { return ParseIn(kGateStateNames, text, out); }

/// What a process is to its gate (X_DFLASH_GATE_ROLE, DFLASH_GATE_ROLE, summary.json's gate.role).
/// kLead compiles for the others; kReuse loads the cache a READY marker promised; kNone: a process
/// of a warm-up-mode role whose warm-up published nothing (it compiles on its own, ungated).
enum class GateRole { kNone, kLead, kReuse };
inline constexpr EnumName<GateRole> kGateRoleNames[] = {
    {GateRole::kNone, "none"}, {GateRole::kLead, "lead"}, {GateRole::kReuse, "reuse"}};
inline const char* GateRoleName(GateRole r) { return NameIn(kGateRoleNames, r).data(); }
inline bool ParseGateRole(std::string_view text, GateRole* out) { return ParseIn(kGateRoleNames, text, out); }

/// What the cluster-wide gate decided for a local leader (cachelock/cluster_gate.h; X_DFLASH_GATE_CLUSTER):
/// kLeader took the cluster lease and compiles, kFetched imported another node's kernels, kLocalFallback
/// compiles locally because the store was unusable or its kernels were refused (with a warning).
enum class ClusterOutcome { kLeader, kFetched, kLocalFallback };
inline constexpr EnumName<ClusterOutcome> kClusterOutcomeNames[] = {
    {ClusterOutcome::kLeader, "leader"},
    {ClusterOutcome::kFetched, "fetched"},
    {ClusterOutcome::kLocalFallback, "local-fallback"},
};
inline const char* ClusterOutcomeName(ClusterOutcome o) { return NameIn(kClusterOutcomeNames, o).data(); }
inline bool ParseClusterOutcome(std::string_view text, ClusterOutcome* out) {
  return ParseIn(kClusterOutcomeNames, text, out);
}

/// One attempt's gate facts (docs/summary-json.md, "gate"). An unset field was never reported;
/// a report sets the fields it carries and leaves the others as they were.
struct GateFacts {
  std::optional<std::string> key;
  /// Set by the supervisor, not the worker: a process of a warm-up-mode role, which takes no gate of
  /// its own and starts on the cache its role's warm-up filled (summary.json: "mode": "warmup").
  bool warmup_mode = false;
  std::optional<GateRole> role;
  std::optional<GateState> state;
  std::optional<double> wait_s;     ///< time spent waiting for the gate (local, and the cluster lease)
  std::optional<double> compile_s;  ///< the leader's spawn to READY
  // The cluster-wide gate (a local leader with a store):
  std::optional<ClusterOutcome> cluster;
  std::optional<int64_t> cluster_token;    ///< kLeader: its fencing token
  std::optional<int64_t> fetch_bytes;      ///< kFetched: the archive's size
  std::optional<double> fetch_s;           ///< kFetched: fetch + check + import
  std::optional<int64_t> published_bytes;  ///< kLeader: the archive it shipped

  bool empty() const { return *this == GateFacts{}; }
  bool operator==(const GateFacts&) const = default;
};

}  // namespace dflash
