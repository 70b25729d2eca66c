// The supervisor's loop: its setup (the loop's fds, events.jsonl, the guardian), the turns of epoll_wait and
// their timeout, the dispatch of what epoll saw, the probes' delivery, and the end of the loop.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <csignal>

#include "common/exit_codes.h"
#include "common/fd.h"
#include "common/private_files.h"
#include "common/run_sweep.h"
#include "launcher/supervise/supervisor_internal.h"

namespace dflash {

int Supervisor::Impl::Run() {
  t0_ = std::chrono::steady_clock::now();
  if (!SetUp()) return exit_code::kFailure;
  Info("run " + plan_.run_id + ": " + std::to_string(plan_.processes.size()) + " processes" +
       (plan_.warmups.empty() ? "" : " and " + std::to_string(plan_.warmups.size()) + " warm-up(s)") +
       ", logs in " + plan_.run_dir);
  core_.Start();
  Drain();
  PublishStatus(true);
  Loop();
  return Finish();
}

bool Supervisor::Impl::SetUp() {
  std::string err;
  // Orphans of the workers' payloads come to us, so nothing outlives the run unseen.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  if (!epoll_ || !signals_.Open(Supervisor::HandledSignals(plan_), &err) || !notify_.Open(&err)) {
    start_error_ = err.empty() ? ErrnoMessage("epoll_create1", errno) : err;
    Warn("cannot start: " + start_error_);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Tag(kTagSignal, 0);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, signals_.fd(), &ev);
  ev.data.u64 = Tag(kTagNotify, 0);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, notify_.fd(), &ev);
  std::string events_path = plan_.run_dir + "/events.jsonl";
  events_file_.reset(OpenPrivateFile(events_path, O_WRONLY | O_APPEND, plan_.Files(), RunDirUse(), &err));
  if (!events_file_) Warn("cannot write events.jsonl: " + err);
  // A resumed run's events follow the earlier launches' ones: this line says where.
  if (plan_.resumed)
    WriteEvent({{"event", "resume"}, {"attempt_base", plan_.attempt_base}, {"t", 0.0},
                {"reason", "resumed by `dflash-launch run --resume`: this launch's attempt k writes attempt_" +
                               std::to_string(plan_.attempt_base) + "+k"}});

  // Before the first child: the cgroup it will be born into, and the guardian
  // that kills the run if we are SIGKILLed (docs/design.md, "Nothing outlives the run").
  run_token_ = NewRunToken();
  RunGuard::Options go;
  go.token = run_token_;
  go.bin_dir = plan_.bin_dir;
  go.log_path = plan_.run_dir + "/guardian.log";
  go.log_mode = plan_.Files();
  go.mode = options_.cgroup;
  go.env = options_.base_env;
  std::vector<std::string> notes;
  if (!guard_.Start(go, &err, &notes)) {
    start_error_ = err;
    Warn("cannot start: " + err);
    return false;
  }
  for (const std::string& n : notes) {
    if (log_) log_->info(n);
    if (n.rfind("cannot", 0) == 0) Warn(n);
  }
  // After the signals are blocked (its threads inherit the mask), before the first child.
  StartMetrics();
  return true;
}

void Supervisor::Impl::Loop() {
  epoll_event events[64];
  while (!core_.Done()) {
    SteadyTime wait_began = std::chrono::steady_clock::now();
    SteadyTime asked = SteadyTime::max();
    int n = ::epoll_wait(epoll_.get(), events, 64, NextTimeoutMs(wait_began, &asked));
    int wait_errno = errno;
    // A SIGSTOP/SIGCONT of the supervisor ends epoll_wait with EINTR, whatever
    // it was waiting for: time it did not see is told first, never judged.
    core_.OnLoopTurn(wait_began, asked, std::chrono::steady_clock::now());
    Drain();
    if (n < 0 && wait_errno != EINTR) {
      core_.Abort(ErrnoMessage("epoll_wait", wait_errno));
      Drain();
      break;
    }
    Dispatch(events, std::max(n, 0));
    probes_->Expire(std::chrono::steady_clock::now());
    DeliverProbes();
    // Before a deadline is judged, what is already queued is taken: the pings
    // and READY=1 a payload sent while we were not looking count.
    if (core_.NextDeadline() <= std::chrono::steady_clock::now()) TakeQueued(events);
    core_.OnTick();
    Drain();
    // Leftovers of processes that ended, once per turn of the loop (not once
    // per exit); while the whole run stops, once at the end.
    if (sweep_pending_ && !core_.stopping()) SweepOrphans(false);
    PublishStatus(false);
    RefreshMetrics(false);
  }
}

