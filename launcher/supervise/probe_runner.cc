#include "launcher/supervise/probe_runner.h"

#include <sys/epoll.h>

#include <algorithm>
#include <chrono>

#include "common/listener_owner.h"

namespace dflash {
namespace {

// How often a held try looks again for the socket that accepted it: a server accepts within microseconds of
// being scheduled; this bounds the /proc scans of a server that is slow to accept.
constexpr auto kRecheck = std::chrono::milliseconds(10);

std::string AnsweredByAnother(const std::string& who) {
  return "accepted by " + who + ", not by this process: the reserved port was answered by someone else";
}

}  // namespace

bool ReservedFor(const ProcessPlan& p, int port) {
  return port > 0 && std::find(p.ports.begin(), p.ports.end(), port) != p.ports.end();
}

bool ProbeRunner::ProveOwnPort(const Try& t, std::string* detail, bool* foreign) {
  // After the answer: if every listener on the port is the process's now, the port is its server's from here
  // on (no other socket can bind it while that one listens), whoever answered this one try.
  std::string who, err;
  const std::string port = "its reserved port " + std::to_string(t.spec->port);
  switch (ProveListener(t.spec->port, t.owner, &who, &err)) {
    case ListenerProof::kOurs:
      return true;
    case ListenerProof::kForeign:
      *foreign = true;
      *detail = *detail + ", but " + port + " is held by " + who +
                ", not by this process: the reserved port was taken by someone else";
      return false;
    case ListenerProof::kNone:
      break;
  }
  *detail = *detail + ", but no listener on " + port + " is this process's" + (err.empty() ? "" : " (" + err + ")");
  return false;
}

ProbeRunner::~ProbeRunner() {
  for (auto& [id, t] : tries_)
    if (t->probe.socket() >= 0) ::epoll_ctl(epoll_, EPOLL_CTL_DEL, t->probe.socket(), nullptr);
}

void ProbeRunner::Start(size_t index, uint64_t seq, const ProbeSpec& spec, SteadyTime now, pid_t owner) {
  uint32_t id = next_id_++;
  auto t = std::make_unique<Try>();
  t->index = index;
  t->seq = seq;
  t->owner = owner;
  t->spec = &spec;
  t->deadline = now + spec.timeout;
  Try& ref = *t;
  tries_[id] = std::move(t);
  std::string request = spec.Request();
  if (owner > 0 && !request.empty()) ref.probe.HoldRequest();
  if (!ref.probe.Start(spec.host, spec.port, std::move(request), kMaxStatusLine)) return Finish(id);
  if (ref.probe.done()) return Finish(id);
  epoll_event ev{};
  ev.events = ref.events = ref.probe.events();
  ev.data.u64 = tag_base_ | id;
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, ref.probe.fd(), &ev) != 0) {
    done_.push_back({index, seq, false, ErrnoMessage("epoll_ctl", errno)});
    tries_.erase(id);  // closes its socket
    return;
  }
  if (ref.probe.held()) CheckPeer(id, now);
}

void ProbeRunner::Rearm(uint32_t id, Try& t) {
  uint32_t want = t.probe.events();
  if (want == t.events) return;
  epoll_event ev{};
  ev.events = t.events = want;
  ev.data.u64 = tag_base_ | id;
  ::epoll_ctl(epoll_, EPOLL_CTL_MOD, t.probe.fd(), &ev);
}

void ProbeRunner::CheckPeer(uint32_t id, SteadyTime now) {
  Try& t = *tries_.at(id);
  std::string who;
  switch (ProvePeer(t.probe.fd(), t.owner, &who)) {
    case PeerProof::kOurs:
      t.recheck = SteadyTime::max();
      t.probe.Release();
      return Rearm(id, t);
    case PeerProof::kForeign:
      return Finish(id, AnsweredByAnother(who), /*foreign=*/true);
    case PeerProof::kPending:
      t.recheck = now + kRecheck;
      return Rearm(id, t);
  }
}

bool ProbeRunner::AcceptedByAnother(const Try& t, std::string* detail) {
  std::string who;
  if (t.probe.socket() < 0 || ProvePeer(t.probe.socket(), t.owner, &who) != PeerProof::kForeign) return false;
  *detail = *detail + ", but it was " + AnsweredByAnother(who);
  return true;
}

void ProbeRunner::OnReady(uint32_t id) {
  auto it = tries_.find(id);
  if (it == tries_.end()) return;  // ended earlier in this batch
  Try& t = *it->second;
  if (t.probe.OnReady()) return Finish(id);
  if (t.probe.held() && t.recheck == SteadyTime::max()) return CheckPeer(id, std::chrono::steady_clock::now());
  Rearm(id, t);
}

void ProbeRunner::Expire(SteadyTime now) {
  std::vector<uint32_t> late, recheck;
  for (auto& [id, t] : tries_) {
    if (now >= t->deadline) late.push_back(id);
    else if (now >= t->recheck) recheck.push_back(id);
  }
  for (uint32_t id : late) {
    const Try& t = *tries_[id];
    Finish(id, t.probe.held() ? "connected, but no socket of this process accepted the connection within " +
                                    FormatDuration(t.spec->timeout) + " (another's, or not on this host)"
                              : std::string(t.probe.connected() ? "no answer" : "no connect") + " within " +
                                    FormatDuration(t.spec->timeout));
  }
  for (uint32_t id : recheck)
    if (tries_.count(id)) CheckPeer(id, now);
}

SteadyTime ProbeRunner::NextDeadline() const {
  SteadyTime next = SteadyTime::max();
  for (const auto& [id, t] : tries_) next = std::min({next, t->deadline, t->recheck});
  return next;
}

void ProbeRunner::Finish(uint32_t id, const std::string& timeout_detail, bool foreign) {
  auto it = tries_.find(id);
  if (it == tries_.end()) return;
  Try& t = *it->second;
  if (t.probe.socket() >= 0) ::epoll_ctl(epoll_, EPOLL_CTL_DEL, t.probe.socket(), nullptr);
  Result r;
  r.index = t.index;
  r.seq = t.seq;
  r.foreign = foreign;
  if (!timeout_detail.empty()) r.detail = timeout_detail;
  else
    r.answered = JudgeProbe(*t.spec, t.probe.connected(), t.probe.reply(), t.probe.complete(), t.probe.error(),
                            &r.detail);
  // A connect-only try's socket is still open here: who accepted it is known if anyone did.
  if (r.answered && t.owner > 0 && t.spec->Request().empty() && AcceptedByAnother(t, &r.detail))
    r.answered = false, r.foreign = true;
  if (r.answered && t.owner > 0) r.answered = ProveOwnPort(t, &r.detail, &r.foreign);
  done_.push_back(std::move(r));
  tries_.erase(it);  // closes its socket
}

std::vector<ProbeRunner::Result> ProbeRunner::TakeDone() {
  std::vector<Result> out;
  out.swap(done_);
  return out;
}

}  // namespace dflash
