#include "common/proc_scan.h"

#include <dirent.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "common/fd.h"

namespace dflash {

bool ReadProcStat(pid_t pid, ProcStat* out) {
  std::string stat, err;
  if (!ReadFile("/proc/" + std::to_string(pid) + "/stat", &stat, &err)) return false;
  // The command name (field 2) may hold spaces and ')': parse after the last ')'.
  size_t p = stat.rfind(')');
  if (p == std::string::npos || p + 2 >= stat.size()) return false;
  const char* s = stat.c_str() + p + 2;
  out->pid = pid;
  out->state = *s++;
  char* end = nullptr;
  out->ppid = static_cast<pid_t>(std::strtol(s, &end, 10));
  out->pgid = static_cast<pid_t>(std::strtol(end, &end, 10));
  out->sid = static_cast<pid_t>(std::strtol(end, &end, 10));
  return true;
}

std::vector<ProcStat> ChildrenOf(pid_t parent) {
  std::vector<ProcStat> out;
  for (const ProcStat& st : AllProcesses())
    if (st.ppid == parent) out.push_back(st);
  return out;
}

std::vector<pid_t> ZombieChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& st : ChildrenOf(parent))
    if (st.state == 'Z') out.push_back(st.pid);
  return out;
}

std::vector<ProcStat> AllProcesses() {
  std::vector<ProcStat> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (struct dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0) continue;
    ProcStat st;
    if (ReadProcStat(static_cast<pid_t>(pid), &st)) out.push_back(st);
  }
  ::closedir(d);
  return out;
}

std::vector<pid_t> ProcessTree(pid_t root) {
  std::vector<ProcStat> all = AllProcesses();
  std::multimap<pid_t, pid_t> children;
  std::set<pid_t> in{root};
  for (const ProcStat& s : all) {
    children.emplace(s.ppid, s.pid);
    if (s.sid == root) in.insert(s.pid);
  }
  std::vector<pid_t> todo(in.begin(), in.end());
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    auto [b, e] = children.equal_range(p);
    for (auto it = b; it != e; ++it)
      if (in.insert(it->second).second) todo.push_back(it->second);
  }
  return {in.begin(), in.end()};
}

bool InProcessTree(pid_t pid, pid_t root) {
  if (pid <= 0 || root <= 0) return false;
  for (pid_t p : ProcessTree(root))
    if (p == pid) return true;
  return false;
}

}  // namespace dflash
