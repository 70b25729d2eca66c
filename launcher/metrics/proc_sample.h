// CPU time and resident memory of one process, from /proc/<pid>/stat and /proc/<pid>/statm.
// Hand-written: two small files of fixed layout, and the launcher has no process-metrics library
// (prometheus-cpp's process collector measures only its own process).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace dflash {

struct ProcSample {
  double cpu_s = 0;        ///< user + system time, seconds
  int64_t rss_bytes = 0;   ///< resident set size
  uint64_t start_ticks = 0;  ///< its start (clock ticks after boot): tells a reused pid apart
};

/// False when the process is gone or its files cannot be read.
bool SampleProc(pid_t pid, ProcSample* out);

}  // namespace dflash
