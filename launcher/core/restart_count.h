// What a process's restarts were, from its attempts: one count with its reasons, the same for `ctl status`, the
// live view, the summary and dflash_restarts_total (docs/control.md, "restarts").
#pragma once

#include <vector>

#include "launcher/control/control.h"
#include "launcher/core/attempt_record.h"

namespace dflash {

/// Why the process was started again after `ended` (dflash_restarts_total's reason, kRestartReasons in
/// launcher/metrics/run_snapshot.h): "ctl" (asked by hand), "unit" (its restart unit's or torch world's restart),
/// or its own failure's kind: "hung", "not_ready", "start_failed", "signal", "exit".
const char* RestartReason(const AttemptRecord& ended);
/// Whether a RestartReason is the process's own failure (what an alert pages on), not its unit's or ctl's.
bool OwnFailure(const char* reason);

/// One reason per restart, first to last: an attempt that ended in a restart (decided: its next start may still
/// wait in BACKOFF), or one after which the process was started again all the same (`ctl start` after a stop by
/// hand: "ctl"). At the run's end there is one per attempt after the first: a restart the stop cut short is
/// no restart (ProcessUnit::StopWithRun).
std::vector<const char*> RestartReasons(const std::vector<AttemptRecord>& attempts);
/// Those reasons counted: own failures, its unit's restarts, by hand.
RestartCounts CountRestarts(const std::vector<AttemptRecord>& attempts);

}  // namespace dflash