int Supervisor::Impl::Finish() {
  // Whatever the processes left behind: stop it, reap it, and the cgroup.
  FinalSweep();
  guard_.Finish();
  // Pipes still held open by a leftover writer: take what is there, then close.
  for (size_t sid = 0; sid < stream_owner_.size(); ++sid) {
    if (stream_owner_[sid] < 0) continue;
    router_.Drain(static_cast<int>(sid));
    CloseStream(static_cast<int>(sid));
  }
  TellSystemd("STOPPING=1");
  PublishStatus(true);
  StopMetrics();
  return core_.ExitCode();
}

void Supervisor::Impl::Dispatch(const epoll_event* events, int n) {
  for (int k = 0; k < n; ++k) {
    uint64_t kind = events[k].data.u64 >> 32, id = events[k].data.u64 & 0xffffffff;
    if (kind == kTagSignal) {
      signalfd_siginfo si;
      while (signals_.Read(&si)) {
        int sig = static_cast<int>(si.ssi_signo);
        if (sig == SIGCHLD) Reap();
        else core_.OnSignal(sig);
        Drain();
      }
    } else if (kind == kTagNotify) {
      OnNotify();
    } else if (kind == kTagExec) {
      OnExecStatus(id);
    } else if (kind == kTagStream) {
      int sid = static_cast<int>(id);
      // An earlier event of this batch (a child's exit) may have closed it.
      if (id >= stream_owner_.size() || stream_owner_[id] < 0) continue;
      size_t owner = static_cast<size_t>(stream_owner_[id]);
      if (!router_.OnReadable(sid)) CloseStream(sid);
      core_.OnOutput(owner);
    } else if (kind == kTagProbe) {
      probes_->OnReady(static_cast<uint32_t>(id));
      DeliverProbes();
    } else if (kind == kTagWatch) {
      if (id < watches_.size() && watches_[id]) {
        auto cb = watches_[id];  // it may remove itself
        cb();
      }
    }
    Drain();
  }
}

void Supervisor::Impl::DeliverProbes() {
  if (!probes_->HasDone()) return;
  Reap();
  for (const ProbeRunner::Result& r : probes_->TakeDone()) {
    // Someone else on a port reserved for the process: worth saying even if a later try is the process's own.
    if (r.foreign) core_.AddWarning(core_.view(r.index).plan->name + ": a probe try on its reserved port: " + r.detail);
    core_.OnProbeResult(r.index, r.seq, r.answered, r.detail);
    Drain();  // a try that ended at once (a refusal) may be followed by the next
  }
}

void Supervisor::Impl::TakeQueued(epoll_event* events) {
  // Datagrams first (all of them: Receive reads until EAGAIN), then one look
  // at every fd without waiting. A pipe that keeps writing cannot hold the
  // verdict off: the look is bounded.
  OnNotify();
  Drain();
  for (int pass = 0; pass < 4; ++pass) {
    int n = ::epoll_wait(epoll_.get(), events, 64, 0);
    if (n <= 0) return;
    Dispatch(events, n);
  }
}

int Supervisor::Impl::NextTimeoutMs(SteadyTime now, SteadyTime* asked) const {
  SteadyTime next = core_.NextWake(now);
  // The live view is refreshed at least once a second while someone shows it.
  if (console_) next = std::min(next, last_status_ + kStatusPeriod);
  next = std::min(next, probes_->NextDeadline());
  if (metrics_ && !metrics_->url().empty()) next = std::min(next, last_metrics_ + kMetricsPeriod);
  *asked = next;
  if (next == SteadyTime::max()) return -1;
  if (next <= now) return 0;
  // Round up: waking a millisecond early would spin once more for nothing.
  return static_cast<int>(std::chrono::ceil<Millis>(next - now).count());
}

}  // namespace dflash
