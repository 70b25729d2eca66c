// The supervisor's side of its Prometheus metrics (launcher/metrics/run_metrics.h): it serves them from the
// start, and fills the registry on its loop thread -- from the core's units and each process's metrics file --
// every kMetricsPeriod and whenever `ctl metrics` asks. The exposer's threads never see the core.
#include <ctime>
#include <unistd.h>

#include "common/private_files.h"
#include "common/proc_scan.h"
#include "launcher/supervise/payload_files.h"
#include "launcher/supervise/supervisor_internal.h"

namespace dflash {
namespace {

/// Whether `payload` (a MAINPID= claim, checked when it was made) is still in the tree of `pid`: first the cheap
/// look (its parent or its session is `pid`, the usual payload of a worker), the scan of /proc only otherwise.
bool StillPayloadOf(pid_t payload, pid_t pid) {
  ProcStat st;
  if (!ReadProcStat(payload, &st)) return false;
  if (st.ppid == pid || st.sid == pid) return true;
  return InProcessTree(payload, pid);
}

}  // namespace

void Supervisor::Impl::StartMetrics() {
  metrics_ = std::make_unique<RunMetrics>();
  const std::string& address = plan_.config.run.metrics;
  if (address.empty()) return;  // [run] metrics = false: `ctl metrics` still answers
  std::string err;
  if (!RunMetrics::Available()) {  // a build without prometheus-cpp (cmake/portable.cmake)
    metrics_->Serve(address, &err);
    // Asked for in run.toml: on the console. The default address only: the log (not every run's console).
    const SourcePos& asked = plan_.config.run.metrics_pos;
    if (asked.line > 0) Warn(asked.ToString() + ": [run] metrics: " + err);
    else if (log_) log_->info(err);
    return;
  }
  if (!metrics_->Serve(address, &err)) {
    // The run goes on without them: metrics are for watching it, never a reason to stop training.
    Warn(err + " (set [run] metrics to a free address, or metrics = false)");
    return;
  }
  // Every process's series are there (NOT_STARTED) before anyone is told the URL.
  RefreshMetrics(true);
  // The supervisor's log only: the console stays for what needs a reader (the URL is in metrics.url and ctl).
  if (log_) log_->info("metrics on " + metrics_->url());
  if (!WritePrivateFileAtomic(plan_.run_dir + "/metrics.url", metrics_->url() + "\n", plan_.Files(), RunDirUse(),
                              &err))
    Warn("cannot write metrics.url: " + err);
}

void Supervisor::Impl::StopMetrics() {
  if (!metrics_ || metrics_->url().empty()) return;
  // The port is given back with the exposer: a URL left in the run dir would name someone else's.
  ::unlink((plan_.run_dir + "/metrics.url").c_str());
}

void Supervisor::Impl::RefreshMetrics(bool force) {
  if (!metrics_ || (!force && metrics_->url().empty())) return;
  SteadyTime now = std::chrono::steady_clock::now();
  if (!force && now - last_metrics_ < kMetricsPeriod) return;
  last_metrics_ = now;
  RunSnapshot s;
  s.run_id = plan_.run_id;
  s.node = std::to_string(plan_.node_rank);
  s.uptime_s = std::chrono::duration<double>(now - t0_).count();
  s.stopping = core_.stopping();
  s.unix_now = static_cast<double>(std::time(nullptr));
  if (plan_.SpoolProducers() > 0) s.spool_dir = plan_.SpoolDir();
  for (size_t i = 0; i < core_.size(); ++i) {
    const ProcView p = core_.view(i);
    ProcessSnapshot e;
    e.name = p.plan->name;
    e.role = p.plan->role;
    e.state = ProcStateName(p.state);
    e.up = p.state == ProcState::kRunning;
    e.attempt = std::max(0, p.attempt);
    // The payload under dflash-worker is what uses the CPU; a pid it claimed counts only while it is still in
    // the tree of the process we started (pids are reused).
    e.pid = p.alive() && p.payload_pid > 0 && StillPayloadOf(p.payload_pid, p.pid) ? p.payload_pid : p.pid;
    e.uptime_s = p.alive() ? std::chrono::duration<double>(now - p.started).count() : 0;
    for (const char* r : kRestartReasons) e.restarts[r] = 0;
    for (const char* r : p.restart_reasons) ++e.restarts[r];  // as ctl status and the summary count
    if (p.last_exit_code >= 0) e.last_exit_code = p.last_exit_code;
    const GateFacts& g = p.gate;
    e.gate_wait_s = g.wait_s;
    e.compile_s = g.compile_s;
    if (g.role) e.gate_role = GateRoleName(*g.role);
    if (p.attempt >= 0) e.metrics = ReadMetricsFile(plan_.AttemptPath(*p.plan, p.attempt, "metrics.json"), plan_.run_dir);
    s.processes.push_back(std::move(e));
  }
  metrics_->Update(s);
}

}  // namespace dflash
