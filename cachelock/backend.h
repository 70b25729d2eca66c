// The seam between the gate's policy (gate.h) and the OS (os_backend.h): a fake in tests.
#pragma once

#include <chrono>
#include <string>

#include "cachelock/ofd_lock.h"
#include "cachelock/records.h"

namespace dflash {

/// Time as the gate sees it: steady time for deadlines and cadence, wall
/// time for records people read, and sleeping, so that a fake clock can
/// drive an hour of waiting in a microsecond.
class GateClock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~GateClock() = default;
  virtual TimePoint Now() = 0;
  virtual double WallSeconds() = 0;  ///< unix seconds
  virtual void SleepFor(std::chrono::microseconds d) = 0;
};

/// The real clocks; one shared instance.
GateClock* RealGateClock();

/// The two lock levels, their owner records and the READY markers of one gate
/// dir, as primitive operations. No policy here: no retries, no deadlines, no
/// decisions about who is dead -- those live in CompileGate.
class GateBackend {
 public:
  virtual ~GateBackend() = default;

  // Level (a), the host-local named mutex.
  /// Waits at most `slice` (zero: just tries). kBusy when the slice passed.
  virtual LockAttempt LockLocal(std::chrono::milliseconds slice, std::string* err) = 0;
  /// Lets go of (a). Never raises the count above one, so a holder that was
  /// (wrongly) taken over and still unlocks does not admit two later holders.
  virtual void UnlockLocal() = 0;
  virtual RecordState ReadLocalOwner(OwnerRecord* out) = 0;
  virtual bool WriteLocalOwner(const OwnerRecord& r, std::string* err) = 0;
  virtual void ClearLocalOwner() = 0;

  // Level (b), the file lock: the authority.
  virtual LockAttempt TryLockFile(std::string* err) = 0;
  virtual void UnlockFile() = 0;
  /// Who holds (b) according to the kernel, for messages about a holder that
  /// wrote no record (a Python fcntl.lockf user).
  virtual LockProbe ProbeFile() = 0;
  virtual RecordState ReadHolder(OwnerRecord* out) = 0;
  virtual bool WriteHolder(const OwnerRecord& r, std::string* err) = 0;
  virtual void ClearHolder() = 0;

  // READY markers.
  /// True if READY(key) exists and is a whole, readable record.
  virtual bool ReadReady(const std::string& key, ReadyRecord* out) = 0;
  /// REQUIRES: both levels held. Atomic: readers see no marker or all of it.
  virtual bool PublishReady(const ReadyRecord& r, std::string* err) = 0;
  /// REQUIRES: both levels held. `*existed` says whether there was one.
  virtual bool RemoveReady(const std::string& key, bool* existed, std::string* err) = 0;

  // Processes.
  /// This process as an owner record (pid, start time, host), role/key/since unset.
  virtual OwnerRecord Self() = 0;
  /// False only when the owner is provably gone. An owner on another host
  /// cannot be checked from here and counts as alive.
  virtual bool OwnerAlive(const OwnerRecord& r) = 0;
};

}  // namespace dflash
