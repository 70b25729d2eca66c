// The end of a process and what it leaves: reaping (a process of the run, the private store, the guardian,
// an orphan), its leftovers killed, the orphan sweeps (during the run and the final one), and whether a
// cache-reusing process did hit the cache.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include "common/proc_info.h"
#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/hash.h"
#include "common/proc_scan.h"
#include "common/run_sweep.h"
#include "common/spawn.h"
#include "common/untrusted_file.h"
#include "contract/env_vars.h"
#include "launcher/supervise/orphan_owner.h"
#include "launcher/report/training_report.h"
#include "launcher/supervise/payload_files.h"
#include "launcher/supervise/pid_claim.h"
#include "launcher/supervise/reuse_audit.h"
#include "launcher/supervise/supervisor_internal.h"

namespace dflash {
namespace {

/// The most read of a gate key file to see whether it changed: its sources (a script, its imports, files the
/// config names) are KBs; a larger one is said to have changed rather than read on the loop thread.
constexpr size_t kKeyFileLimit = size_t{64} << 20;

}  // namespace

void Supervisor::Impl::Reap() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;  // 0: none left that has exited; -1/ECHILD: no children at all
    // A worker's last words (how its payload ended) were queued before it
    // exited, so they are readable now: take them before judging its exit.
    OnNotify();
    int found = -1;
    for (size_t i = 0; i < core_.size(); ++i)
      if (core_.view(i).pid == pid) found = static_cast<int>(i);
    if (found < 0) {
      if (pid == options_.kept.pid) {  // its owner's to judge (the store session's redis-server)
        options_.kept.pid = -1;
        NodeStop stop = options_.kept.ended(DecodeWaitStatus(status).Describe());
        Warn(stop.reason);
        core_.StopForNode(std::move(stop));
        continue;
      }
      if (pid == guard_.guardian_pid()) {
        guard_.GuardianReaped();
        std::string how = "(pid " + std::to_string(pid) + ") " + DecodeWaitStatus(status).Describe();
        std::string gerr;
        if (core_.OnGuardianDied(how)) {
          if (guard_.Restart(&gerr)) Info("dflash-guardian restarted: pid " + std::to_string(guard_.guardian_pid()));
          else core_.StopUnguarded("dflash-guardian " + how + " and a new one cannot be started (" + gerr +
                                   "): stopping the run, which a SIGKILL of the launcher would leave behind");
        }
        Drain();
        continue;
      }
      if (log_) log_->debug("reaped orphan {} ({})", pid, DecodeWaitStatus(status).Describe());
      sweep_pending_ = true;  // its own children (if any) were re-parented to us
      continue;
    }
    size_t i = static_cast<size_t>(found);
    OnExecStatus(i);  // an exec that failed at once: its reason first
    // Nothing it wrote may be left in the pipes when we decide what it said.
    for (int sid : {os_[i].out_stream, os_[i].err_stream})
      if (sid >= 0 && !router_.Drain(sid)) CloseStream(sid);
    // Its files, read once, now: the core judges its end and builds the summary from these facts.
    const ProcView p = core_.view(i);
    AttemptFiles files;
    std::string msg;
    const std::string error_path = plan_.AttemptPath(*p.plan, p.attempt, "error.json");
    files.error_file = ReadErrorFile(error_path, plan_.run_dir, &msg, &files.error_file_unreadable);
    if (!files.error_file.is_null()) files.error_message = msg;
    if (!files.error_file_unreadable.empty() && log_)
      log_->warn("{}'s error file {} is {}", p.plan->name, error_path, Unreadable(files.error_file_unreadable));
    files.metrics = ReadMetricsFile(plan_.AttemptPath(*p.plan, p.attempt, "metrics.json"), plan_.run_dir,
                                    &files.metrics_unreadable);
    files.training = TrainingOfMetrics(files.metrics);
    core_.OnExit(i, DecodeWaitStatus(status), std::move(files));
    Drain();
  }
}

