#include "cachelock/fork_guard.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace dflash {
namespace {

// The prepare handler takes the lock and both after-handlers drop it, so the
// child never sees the list half-changed by a thread that no longer exists.
std::mutex g_mu;
std::vector<int>* g_fds = nullptr;  // leaked on purpose: fork may race static destruction

void Prepare() { g_mu.lock(); }
void Parent() { g_mu.unlock(); }
void Child() {
  // Only async-signal-safe calls here: open, dup2, close.
  if (g_fds && !g_fds->empty()) {
    int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd >= 0) {
      for (int fd : *g_fds) ::dup3(null_fd, fd, O_CLOEXEC);
      ::close(null_fd);
    }
  }
  g_mu.unlock();
}

}  // namespace

void GuardFdAcrossFork(int fd) {
  static std::once_flag once;
  std::call_once(once, [] { ::pthread_atfork(Prepare, Parent, Child); });
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_fds) g_fds = new std::vector<int>;
  g_fds->push_back(fd);
}

void UnguardFd(int fd) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_fds) return;
  auto it = std::find(g_fds->begin(), g_fds->end(), fd);
  if (it != g_fds->end()) g_fds->erase(it);
}

}  // namespace dflash
