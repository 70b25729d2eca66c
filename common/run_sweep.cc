#include "common/run_sweep.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "common/fd.h"
#include "common/proc_info.h"
#include "common/proc_scan.h"

namespace dflash {

std::string NewRunToken() {
  unsigned char raw[8] = {};
  UniqueFd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!fd || ::read(fd.get(), raw, sizeof raw) != static_cast<ssize_t>(sizeof raw)) {
    uint64_t x = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(::time(nullptr));
    std::memcpy(raw, &x, sizeof raw);
  }
  static const char hex[] = "0123456789abcdef";
  std::string out = std::to_string(::getpid()) + "-" + std::to_string(ProcessStartTime(::getpid())) + "-";
  for (unsigned char c : raw) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

std::optional<std::string> EnvironValue(pid_t pid, std::string_view name) {
  std::string data;
  if (!ReadProcEnviron(pid, &data)) return std::nullopt;
  size_t start = 0;
  while (start < data.size()) {
    size_t end = data.find('\0', start);
    if (end == std::string::npos) end = data.size();
    std::string_view e(data.data() + start, end - start);
    if (e.size() > name.size() && e[name.size()] == '=' && e.substr(0, name.size()) == name)
      return std::string(e.substr(name.size() + 1));
    start = end + 1;
  }
  return std::nullopt;
}

std::vector<pid_t> OwnChildren() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string text, err;
    if (!ReadFile(std::string("/proc/self/task/") + e->d_name + "/children", &text, &err)) continue;
    const char* s = text.c_str();
    char* end = nullptr;
    for (;;) {
      long pid = std::strtol(s, &end, 10);
      if (end == s) break;
      out.push_back(static_cast<pid_t>(pid));
      s = end;
    }
  }
  ::closedir(d);
  return out;
}

std::vector<pid_t> FindRunProcesses(const SweepTarget& t) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  uid_t me = ::geteuid();
  while (struct dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 1) continue;
    if (std::find(t.spare.begin(), t.spare.end(), pid) != t.spare.end()) continue;
    struct stat st;
    if (::stat(("/proc/" + std::string(e->d_name)).c_str(), &st) != 0) continue;
    if (me != 0 && st.st_uid != me) continue;  // only root may kill another uid's processes
    ProcStat ps;
    if (!ReadProcStat(static_cast<pid_t>(pid), &ps) || ps.state == 'Z') continue;
    if (t.not_before && ProcessStartTime(static_cast<pid_t>(pid)) < t.not_before) continue;
    bool match = std::find(t.sessions.begin(), t.sessions.end(), ps.sid) != t.sessions.end();
    if (!match && !t.token.empty()) {
      auto v = EnvironValue(static_cast<pid_t>(pid), kRunTokenVar);
      match = v && *v == t.token;
    }
    if (match) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

int SweepRun(const SweepTarget& t, int max_passes, std::vector<pid_t>* killed) {
  int sent = 0;
  for (int pass = 0; pass < max_passes; ++pass) {
    std::vector<pid_t> found = FindRunProcesses(t);
    if (found.empty()) break;
    for (pid_t pid : found) {
      if (::kill(pid, SIGKILL) == 0) {
        ++sent;
        if (killed && std::find(killed->begin(), killed->end(), pid) == killed->end()) killed->push_back(pid);
      }
    }
    // A SIGKILLed process may still show as running for an instant (it dies
    // on its way back to user space): give the kernel a moment before the
    // next pass, so a pass finds only what is really left or new.
    ::usleep(2000);
  }
  return sent;
}

}  // namespace dflash
