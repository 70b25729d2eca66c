// What the processes report and what the shell reports: the notify socket's datagrams (each process's
// READY, STATUS, MAINPID claim, ...) to the core; the run's events.jsonl, the console's live status and
// systemd's notify socket from it.
#include <time.h>

#include "common/fd.h"
#include "common/notify.h"
#include "launcher/supervise/cgroup_tree.h"
#include "launcher/supervise/pid_claim.h"
#include "launcher/supervise/supervisor_internal.h"
#include "worker/protocol.h"

namespace dflash {

void Supervisor::Impl::OnNotify() {
  std::vector<NotifyMessage> msgs;
  std::string err;
  if (!notify_.Receive(&msgs, &err)) Warn("notify socket: " + err);
  for (const NotifyMessage& m : msgs) {
    int i = core_.FindSender(m.pid, m.pgid);
    if (i < 0) continue;  // a late message from a process already gone
    NotifyFields f = DecodeNotify(m.fields);
    if (f.main_pid) CheckMainPid(static_cast<size_t>(i), &f);
    core_.OnReport(static_cast<size_t>(i), f);
  }
}

void Supervisor::Impl::CheckMainPid(size_t i, NotifyFields* f) {
  const ProcView p = core_.view(i);
  std::string leaf = guard_.cgroup() ? guard_.cgroup_dir() + "/" + LeafName(i, p.attempt) : std::string();
  std::string why;
  VerifiedPid v;
  if (p.alive() && CheckPidClaim(*f->main_pid, p.pid, leaf, &v, &why)) {
    os_[i].payload = v;
    return;
  }
  if (why.empty()) why = "MAINPID=" + std::to_string(*f->main_pid) + " came after its process ended";
  f->main_pid.reset();  // the claim never reaches the core: nothing is shown, measured or killed by it
  Warn(p.plan->name + ": " + why + ": ignored");
}

void Supervisor::Impl::WriteEvent(nlohmann::json event) {
  status_dirty_ = true;
  if (!events_file_) return;
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  event["time"] = static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
  std::string line = event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  // One write per line on an O_APPEND fd: a reader never sees half a line.
  std::string werr;
  if (!WriteAll(events_file_.get(), line, &werr) && log_)
    log_->warn("cannot write events.jsonl: {}", werr);
}

void Supervisor::Impl::PublishStatus(bool force) {
  if (!console_) return;
  SteadyTime now = std::chrono::steady_clock::now();
  if (!force && !status_dirty_ && now - last_status_ < kStatusPeriod) return;
  status_dirty_ = false;
  last_status_ = now;
  console_->SetStatus(core_.Status());
}

void Supervisor::Impl::TellSystemd(const std::string& message) {
  if (options_.systemd_notify_socket.empty()) return;
  std::string err;
  if (!NotifySendTo(options_.systemd_notify_socket, message, &err) && log_) log_->warn("systemd notify: {}", err);
}

}  // namespace dflash
