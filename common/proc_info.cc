#include "common/proc_info.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "common/fd.h"

namespace dflash {

uint64_t ProcessStartTime(pid_t pid) {
  std::string stat, err;
  if (!ReadFile("/proc/" + std::to_string(pid) + "/stat", &stat, &err)) return 0;
  // The command name (field 2) may hold spaces and parentheses: count fields
  // from the last ')'.
  size_t p = stat.rfind(')');
  if (p == std::string::npos) return 0;
  int field = 2;
  for (size_t i = p + 1; i < stat.size(); ++i) {
    if (stat[i] != ' ') continue;
    if (++field == 22) return std::strtoull(stat.c_str() + i + 1, nullptr, 10);
  }
  return 0;
}

bool ProcessAlive(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return false;
  uint64_t now = ProcessStartTime(pid);
  if (now == 0) return false;
  // A zombie has exited: it holds no locks and will compile nothing.
  std::string stat, err;
  if (ReadFile("/proc/" + std::to_string(pid) + "/stat", &stat, &err)) {
    size_t p = stat.rfind(')');
    if (p != std::string::npos && p + 2 < stat.size() && stat[p + 2] == 'Z') return false;
  }
  return start_time == 0 || now == start_time;
}

bool ReadProcEnviron(pid_t pid, std::string* block) {
  // Read in chunks: environments of 100 KB+ exist (module systems, conda).
  UniqueFd fd(::open(("/proc/" + std::to_string(pid) + "/environ").c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return false;
  block->clear();
  char buf[16384];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    block->append(buf, static_cast<size_t>(n));
    if (block->size() > (8u << 20)) break;  // a hostile environ: enough
  }
  return true;
}

std::string ProcessName(pid_t pid) {
  std::string comm, err;
  if (!ReadFile("/proc/" + std::to_string(pid) + "/comm", &comm, &err)) return "?";
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm.empty() ? "?" : comm;
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace dflash
