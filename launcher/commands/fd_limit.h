// The launcher's file-descriptor budget: each supervised process holds a few
// fds in the supervisor for as long as it runs (its two output pipes, its two
// log files, its pidfd), so a 300-process plan needs more than the usual soft
// limit of 1024. Raised to the hard limit at start; said when even that is short.
#pragma once

#include <cstddef>
#include <string>

namespace dflash {

/// About how many fds the supervisor needs for `processes` processes and
/// `port_locks` named-port locks held for the run (one per process and name).
size_t FdsNeeded(size_t processes, size_t port_locks = 0);

/// Raises the soft RLIMIT_NOFILE to the hard limit. Returns false with a
/// message ("N processes need ~M file descriptors; the hard limit is H ...")
/// when the hard limit is below FdsNeeded(processes); `note` tells what was
/// raised (empty if nothing changed).
bool RaiseFdLimit(size_t processes, std::string* note, std::string* err, size_t port_locks = 0);

}  // namespace dflash
