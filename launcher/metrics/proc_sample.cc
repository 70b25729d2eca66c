#include "launcher/metrics/proc_sample.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/fd.h"

namespace dflash {

bool SampleProc(pid_t pid, ProcSample* out) {
  static const long kTicks = ::sysconf(_SC_CLK_TCK);
  static const long kPage = ::sysconf(_SC_PAGESIZE);
  if (pid <= 0) return false;
  const std::string base = "/proc/" + std::to_string(pid);
  std::string stat, statm, err;
  if (!ReadFile(base + "/stat", &stat, &err) || !ReadFile(base + "/statm", &statm, &err)) return false;
  // The name may hold spaces and parentheses: the fields start after the last ')'.
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  // Fields after the name, counted from 3 (state): 14 utime, 15 stime, 22 starttime.
  const char* p = stat.c_str() + close + 2;
  uint64_t field[23] = {};
  for (int f = 3; f <= 22 && *p; ++f) {
    char* end = nullptr;
    field[f] = std::strtoull(p, &end, 10);
    p = std::strchr(p, ' ');
    if (!p) break;
    ++p;
  }
  out->cpu_s = static_cast<double>(field[14] + field[15]) / static_cast<double>(kTicks);
  out->start_ticks = field[22];
  // statm: size resident shared ... in pages.
  const char* rest = std::strchr(statm.c_str(), ' ');
  out->rss_bytes = rest ? static_cast<int64_t>(std::strtoll(rest + 1, nullptr, 10)) * kPage : 0;
  return true;
}

}  // namespace dflash
