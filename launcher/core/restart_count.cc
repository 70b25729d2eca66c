#include "launcher/core/restart_count.h"

#include <cstring>

namespace dflash {

const char* RestartReason(const AttemptRecord& ended) {
  if (ended.outcome == AttemptOutcome::kRestartedByCtl || !Restarted(ended.outcome)) return "ctl";
  if (ended.with_unit) return "unit";
  if (ended.hung) return "hung";
  if (ended.ready_timeout) return "not_ready";
  if (ended.start_failed) return "start_failed";
  if (ended.signal != 0) return "signal";
  return "exit";
}

bool OwnFailure(const char* reason) { return std::strcmp(reason, "ctl") != 0 && std::strcmp(reason, "unit") != 0; }

std::vector<const char*> RestartReasons(const std::vector<AttemptRecord>& attempts) {
  std::vector<const char*> why;
  for (size_t k = 0; k < attempts.size(); ++k)
    if (Restarted(attempts[k].outcome) || k + 1 < attempts.size()) why.push_back(RestartReason(attempts[k]));
  return why;
}

RestartCounts CountRestarts(const std::vector<AttemptRecord>& attempts) {
  RestartCounts c;
  for (const char* r : RestartReasons(attempts)) {
    if (OwnFailure(r)) ++c.own;
    else if (std::strcmp(r, "unit") == 0) ++c.unit;
    else ++c.ctl;
  }
  return c;
}

}  // namespace dflash
