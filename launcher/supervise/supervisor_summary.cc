#include "launcher/supervise/supervisor_summary.h"

#include <algorithm>

#include "common/untrusted_file.h"
#include "launcher/core/restart_count.h"
#include "launcher/report/training_report.h"
#include "launcher/supervise/payload_files.h"

namespace dflash {

RunSummary BuildRunSummary(const SupervisorCore& core, double wall_s, const std::string& start_error) {
  const Plan& plan = core.plan();
  RunSummary s;
  s.run_id = plan.run_id;
  s.config = plan.config.path;
  s.run_dir = plan.run_dir;
  s.wall_s = wall_s;
  std::vector<std::string> unreadable;  // warnings: payload files that were not read, and why
  for (size_t i = 0; i < core.size(); ++i) {
    const CoreProc& p = core.proc(i);
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
    e.culprit = core.culprit() == static_cast<int>(i);
    e.collateral = last && last->outcome == AttemptOutcome::kCollateral;
    e.runtime_s = last && last->end_s >= last->start_s && last->start_s >= 0 ? last->end_s - last->start_s : 0;
    e.reason = p.reason;
    int attempt = std::max(0, p.attempt);
    e.stdout_log = plan.AttemptPath(pp, attempt, "stdout.log");
    e.stderr_log = plan.AttemptPath(pp, attempt, "stderr.log");
    std::string msg;
    e.error_file = ReadErrorFile(plan.AttemptPath(pp, attempt, "error.json"), plan.run_dir, &msg,
                                 &e.error_file_unreadable);
    e.gate = p.gate();
    e.ready_s = last ? last->ready_s : 0;
    e.metrics = ReadMetricsFile(plan.AttemptPath(pp, attempt, "metrics.json"), plan.run_dir, &e.metrics_unreadable);
    e.memory_peak_bytes = p.memory_peak;
    const std::vector<std::string>& names = plan.RoleOf(pp).ports;
    for (size_t k = 0; k < names.size() && k < pp.ports.size(); ++k) e.ports.emplace_back(names[k], pp.ports[k]);
    e.attempts = p.attempts;
    // Each attempt's training (the step a killed one reached, the step the next resumed from): its own metrics.
    for (AttemptRecord& a : e.attempts) {
      if (a.attempt == attempt) {
        a.training = TrainingOfMetrics(e.metrics);
        continue;
      }
      std::string path = plan.AttemptPath(pp, a.attempt, "metrics.json"), why;
      a.training = TrainingOfMetrics(ReadMetricsFile(path, plan.run_dir, &why));
      if (!why.empty()) unreadable.push_back(pp.name + "'s metrics file " + path + " is " + Unreadable(why));
    }
    if (!e.metrics_unreadable.empty())
      unreadable.push_back(pp.name + "'s metrics file " + plan.AttemptPath(pp, attempt, "metrics.json") + " is " +
                           Unreadable(e.metrics_unreadable));
    if (!e.error_file_unreadable.empty())
      unreadable.push_back(pp.name + "'s error file " + plan.AttemptPath(pp, attempt, "error.json") + " is " +
                           Unreadable(e.error_file_unreadable));
    (pp.warmup ? s.warmups : s.processes).push_back(std::move(e));
  }
  // A payload's file that was a FIFO, a link, a directory or too big: said, never read (common/untrusted_file.h).
  s.warnings = core.warnings();
  for (std::string& w : unreadable) s.warnings.push_back(w + "; its content is not in this summary");
  // The core's index i is the order of processes then warm-ups above: find its copy by name.
  auto training = [&](size_t i, int attempt) {
    const std::string& name = core.proc(i).plan->name;
    for (const std::vector<ProcessSummary>* list : {&s.processes, &s.warmups})
      for (const ProcessSummary& e : *list)
        if (e.name == name)
          for (const AttemptRecord& a : e.attempts)
            if (a.attempt == attempt) return a.training;
    return AttemptTraining{};
  };
  static_cast<RunVerdict&>(s) = core.Verdict(start_error, training);  // decided once, by the incident
  return s;
}

}  // namespace dflash
