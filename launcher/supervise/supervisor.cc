// The supervisor's public face: Supervisor's methods over its shell (supervisor_internal.h), the watches of
// the caller's fds, and the shell's construction.
#include "launcher/supervise/supervisor.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>

#include "common/fd.h"
#include "launcher/supervise/supervisor_internal.h"

namespace dflash {
namespace {

LogRouter::Options RouterOptions(const Plan& plan) {
  LogRouter::Options o;
  o.files = plan.Files();
  return o;
}

}  // namespace

Supervisor::Impl::Impl(const Plan& plan, SupervisorOptions options, Console* console,
                       std::shared_ptr<spdlog::logger> log)
    : plan_(plan),
      options_(std::move(options)),
      console_(console),
      log_(std::move(log)),
      core_(plan, [] { return std::chrono::steady_clock::now(); }),
      router_(console, RouterOptions(plan)) {
  os_.resize(core_.size());
  core_.node_rounds = options_.node_rounds;
  core_.stop_signals = plan.config.run.stop_signals;
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  probes_ = std::make_unique<ProbeRunner>(epoll_.get(), Tag(kTagProbe, 0));
  core_.status_base.run_id = plan_.run_id;
  core_.status_base.run_dir = plan_.run_dir;
  core_.status_base.supervisor_pid = static_cast<int>(::getpid());
}

// --- the public face ------------------------------------------------------------

std::vector<int> Supervisor::HandledSignals(const Plan& plan) {
  std::vector<int> s = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};
  for (const std::vector<int>* list : {&plan.config.run.forward_signals, &plan.config.run.stop_signals})
    for (int f : *list)
      if (std::find(s.begin(), s.end(), f) == s.end()) s.push_back(f);
  return s;
}

Supervisor::Supervisor(const Plan& plan, SupervisorOptions options, Console* console,
                       std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>(plan, std::move(options), console, std::move(log))) {}

Supervisor::~Supervisor() = default;

int Supervisor::Run() { return impl_->Run(); }

RunSummary Supervisor::Summary() const {
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->t0_).count();
  return impl_->core_.Summary(wall, impl_->start_error_);  // built once, by the core
}

void Supervisor::RecordsIncomplete(const std::string& what) { impl_->core_.RecordsIncomplete(what); }

ControlHandler& Supervisor::control() { return *impl_; }

void Supervisor::BeginRound(int round, const std::string& why) {
  impl_->core_.BeginRound(round, why);
  impl_->Drain();
}
void Supervisor::StartRound(int round) {
  impl_->core_.StartRound(round);
  impl_->Drain();
}
void Supervisor::StopForNode(NodeStop stop) {
  impl_->core_.StopForNode(std::move(stop));
  impl_->Drain();
}

bool Supervisor::AddWatch(int fd, std::function<void()> on_readable, std::string* err) {
  if (!impl_->epoll_) {
    *err = ErrnoMessage("epoll_create1", errno);
    return false;
  }
  size_t id = impl_->watches_.size();
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Impl::Tag(Impl::kTagWatch, id);
  if (::epoll_ctl(impl_->epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    *err = ErrnoMessage("epoll_ctl", errno);
    return false;
  }
  impl_->watches_.push_back(std::move(on_readable));
  impl_->watch_fds_.push_back(fd);
  return true;
}

void Supervisor::RemoveWatch(int fd) {
  for (size_t id = 0; id < impl_->watch_fds_.size(); ++id) {
    if (impl_->watch_fds_[id] != fd) continue;
    ::epoll_ctl(impl_->epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    impl_->watch_fds_[id] = -1;
    impl_->watches_[id] = nullptr;
  }
}

}  // namespace dflash
