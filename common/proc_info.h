// What /proc tells about a process: enough to tell a live owner from a reused pid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace dflash {

/// The process's start time in clock ticks since boot (field 22 of
/// /proc/<pid>/stat), or 0 if the process does not exist.
uint64_t ProcessStartTime(pid_t pid);

/// True if `pid` exists and, when `start_time` is non-zero, is the same process
/// that had that start time (pids are reused; start times are not).
bool ProcessAlive(pid_t pid, uint64_t start_time);

/// This machine's host name ("?" if unknown).
std::string HostName();

/// /proc/<pid>/environ: the NUL-separated "K=V" entries the process was exec'd with (at most 8 MiB of them: a
/// hostile environ is cut there). False if it cannot be read (gone, another user's).
bool ReadProcEnviron(pid_t pid, std::string* block);

/// /proc/<pid>/comm without its newline ("?" if unreadable): a process's name for messages.
std::string ProcessName(pid_t pid);

}  // namespace dflash
