// The payload host's readiness evidence: notify datagrams from the payload's
// group, and the `file` readiness path; contract/readiness.h judges them.
#include <sys/stat.h>
#include <sys/wait.h>

#include "worker/payload_host_internal.h"
#include "worker/protocol.h"

namespace dflash {

void PayloadHost::Evidence(const std::function<bool()>& feed) {
  if (!readiness_->waiting()) return;
  // Evidence counts only from a payload that is alive or ended well (the
  // Readiness rule). A dead but unreaped payload is judged by its exit
  // status, which reaping brings: PayloadExited drains the evidence again.
  if (!exited_ && PayloadIsZombie()) {
    Reap();
    return;
  }
  if (feed()) Ready();
}

void PayloadHost::Ready() {
  file_tick_.reset();
  for (auto& r : relays_)
    if (r) r->StopLines();
  if (o_.on_ready) o_.on_ready();
  if (o_.stop_when_ready && !exited_) {
    stopped_when_ready_ = true;
    StartStop();
  }
}

bool PayloadHost::PayloadIsZombie() const {
  siginfo_t si{};
  return ::waitid(P_PID, static_cast<id_t>(pid_), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid_;
}

void PayloadHost::OnNotify() {
  std::vector<NotifyMessage> msgs;
  std::string err;
  listener_.Receive(&msgs, &err);  // an error here only loses diagnostics
  for (const auto& m : msgs) {
    // The payload itself, or anything in its process group (systemd-notify
    // run by a payload shell). Others on this host may know the address.
    if (m.pid != pid_ && !(m.pgid > 0 && m.pgid == pid_)) continue;
    NotifyFields f = DecodeNotify(m.fields);
    if (o_.on_notify) o_.on_notify(f);
    if (f.status && o_.on_status) o_.on_status(*f.status);
    if (f.watchdog && o_.on_watchdog) o_.on_watchdog();
    if (f.ready) Evidence([&] { return readiness_->OnNotifyReady(); });
  }
}

void PayloadHost::CheckFile() {
  std::string path = o_.ready.arg;
  if (!path.empty() && path[0] != '/' && !o_.cwd.empty()) path = o_.cwd + "/" + path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    Evidence([&] { return readiness_->OnFileExists(); });
  } else if (readiness_->WantsFileCheck()) {
    file_tick_ = Clock::now() + kFileTick;
  }
}

}  // namespace dflash
