#include "cachelock/gate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "cachelock/os_backend.h"
#include "common/duration.h"
#include "common/exit_codes.h"

namespace dflash {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

// Level (b) is polled, not waited for in the kernel (no timed F_OFD_SETLKW).
// Back-off from 100 us keeps a hand-off through a free lock instant; the cap
// bounds the lock traffic of the one process per host that polls (on NFS each
// try is a round trip to the server).
constexpr microseconds kFilePollFirst{100};
constexpr microseconds kFilePollMax{20000};
constexpr size_t kMaxRoleBytes = 100;  // records must fit RecordFile's slot

double Seconds(GateClock::TimePoint::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int GateExitCode(GateError e) {
  switch (e) {
    case GateError::kOk: return exit_code::kOk;
    case GateError::kTimeout: return exit_code::kTimeout;
    case GateError::kCannotCreate: return exit_code::kCannotCreate;
    case GateError::kIo: return exit_code::kCannotCreate;
    case GateError::kBadKey: return exit_code::kUsage;
    case GateError::kMisuse: return exit_code::kFailure;
  }
  return exit_code::kFailure;
}


struct CompileGate::Wait {
  Wait(std::string k, GateClock::TimePoint now, const GateOptions& o)
      : key(std::move(k)), start(now), deadline(now + o.timeout), next_progress(now + o.progress_every) {}
  std::string key;
  GateClock::TimePoint start, deadline, next_progress;
  std::optional<GateClock::TimePoint> empty_since;  // level (a) taken, nobody recorded
  bool have_local = false;                          // we hold (a), waiting for (b)
};

GateError CompileGate::Open(GateOptions options, std::unique_ptr<CompileGate>* out, std::string* err) {
  std::unique_ptr<GateBackend> backend = OpenOsGateBackend(options.dir, nullptr, err);
  if (!backend) return GateError::kCannotCreate;
  *out = std::make_unique<CompileGate>(std::move(options), std::move(backend), RealGateClock());
  return GateError::kOk;
}

CompileGate::CompileGate(GateOptions options, std::unique_ptr<GateBackend> backend, GateClock* clock)
    : options_(std::move(options)), backend_(std::move(backend)), clock_(clock), opened_by_(::getpid()) {
  if (options_.role.size() > kMaxRoleBytes) options_.role.resize(kMaxRoleBytes);
}

CompileGate::~CompileGate() { Release(); }

GateError CompileGate::Enter(std::string* err) {
  if (::getpid() != opened_by_) {
    *err = fmt::format("this gate was opened by pid {}; a forked child must open its own", opened_by_);
    return GateError::kMisuse;
  }
  bool expected = false;
  if (!busy_.compare_exchange_strong(expected, true)) {
    *err = "this CompileGate is already held or being acquired: use one object per thread";
    return GateError::kMisuse;
  }
  return GateError::kOk;
}

bool CompileGate::WarmForUs(const std::string& key, ReadyRecord* marker) const {
  if (!backend_->ReadReady(key, marker)) return false;
  // A READY made for another CPU (a shared cache dir, an explicit key), or by a version that did not record its
  // CPU, promises nothing here: our processes' Inductor keys carry our CPU (common/cpu_identity.h), so they would
  // miss every entry it stands for. We lead, and our READY replaces it.
  return options_.cpu.empty() || marker->cpu == options_.cpu;
}

GateError CompileGate::Acquire(const std::string& key, AcquireResult* result, std::string* err) {
  if (!ValidGateKey(key, err)) return GateError::kBadKey;
  if (GateError e = Enter(err); e != GateError::kOk) return e;
  *result = AcquireResult{};
  // First look: no lock at all, so a warm cache costs one file read.
  if (WarmForUs(key, &result->marker)) {
    result->decision = GateDecision::kReuse;
    busy_ = false;
    return GateError::kOk;
  }
  Wait w(key, clock_->Now(), options_);
  GateError e = LockBoth(w, &result->recovered, err, &result->dead_holder);
  result->waited_seconds = Seconds(clock_->Now() - w.start);
  if (e != GateError::kOk) {
    busy_ = false;
    return e;
  }
  // Second look, under the lock: the leader we waited for may have published.
  if (WarmForUs(key, &result->marker)) {
    ReleaseLevels();
    result->decision = GateDecision::kReuse;
    result->took_lock = true;
    busy_ = false;
    return GateError::kOk;
  }
  result->decision = GateDecision::kLead;
  result->took_lock = true;
  holding_ = true;
  lead_key_ = key;
  lead_since_ = clock_->Now();
  return GateError::kOk;
}

// Lock order is always (a) then (b), except for a recoverer, which takes (b)
// while (a) is stuck with a dead owner; it then decides at once and never
// waits for (a) while holding (b), so the two orders cannot deadlock.
GateError CompileGate::LockBoth(Wait& w, bool* recovered, std::string* err, OwnerRecord* dead_holder) {
  bool local = false, file = false;
  while (!local) {
    auto left = duration_cast<milliseconds>(w.deadline - clock_->Now());
    milliseconds slice = std::clamp(left, milliseconds(1), std::max(options_.local_slice, milliseconds(1)));
    LockAttempt a = backend_->LockLocal(slice, err);
    if (a == LockAttempt::kFailed) return GateError::kIo;
    if (a == LockAttempt::kAcquired) break;
    if (GateError e = Tick(w, err); e != GateError::kOk) return e;
    OwnerRecord judged;
    bool judged_empty = false;
    if (!ShouldRecover(w, &judged, &judged_empty)) continue;
    // Recovery. Every recoverer decides under (b), one at a time, and only
    // takes (a) over if the record still names the owner it judged gone. The
    // first one rewrites the record, so a second finds it changed and goes
    // back to waiting: (a) never gets two owners from recovery, and nobody
    // posts for the dead owner, so its count never exceeds one.
    if (GateError e = LockFileLevel(w, err); e != GateError::kOk) return e;
    if (options_.before_recovery_decision) options_.before_recovery_decision();
    std::string ignored;
    if (backend_->LockLocal(milliseconds(0), &ignored) == LockAttempt::kAcquired) {
      file = true;  // freed while we waited for (b): an ordinary take
      break;
    }
    if (StillStuck(judged, judged_empty)) {
      file = true;
      *recovered = true;
      break;
    }
    backend_->UnlockFile();
    w.empty_since.reset();
  }
  // Right after taking (a): the window in which a SIGKILL leaves (a) taken and
  // unnamed is these few microseconds (see empty_owner_grace).
  w.have_local = true;
  OwnerRecord me = Me(w.key);
  if (!backend_->WriteLocalOwner(me, err)) {
    if (file) backend_->UnlockFile();
    backend_->UnlockLocal();
    return GateError::kIo;
  }
  if (!file) {
    if (GateError e = LockFileLevel(w, err); e != GateError::kOk) {
      backend_->ClearLocalOwner();
      backend_->UnlockLocal();
      return e;
    }
  }
  // We hold (b): a record still there names a holder that died holding it
  // (a clean release clears it first).
  // Another host's holder cannot be judged or reached from here (OwnerAlive
  // says true for it): only a local one is reported.
  if (OwnerRecord prev; dead_holder && backend_->ReadHolder(&prev) == RecordState::kValid && !SameOwner(prev, me) &&
                        !backend_->OwnerAlive(prev))
    *dead_holder = prev;
  if (!backend_->WriteHolder(me, err)) {
    ReleaseLevels();
    return GateError::kIo;
  }
  return GateError::kOk;
}

bool CompileGate::CurrentHolder(OwnerRecord* out) {
  return backend_->ReadHolder(out) == RecordState::kValid && backend_->OwnerAlive(*out);
}

GateError CompileGate::LockFileLevel(Wait& w, std::string* err) {
  microseconds backoff = kFilePollFirst;
  for (;;) {
    LockAttempt a = backend_->TryLockFile(err);
    if (a == LockAttempt::kAcquired) return GateError::kOk;
    if (a == LockAttempt::kFailed) return GateError::kIo;
    if (GateError e = Tick(w, err); e != GateError::kOk) return e;
    auto left = duration_cast<microseconds>(w.deadline - clock_->Now());
    clock_->SleepFor(std::clamp(left, microseconds(1), backoff));
    backoff = std::min(backoff * 2, kFilePollMax);
  }
}

GateError CompileGate::Tick(Wait& w, std::string* err) {
  GateClock::TimePoint now = clock_->Now();
  if (options_.progress_every.count() > 0 && now >= w.next_progress) {
    if (options_.on_progress)
      options_.on_progress(fmt::format("waiting for gate {}: held by {}", w.key, DescribeHolder(w)));
    while (w.next_progress <= now) w.next_progress += options_.progress_every;
  }
  if (now >= w.deadline) {
    *err = fmt::format("timed out after {} waiting for gate {} in {}: held by {}",
                       FormatDuration(options_.timeout), w.key, options_.dir, DescribeHolder(w));
    return GateError::kTimeout;
  }
  return GateError::kOk;
}

bool CompileGate::ShouldRecover(Wait& w, OwnerRecord* judged, bool* judged_empty) {
  OwnerRecord r;
  if (backend_->ReadLocalOwner(&r) == RecordState::kValid) {
    w.empty_since.reset();
    if (backend_->OwnerAlive(r)) return false;
    *judged = r;
    *judged_empty = false;
    return true;
  }
  // Empty or garbled while (a) stays taken: normal for microseconds (a holder
  // between sem_wait and its record write, or a torn read), stuck if it lasts.
  GateClock::TimePoint now = clock_->Now();
  if (!w.empty_since) {
    w.empty_since = now;
    return false;
  }
  if (now - *w.empty_since < options_.empty_owner_grace) return false;
  *judged_empty = true;
  return true;
}

bool CompileGate::StillStuck(const OwnerRecord& judged, bool judged_empty) {
  OwnerRecord r;
  RecordState s = backend_->ReadLocalOwner(&r);
  if (judged_empty) return s != RecordState::kValid;
  return s == RecordState::kValid && SameOwner(r, judged) && !backend_->OwnerAlive(r);
}

GateError CompileGate::Publish(std::string* err) {
  if (::getpid() != opened_by_ || !holding_ || lead_key_.empty()) {
    *err = "publish: this gate does not lead (Acquire did not return lead, or Release was called)";
    return GateError::kMisuse;
  }
  OwnerRecord me = backend_->Self();
  ReadyRecord r;
  r.key = lead_key_;
  r.role = options_.role;
  r.pid = me.pid;
  r.host = me.host;
  r.published_at = clock_->WallSeconds();
  r.torch_version = options_.torch_version;
  r.sources = options_.sources;
  r.gpu = options_.gpu;
  r.cpu = options_.cpu;
  r.compile_seconds = std::round(Seconds(clock_->Now() - lead_since_) * 1000) / 1000;
  if (!backend_->PublishReady(r, err)) return GateError::kIo;
  return GateError::kOk;
}

void CompileGate::Release() {
  // In a forked child the fds were pointed at /dev/null (fork_guard.h) and the
  // named mutex is the parent's: touching either would release the parent's gate.
  if (::getpid() != opened_by_ || !holding_) return;
  ReleaseLevels();
  holding_ = false;
  busy_ = false;
}

// Records first, so nobody reads a record naming a holder that let go. (b)
// before (a), so the local waiter that (a) wakes finds (b) free at once.
void CompileGate::ReleaseLevels() {
  backend_->ClearHolder();
  backend_->ClearLocalOwner();
  backend_->UnlockFile();
  backend_->UnlockLocal();
}

GateError CompileGate::Hold(const std::string& purpose, std::string* err) {
  if (!ValidGateKey(purpose, err)) return GateError::kBadKey;
  if (GateError e = Enter(err); e != GateError::kOk) return e;
  Wait w(purpose, clock_->Now(), options_);
  bool recovered = false;
  if (GateError e = LockBoth(w, &recovered, err); e != GateError::kOk) {
    busy_ = false;
    return e;
  }
  holding_ = true;
  lead_key_.clear();  // nothing to publish: Publish refuses
  lead_since_ = clock_->Now();
  return GateError::kOk;
}

GateError CompileGate::Forget(const std::string& key, bool* existed, std::string* err) {
  if (!ValidGateKey(key, err)) return GateError::kBadKey;
  if (GateError e = Enter(err); e != GateError::kOk) return e;
  Wait w(key, clock_->Now(), options_);
  bool recovered = false;
  GateError e = LockBoth(w, &recovered, err);
  if (e == GateError::kOk) {
    if (!backend_->RemoveReady(key, existed, err)) e = GateError::kIo;
    ReleaseLevels();
  }
  busy_ = false;
  return e;
}

// Prefers the holder of (b), the authority; then the owner of (a), which may
// itself be waiting for (b) held on another host (unless that is us); then
// what the kernel says.
std::string CompileGate::DescribeHolder(const Wait& w) {
  std::string here = backend_->Self().host;
  double now = clock_->WallSeconds();
  auto with_age = [&](const OwnerRecord& r) {
    return fmt::format("{} for {} s", DescribeOwner(r, here),
                       static_cast<long long>(std::max(0.0, now - r.since)));
  };
  OwnerRecord r;
  if (backend_->ReadHolder(&r) == RecordState::kValid && backend_->OwnerAlive(r)) return with_age(r);
  if (!w.have_local && backend_->ReadLocalOwner(&r) == RecordState::kValid) {
    if (backend_->OwnerAlive(r)) return with_age(r);
    return fmt::format("dead pid {} ({}), being recovered", r.pid, r.role);
  }
  LockProbe probe = backend_->ProbeFile();
  if (probe.held && probe.pid > 0)
    return fmt::format("pid {}, which keeps no holder record (a plain fcntl/lockf user?)", probe.pid);
  if (probe.held) return "a process that keeps no holder record (an OFD lock)";
  return "a process that left no record (recovered after a grace period if it is gone)";
}

OwnerRecord CompileGate::Me(const std::string& key) {
  OwnerRecord r = backend_->Self();
  r.role = options_.role;
  r.key = key;
  r.since = clock_->WallSeconds();
  return r;
}

}  // namespace dflash
