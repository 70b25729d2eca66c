#include "cachelock/holder_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "common/fd.h"
#include "common/run_sweep.h"

namespace dflash {
namespace {

/// utime + stime + cutime + cstime of /proc/<pid>/stat in seconds; 0 if it is gone. The children's
/// part keeps a tree's sum from dropping when a compiler child (g++) exits and is reaped.
double CpuSeconds(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return 0;
  char buf[1024];
  ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command may hold spaces and parens
  if (!p) return 0;
  // Fields after ") ": 3 state ... 14 utime, 15 stime, 16 cutime, 17 cstime.
  unsigned long long utime = 0, stime = 0;
  long long cutime = 0, cstime = 0;
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld", &utime, &stime, &cutime,
                  &cstime) != 4)
    return 0;
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  return static_cast<double>(utime + stime + static_cast<unsigned long long>(std::max(0LL, cutime + cstime))) /
         static_cast<double>(ticks > 0 ? ticks : 100);
}

}  // namespace

std::string HolderToken(const OwnerRecord& holder) {
  return std::to_string(holder.pid) + "." + std::to_string(holder.start_time);
}

std::vector<pid_t> HolderTreePids(const std::string& token) {
  std::vector<pid_t> out;
  if (token.empty()) return out;
  const uid_t me = ::getuid();
  const pid_t self = ::getpid();
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end != '\0' || pid <= 0 || pid == self) continue;
    struct stat st;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%ld", pid);
    // Only our own processes: another user's are not ours to judge or kill.
    if (::stat(path, &st) != 0 || st.st_uid != me) continue;
    if (EnvironValue(static_cast<pid_t>(pid), kHolderEnvVar) == token) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

bool KillHolderTree(const std::string& token, std::chrono::milliseconds wait, int* killed, std::string* err) {
  *killed = 0;
  auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<pid_t> left;
  std::set<pid_t> seen;
  for (;;) {
    left.clear();
    // A zombie's environ reads empty: it is dead already and not listed.
    for (pid_t pid : HolderTreePids(token)) {
      if (::kill(pid, SIGKILL) == 0 && seen.insert(pid).second) ++*killed;
      left.push_back(pid);
    }
    if (left.empty()) return true;
    if (std::chrono::steady_clock::now() >= deadline) break;
    // Killed processes vanish from /proc once reaped by their parent (or init).
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string pids;
  for (pid_t p : left) pids += (pids.empty() ? "" : ", ") + std::to_string(p);
  *err = "still running after SIGKILL: pid " + pids + " (uninterruptible?)";
  return false;
}

double HolderTreeCpuSeconds(const std::string& token) { return HolderTreeCpuSeconds(HolderTreePids(token)); }

double HolderTreeCpuSeconds(const std::vector<pid_t>& pids) {
  double total = 0;
  for (pid_t pid : pids) total += CpuSeconds(pid);
  return total;
}

}  // namespace dflash
