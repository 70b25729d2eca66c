// The payload's stdout/stderr in log mode: pipes the host reads and relays
// through OutputRelay, each whole line offered to readiness_ as evidence.
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "worker/payload_host_internal.h"

namespace dflash {

void PayloadHost::MakeRelays() {
  for (int i = 0; i < 2; ++i) {
    auto on_line = [this, i](std::string_view line) {
      if (readiness_->WantsLines()) Evidence([&] { return readiness_->OnLine(i, line); });
    };
    relays_[i] = std::make_unique<OutputRelay>(i == 0 ? o_.stdout_fd : o_.stderr_fd, on_line);
  }
}

bool PayloadHost::OpenPipes(SpawnOptions* so, std::array<UniqueFd, 2>* write_ends, std::string* err) {
  for (int i = 0; i < 2; ++i) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      *err = ErrnoMessage("pipe2", errno);
      return false;
    }
    pipes_[i].reset(p[0]);
    (*write_ends)[i].reset(p[1]);
    ::fcntl(p[0], F_SETFL, O_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = i == 0 ? kTagStdout : kTagStderr;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, p[0], &ev);
  }
  so->stdout_fd = (*write_ends)[0].get();
  so->stderr_fd = (*write_ends)[1].get();
  return true;
}

void PayloadHost::OnPipe(int i, size_t budget) {
  char buf[65536];
  size_t total = 0;
  while (pipes_[i] && total < budget) {
    ssize_t n = ::read(pipes_[i].get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: drained for now
    if (n == 0) {
      relays_[i]->Finish();
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, pipes_[i].get(), nullptr);
      pipes_[i].reset();
      return;
    }
    total += static_cast<size_t>(n);
    relays_[i]->Feed(std::string_view(buf, static_cast<size_t>(n)));
  }
}

void PayloadHost::DrainPipes() {
  // The group is gone. Take what is still buffered; a writer that escaped the
  // group (setsid) may hold the pipe open, so never wait for its EOF.
  for (int i = 0; i < 2; ++i) {
    if (!pipes_[i]) continue;  // already finished at EOF
    OnPipe(i, SIZE_MAX);
    if (pipes_[i]) relays_[i]->Finish();  // no EOF: flush the partial last line
  }
}

}  // namespace dflash
