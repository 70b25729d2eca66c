// CompileGate: one process per cache dir compiles, the others wait and then reuse its cache.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "cachelock/backend.h"
#include "contract/defaults.h"  // kDefaultGateTimeout
#include "cachelock/records.h"

namespace dflash {

/// How a gate call failed. Each maps to one exit code of dflash-cachelock.
enum class GateError {
  kOk,
  kTimeout,       ///< waited longer than GateOptions::timeout; the error names the holder (75)
  kCannotCreate,  ///< the gate dir is insecure or its files/mutex cannot be created (73)
  kBadKey,        ///< the key is not [A-Za-z0-9._-]{1,128} (64)
  kMisuse,        ///< a call this object cannot honour: see the error text (1)
  kIo,            ///< an OS call failed on a gate that was usable before (1)
};
int GateExitCode(GateError e);

/// What Acquire decided. kLead: this process compiles, holding the gate until
/// Release (after Publish, once its payload is ready). kReuse: READY(key) is
/// there, nothing is held, run and load the cache.
/// (DFLASH_GATE_ROLE spells it as a GateRole, contract/gate_facts.h.)
enum class GateDecision { kLead, kReuse };


struct GateOptions {
  std::string dir;                 ///< the cache dir the gate protects
  std::string role = "dflash";     ///< who we are, in records and messages: "drafter:0"
  std::string torch_version;       ///< goes into READY markers; empty if unknown
  std::vector<ReadySource> sources;  ///< the derived key's files, into READY markers
  std::string gpu;                 ///< the GPU identity, into READY markers likewise
  std::string cpu;                 ///< the CPU identity (common/cpu_identity.h), into READY markers likewise
  std::chrono::milliseconds timeout = kDefaultGateTimeout;  ///< bound on any wait
  std::chrono::milliseconds progress_every = std::chrono::seconds(5);
  /// Called every `progress_every` while waiting with a ready-made line:
  /// "waiting for gate K: held by drafter:0 (pid 1234) for 42 s".
  std::function<void(std::string_view line)> on_progress;
  /// Level (a) is waited for in slices this long; after each, a waiter looks
  /// whether the recorded owner is still alive.
  std::chrono::milliseconds local_slice = std::chrono::milliseconds(50);
  /// How long level (a) may stay taken with no owner record before a waiter
  /// takes it over: the window between a holder's sem_wait and its record
  /// write, in which a SIGKILL leaves no name behind.
  std::chrono::milliseconds empty_owner_grace = std::chrono::milliseconds(500);
  /// Test seam: runs when a waiter that judged the owner of (a) gone holds
  /// (b) and is about to re-read the record and decide. Tests pause here to
  /// widen the decide-then-write window that (b) must keep to one recoverer.
  std::function<void()> before_recovery_decision;
};

struct AcquireResult {
  GateDecision decision = GateDecision::kLead;
  ReadyRecord marker;        ///< kReuse: the marker that was found
  bool took_lock = false;    ///< kReuse found only after locking (the double check)
  bool recovered = false;    ///< level (a) was taken over from a dead owner
  /// kLead: the holder record of (b) that a holder left behind when it died
  /// holding the gate (the kernel dropped its lock, nobody cleared the
  /// record); pid 0 if the last holder let go cleanly. Its process tree may
  /// still run: see holder_tree.h.
  OwnerRecord dead_holder;
  double waited_seconds = 0;
};

/// The gate of one cache dir. One object per thread: the object guards
/// itself against concurrent use (kMisuse), and separate objects -- in one
/// process or many -- exclude each other through the file lock.
/// Not usable in a forked child: open a new one there (kMisuse otherwise).
class CompileGate {
 public:
  /// Opens the gate of options.dir (creating it 0700 if missing). kCannotCreate
  /// with the reason and the fixing chmod/chown if the dir is insecure.
  static GateError Open(GateOptions options, std::unique_ptr<CompileGate>* out, std::string* err);

  /// For tests and for other backends; `clock` must outlive the gate.
  CompileGate(GateOptions options, std::unique_ptr<GateBackend> backend, GateClock* clock);
  ~CompileGate();
  CompileGate(const CompileGate&) = delete;
  CompileGate& operator=(const CompileGate&) = delete;

  /// READY(key) present -> kReuse at once, nothing locked. Otherwise takes both
  /// levels, looks again -> kReuse (released again) or kLead (held).
  GateError Acquire(const std::string& key, AcquireResult* result, std::string* err);

  /// REQUIRES: Acquire returned kLead and Release was not called. Writes
  /// READY(key) atomically; the gate stays held until Release.
  GateError Publish(std::string* err);

  /// Lets go of both levels (a no-op if nothing is held). A leader that
  /// releases without Publish leaves no marker: the next waiter leads.
  void Release();

  /// Takes the gate for maintenance of the cache (export, import, clear),
  /// whatever READY markers exist: waits like Acquire (progress, timeout),
  /// then holds both levels until Release. `purpose` ([A-Za-z0-9._-]) names
  /// the holder in records, e.g. "cache-clear". Publish is refused meanwhile.
  GateError Hold(const std::string& purpose, std::string* err);

  /// Removes READY(key) under the gate, to force a recompile.
  GateError Forget(const std::string& key, bool* existed, std::string* err);

  /// This process as the gate records it (pid, start time, host).
  OwnerRecord Self() { return backend_->Self(); }

  /// Who holds (b) now, if anyone alive does (for a waiter's diagnostics).
  bool CurrentHolder(OwnerRecord* out);

  bool holding() const { return holding_; }
  const GateOptions& options() const { return options_; }

 private:
  struct Wait;
  GateError Enter(std::string* err);
  GateError LockBoth(Wait& w, bool* recovered, std::string* err, OwnerRecord* dead_holder = nullptr);
  /// READY(key) is there and was made for our CPU (GateOptions::cpu; unchecked when that is empty).
  bool WarmForUs(const std::string& key, ReadyRecord* marker) const;
  GateError LockFileLevel(Wait& w, std::string* err);
  GateError Tick(Wait& w, std::string* err);
  bool ShouldRecover(Wait& w, OwnerRecord* judged, bool* judged_empty);
  bool StillStuck(const OwnerRecord& judged, bool judged_empty);
  GateError WriteRecords(const std::string& key, bool local, bool file, std::string* err);
  void ReleaseLevels();
  std::string DescribeHolder(const Wait& w);
  OwnerRecord Me(const std::string& key);

  GateOptions options_;
  std::unique_ptr<GateBackend> backend_;
  GateClock* clock_;
  pid_t opened_by_;
  std::atomic<bool> busy_{false};  // set for a whole Acquire..Release span
  bool holding_ = false;
  std::string lead_key_;
  GateClock::TimePoint lead_since_{};
};

}  // namespace dflash