void Supervisor::Impl::Ended(size_t i) {
  const ProcView p = core_.view(i);
  // Its cgroup leaf holds its whole tree, setsid and double-fork included.
  core_.NoteMemoryPeak(i, guard_.Ended(i, p.attempt));
  // Without cgroups, at once: its process groups (its session's first group,
  // the payload's group under a worker). The rest (own groups, setsid) are
  // orphans re-parented to us: the next sweep finds them by their marker.
  pid_t last_pid = p.last_pid;
  int groups = 0;
  if (last_pid > 0 && ::kill(-last_pid, SIGKILL) == 0) ++groups;
  if (SignalVerified(os_[i].payload, SIGKILL)) ++groups;
  if (groups > 0 && log_)
    log_->info("killing the leftovers of {} (pid {}, ended) in its process group(s)", p.plan->name, last_pid);
  sweep_pending_ = true;
}

void Supervisor::Impl::KillAll() {
  for (size_t i = 0; i < core_.size(); ++i) {
    const ProcView p = core_.view(i);
    if (!p.alive()) continue;
    ::kill(-p.pid, SIGKILL);
    SignalVerified(os_[i].payload, SIGKILL);
  }
  guard_.KillAll();
  SweepOrphans(true);
}

std::vector<pid_t> Supervisor::Impl::SweepOrphansImpl(bool all) {
  sweep_pending_ = false;
  std::vector<pid_t> killed;
  std::vector<pid_t> children = OwnChildren();
  if (children.empty()) return killed;
  std::vector<RunProcess> processes;
  for (size_t i = 0; i < core_.size(); ++i) {
    const ProcView p = core_.view(i);
    processes.push_back({p.plan->name, p.pid, p.attempt, p.alive()});
  }
  pid_t own_group = ::getpgrp();
  for (pid_t pid : children) {
    if (pid == guard_.guardian_pid() || pid == options_.kept.pid) continue;
    ProcStat st;
    if (!ReadProcStat(pid, &st) || st.state == 'Z') continue;  // the reaper collects it
    Orphan o{pid, st.sid, st.pgid, EnvironValue(pid, kRunTokenVar), EnvironValue(pid, env::kProcess),
             EnvironValue(pid, env::kAttempt)};
    OrphanVerdict v = JudgeOrphan(o, processes, run_token_, own_group, all);
    if (!v.kill) continue;
    if (log_) log_->info("killing leftover {} ({}) of {}", pid, ProcessName(pid), v.whose);
    if (v.kill_group) ::kill(-st.pgid, SIGKILL);
    ::kill(pid, SIGKILL);
    killed.push_back(pid);
  }
  return killed;
}

void Supervisor::Impl::FinalSweep() {
  guard_.KillAll();
  // Killing an orphan re-parents its children to us: kill, reap, look again.
  for (int round = 0; round < 1000; ++round) {
    std::vector<pid_t> killed = SweepOrphansImpl(true);
    for (pid_t pid : killed)
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    for (;;) {  // zombies that were already ours
      pid_t pid = ::waitpid(-1, nullptr, WNOHANG);
      if (pid <= 0) break;
      if (pid == guard_.guardian_pid()) guard_.GuardianReaped();
    }
    if (killed.empty()) break;
  }
}

void Supervisor::Impl::CheckReuseHitTheCache(size_t i) {
  const ProcView p = core_.view(i);
  nlohmann::json m = ReadMetricsFile(plan_.AttemptPath(*p.plan, p.attempt, "metrics.json"), plan_.run_dir);
  // The key's files, as they are now: the payload may have replaced one with a FIFO (never waited for) or a
  // link (followed, as the plan did: a key file may be one), so read as any file a payload could touch.
  auto sha256_now = [](const std::string& path) {
    std::string text, why;
    UntrustedFileRules rules;
    rules.limit = kKeyFileLimit;
    rules.follow_link = rules.any_owner = true;
    return ReadUntrustedFile(path, rules, &text, &why) == UntrustedRead::kOk ? Sha256Hex(text) : std::string();
  };
  std::string warning = ReuseMissWarning(p.plan->name, p.gate.key.value_or(""), MetricsCounter(m, "fxgraph_cache_miss"),
                                         plan_.roles[p.plan->role_index].key_files, sha256_now);
  if (!warning.empty()) core_.AddWarning(warning);
}

}  // namespace dflash
