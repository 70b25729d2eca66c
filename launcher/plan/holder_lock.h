// An exclusive lock on a file that also says who holds it: the run id's lock
// in its run dir, and the per-host port reservations.
#pragma once

#include <string>

#include "common/fd.h"

namespace dflash {

enum class HolderLockResult { kAcquired, kHeld, kFailed };

/// Tries once (never waits) to take an exclusive flock(2) on `path`, creating
/// it (0644, no symlink followed) if needed; on success writes `record` into it
/// and keeps the fd in `out`. kHeld: `holder` is the holder's record (or a
/// note that it has not written one yet). kFailed: `holder` is the error.
///
/// Why flock and not fcntl/OFD record locks: a flock needs no write access, so
/// another user's launcher can still take (and be refused) a port lock file
/// someone else created in the shared sticky directory; and like an OFD lock it
/// belongs to the open file description, not the process. The fd is O_CLOEXEC:
/// no child inherits it, so the lock lives exactly as long as this launcher,
/// and the kernel drops it even when the launcher is SIGKILLed. On NFS, Linux
/// emulates flock with a POSIX lock of the whole file, which also works across hosts.
/// `mode`: of a lock file we create (0644: others may read who holds it).
/// `failed_errno`: on kFailed, the errno of the call that failed.
HolderLockResult TryHolderLock(const std::string& path, const std::string& record, UniqueFd* out,
                               std::string* holder, unsigned mode = 0644, int* failed_errno = nullptr);

/// "dflash-launch pid 123 on host h, <what>, since 2026-12-01 00:12:03 UTC"
std::string HolderRecord(const std::string& what);

}  // namespace dflash
