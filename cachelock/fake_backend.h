// Test-only: a whole host of gate users in one thread -- a fake clock, a fake
// semaphore, a fake file lock, records and markers -- for gate_test.cc.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cachelock/backend.h"

namespace dflash::testing {

/// Time moves only when someone sleeps or waits a slice; events scheduled
/// for a moment run when the clock passes it -- that is how other
/// "processes" act while the gate under test waits.
class FakeClock final : public GateClock {
 public:
  TimePoint Now() override { return TimePoint(now_); }
  double WallSeconds() override { return 1.7e9 + std::chrono::duration<double>(now_ - start_).count(); }
  void SleepFor(std::chrono::microseconds d) override { Advance(d); }

  void Advance(std::chrono::nanoseconds d) {
    auto until = now_ + d;
    for (;;) {
      auto it = std::min_element(events_.begin(), events_.end(),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
      if (it == events_.end() || it->first > until) break;
      now_ = std::max(now_, it->first);
      auto fn = std::move(it->second);
      events_.erase(it);
      fn();
    }
    now_ = std::max(now_, until);
  }
  void After(std::chrono::nanoseconds d, std::function<void()> fn) { events_.emplace_back(now_ + d, std::move(fn)); }
  double Elapsed() const { return std::chrono::duration<double>(now_ - start_).count(); }

 private:
  std::chrono::nanoseconds start_{std::chrono::hours(1)};
  std::chrono::nanoseconds now_{start_};
  std::vector<std::pair<std::chrono::nanoseconds, std::function<void()>>> events_;
};

/// What the kernel and the filesystem would hold for one gate.
struct FakeWorld {
  FakeClock clock;
  std::string host = "hostA";
  int sem = 1;                ///< level (a)'s count
  int max_sem = 1;            ///< the highest count ever seen: must stay 1
  pid_t file_holder = 0;      ///< level (b): 0 free
  bool file_classic = false;  ///< held by a classic lock (lockf): probe shows the pid
  std::string local_owner_text, holder_text;
  std::map<std::string, ReadyRecord> ready;
  std::set<pid_t> dead;
  int local_lock_calls = 0, file_lock_calls = 0;
  /// Runs before a process's TryLockFile: another process acting in between.
  std::function<void(pid_t)> before_file_try;

  /// SIGKILL: the kernel drops its file lock; the semaphore and records stay.
  void Kill(pid_t pid) {
    dead.insert(pid);
    if (file_holder == pid) file_holder = 0;
  }
  OwnerRecord Record(pid_t pid, const std::string& role, const std::string& on_host = "") {
    OwnerRecord r;
    r.pid = pid;
    r.start_time = 1000 + static_cast<uint64_t>(pid);
    r.host = on_host.empty() ? host : on_host;
    r.role = role;
    r.key = "k";
    r.since = clock.WallSeconds();
    return r;
  }
};

class FakeBackend final : public GateBackend {
 public:
  FakeBackend(FakeWorld* w, pid_t pid) : w_(w), pid_(pid) {}

  LockAttempt LockLocal(std::chrono::milliseconds slice, std::string*) override {
    ++w_->local_lock_calls;
    if (w_->sem == 0 && slice.count() > 0) w_->clock.Advance(slice);
    if (w_->sem == 0) return LockAttempt::kBusy;
    --w_->sem;
    return LockAttempt::kAcquired;
  }
  void UnlockLocal() override {
    if (w_->sem > 0) --w_->sem;  // try_lock, then post: never above one
    ++w_->sem;
    w_->max_sem = std::max(w_->max_sem, w_->sem);
  }
  RecordState ReadLocalOwner(OwnerRecord* out) override { return DecodeOwner(w_->local_owner_text, out); }
  bool WriteLocalOwner(const OwnerRecord& r, std::string*) override {
    w_->local_owner_text = EncodeOwner(r);
    return true;
  }
  void ClearLocalOwner() override { w_->local_owner_text.clear(); }

  LockAttempt TryLockFile(std::string*) override {
    ++w_->file_lock_calls;
    if (w_->before_file_try) w_->before_file_try(pid_);
    if (w_->file_holder != 0 && w_->file_holder != pid_) return LockAttempt::kBusy;
    w_->file_holder = pid_;
    w_->file_classic = false;
    return LockAttempt::kAcquired;
  }
  void UnlockFile() override {
    if (w_->file_holder == pid_) w_->file_holder = 0;
  }
  LockProbe ProbeFile() override {
    LockProbe p;
    p.held = w_->file_holder != 0;
    p.pid = !p.held ? 0 : w_->file_classic ? w_->file_holder : -1;
    return p;
  }
  RecordState ReadHolder(OwnerRecord* out) override { return DecodeOwner(w_->holder_text, out); }
  bool WriteHolder(const OwnerRecord& r, std::string*) override {
    w_->holder_text = EncodeOwner(r);
    return true;
  }
  void ClearHolder() override { w_->holder_text.clear(); }

  bool ReadReady(const std::string& key, ReadyRecord* out) override {
    auto it = w_->ready.find(key);
    if (it == w_->ready.end()) return false;
    *out = it->second;
    return true;
  }
  bool PublishReady(const ReadyRecord& r, std::string*) override {
    w_->ready[r.key] = r;
    return true;
  }
  bool RemoveReady(const std::string& key, bool* existed, std::string*) override {
    *existed = w_->ready.erase(key) > 0;
    return true;
  }
  OwnerRecord Self() override {
    OwnerRecord r = w_->Record(pid_, "");
    r.since = 0;
    return r;
  }
  bool OwnerAlive(const OwnerRecord& r) override { return r.host != w_->host || !w_->dead.count(r.pid); }

 private:
  FakeWorld* w_;
  pid_t pid_;
};

}  // namespace dflash::testing
