#include "testing/wait.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace dflash::test {

bool WaitUntil(const std::function<bool()>& condition, std::chrono::steady_clock::time_point deadline,
               std::chrono::milliseconds step) {
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(step);
  }
  return condition();
}

bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
               std::chrono::milliseconds step) {
  return WaitUntil(condition, std::chrono::steady_clock::now() + timeout, step);
}

bool ReadUntil(int fd, std::string_view want, std::string* got, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  while (got->find(want) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r != 1) return false;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got->append(buf, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace dflash::test
