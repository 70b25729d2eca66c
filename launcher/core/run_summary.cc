// SupervisorCore::Summary: the run's summary from the core's own table and the facts the shell told it -- each
// attempt's files as they were read once when it was reaped (AttemptFiles), a loss of the run's own records
// (RecordsIncomplete) -- with the one verdict. Nothing here reads a file or changes a decision.
#include <algorithm>

#include "common/untrusted_file.h"
#include "launcher/core/restart_count.h"
#include "launcher/core/supervisor_core.h"

namespace dflash {

RunSummary SupervisorCore::Summary(double wall_s, const std::string& start_error) const {
  RunSummary s;
  s.run_id = plan_.run_id;
  s.config = plan_.config.path;
  s.run_dir = plan_.run_dir;
  s.wall_s = wall_s;
  std::vector<std::string> unreadable;  // warnings: payload files that were not read, and why
  for (size_t i = 0; i < units_.size(); ++i) {
    const CoreProc& p = units_[i].view();
    const ProcessPlan& pp = *p.plan;
    const AttemptRecord* last = p.last();
    ProcessSummary e;
    e.name = pp.name;
    e.role = pp.role;
    e.role_rank = pp.role_rank;
    e.rank = pp.warmup ? -1 : pp.rank;  // a warm-up: a world of one of its own, not a rank of the run
    e.device = pp.on_gpu() ? "cuda:" + pp.device : "cpu";
    e.pid = p.pid > 0 ? p.pid : last ? last->pid : -1;
    e.state = ProcStateName(p.state);
    e.exit_code = last ? last->exit_code : -1;
    e.signal = last ? last->signal : 0;
    e.restarts = CountRestarts(p.attempts);
    e.held = p.held;
    e.culprit = culprit() == static_cast<int>(i);
    e.collateral = last && last->outcome == AttemptOutcome::kCollateral;
    e.runtime_s = last && last->end_s >= last->start_s && last->start_s >= 0 ? last->end_s - last->start_s : 0;
    e.reason = p.reason;
    const int attempt = std::max(0, p.attempt);
    e.stdout_log = plan_.AttemptPath(pp, attempt, "stdout.log");
    e.stderr_log = plan_.AttemptPath(pp, attempt, "stderr.log");
    // Its files as the shell read them when its last attempt was reaped (none: it never ended, or never ran).
    const bool ended = last && last->end_s >= 0;
    if (ended) {
      e.error_file = p.files.error_file;
      e.error_file_unreadable = p.files.error_file_unreadable;
      e.metrics = p.files.metrics;
      e.metrics_unreadable = p.files.metrics_unreadable;
    }
    e.gate = p.gate();
    e.ready_s = last ? last->ready_s : 0;
    e.memory_peak_bytes = p.memory_peak;
    const std::vector<std::string>& names = plan_.RoleOf(pp).ports;
    for (size_t k = 0; k < names.size() && k < pp.ports.size(); ++k) e.ports.emplace_back(names[k], pp.ports[k]);
    e.attempts = p.attempts;
    for (const AttemptRecord& a : e.attempts)
      if (!a.metrics_unreadable.empty())
        unreadable.push_back(pp.name + "'s metrics file " + plan_.AttemptPath(pp, a.attempt, "metrics.json") +
                             " is " + Unreadable(a.metrics_unreadable));
    if (!e.error_file_unreadable.empty())
      unreadable.push_back(pp.name + "'s error file " + plan_.AttemptPath(pp, attempt, "error.json") + " is " +
                           Unreadable(e.error_file_unreadable));
    (pp.warmup ? s.warmups : s.processes).push_back(std::move(e));
  }
  // A payload's file that was a FIFO, a link, a directory or too big: said, never read (common/untrusted_file.h).
  s.warnings = warnings_;
  for (std::string& w : unreadable) s.warnings.push_back(w + "; its content is not in this summary");
  static_cast<RunVerdict&>(s) = Verdict(start_error);  // decided once, by the incident, from the same facts
  return s;
}

}  // namespace dflash
