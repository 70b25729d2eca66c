#include "cachelock/os_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include <boost/date_time/posix_time/posix_time_types.hpp>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/sync/named_mutex.hpp>
#include <fmt/format.h>

#include "cachelock/fork_guard.h"
#include "cachelock/record_file.h"
#include "common/fd.h"
#include "common/proc_info.h"

namespace dflash {
namespace {

namespace bip = boost::interprocess;

class RealClock final : public GateClock {
 public:
  TimePoint Now() override { return std::chrono::steady_clock::now(); }
  double WallSeconds() override {
    struct timespec ts {};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<double>(ts.tv_sec) + ts.tv_nsec / 1e9;
  }
  void SleepFor(std::chrono::microseconds d) override { std::this_thread::sleep_for(d); }
};

class OsGateBackend final : public GateBackend {
 public:
  explicit OsGateBackend(GateLayout layout) : layout_(std::move(layout)) {}
  ~OsGateBackend() override {
    if (lock_fd_) UnguardFd(lock_fd_.get());
  }

  bool Open(std::string* err) {
    lock_fd_.reset(::open(layout_.lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!lock_fd_) {
      *err = ErrnoMessage("open(" + layout_.lock_path + ")", errno);
      return false;
    }
    GuardFdAcrossFork(lock_fd_.get());
    if (!holder_.Open(layout_.holder_path, err)) return false;
    // Level (a). Boost 1.74 on Linux: a POSIX named semaphore, /dev/shm/sem.<name>,
    // count 1 = free. sem_open's mode is masked by the umask, so 0600 can only
    // get stricter. Its quirks: it is not robust (a SIGKILLed holder leaves it
    // at 0 forever -- hence the owner record and recovery in gate.cc), and
    // sem_wait/sem_timedwait interrupted by a signal throw instead of retrying.
    // sem_open keeps no fd open (it mmaps and closes), so nothing leaks to children.
    try {
      mutex_ = std::make_unique<bip::named_mutex>(bip::open_or_create, layout_.local_name.c_str(),
                                                  bip::permissions(0600));
    } catch (const bip::interprocess_exception& e) {
      *err = fmt::format("cannot open the host-local mutex {}: {}", layout_.local_sem_path, e.what());
      return false;
    }
    struct stat st {};
    if (::lstat(layout_.local_sem_path.c_str(), &st) == 0 && st.st_uid != ::geteuid()) {
      *err = fmt::format("refusing the host-local mutex {}: owned by uid {}, not by you (uid {}); "
                         "fix: remove it as its owner (rm {})",
                         layout_.local_sem_path, st.st_uid, ::geteuid(), layout_.local_sem_path);
      return false;
    }
    return local_owner_.Open(layout_.local_owner_path, err);
  }

  LockAttempt LockLocal(std::chrono::milliseconds slice, std::string* err) override {
    try {
      if (slice.count() <= 0) return mutex_->try_lock() ? LockAttempt::kAcquired : LockAttempt::kBusy;
      // sem_timedwait takes an absolute CLOCK_REALTIME deadline; a wall-clock
      // step only makes one slice shorter or longer, the caller re-checks.
      auto deadline = boost::posix_time::microsec_clock::universal_time() +
                      boost::posix_time::milliseconds(slice.count());
      return mutex_->timed_lock(deadline) ? LockAttempt::kAcquired : LockAttempt::kBusy;
    } catch (const bip::interprocess_exception& e) {
      if (e.get_native_error() == EINTR) return LockAttempt::kBusy;  // a signal: a short slice
      if (err) *err = fmt::format("named mutex {}: {}", layout_.local_sem_path, e.what());
      return LockAttempt::kFailed;
    }
  }

  void UnlockLocal() override {
    // try_lock first: if the count is already 1 (we were taken over by a
    // recoverer who judged us dead, and someone else posted), this keeps it
    // at 1 instead of 2. Posting when at 0 is the normal unlock.
    try {
      (void)mutex_->try_lock();
      mutex_->unlock();
    } catch (const bip::interprocess_exception&) {
    }
  }

  RecordState ReadLocalOwner(OwnerRecord* out) override { return DecodeOwner(local_owner_.Read(), out); }
  bool WriteLocalOwner(const OwnerRecord& r, std::string* err) override {
    return local_owner_.Write(EncodeOwner(r), err);
  }
  void ClearLocalOwner() override { local_owner_.Clear(); }

  LockAttempt TryLockFile(std::string* err) override { return OfdTryLock(lock_fd_.get(), err); }
  void UnlockFile() override { OfdUnlock(lock_fd_.get()); }
  LockProbe ProbeFile() override {
    // A separate description: F_OFD_GETLK ignores locks of the one it is asked through.
    LockProbe probe;
    UniqueFd fd(::open(layout_.lock_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
    std::string err;
    if (fd) OfdProbe(fd.get(), &probe, &err);
    return probe;
  }
  RecordState ReadHolder(OwnerRecord* out) override { return DecodeOwner(holder_.Read(), out); }
  bool WriteHolder(const OwnerRecord& r, std::string* err) override {
    return holder_.Write(EncodeOwner(r), err);
  }
  void ClearHolder() override { holder_.Clear(); }

  bool ReadReady(const std::string& key, ReadyRecord* out) override {
    // An untrusted marker (a symlink, another user's) promises nothing: absent.
    std::string text, err;
    if (!ReadTrustedMarker(layout_.ReadyPath(key), &text, &err)) return false;
    return DecodeReady(text, out, &err);
  }

  bool PublishReady(const ReadyRecord& r, std::string* err) override {
    RemoveTempFiles();
    return WriteFileAtomic(layout_.ReadyPath(r.key), EncodeReady(r), err, 0600);
  }

  bool RemoveReady(const std::string& key, bool* existed, std::string* err) override {
    std::string path = layout_.ReadyPath(key);
    *existed = ::unlink(path.c_str()) == 0;
    if (!*existed && errno != ENOENT) {
      *err = ErrnoMessage("unlink(" + path + ")", errno);
      return false;
    }
    UniqueFd dfd(::open(layout_.ready_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dfd) ::fsync(dfd.get());
    return true;
  }

  OwnerRecord Self() override {
    if (self_.pid != ::getpid()) {  // first call, or first call after a fork
      self_.pid = ::getpid();
      self_.start_time = ProcessStartTime(self_.pid);
      self_.host = HostName();
    }
    return self_;
  }

  bool OwnerAlive(const OwnerRecord& r) override {
    if (r.host != Self().host) return true;
    return ProcessAlive(r.pid, r.start_time);
  }

 private:
  // Under the gate nobody else can be publishing, so every temp file a
  // WriteFileAtomic left in ready/ belongs to a publisher killed mid-write.
  void RemoveTempFiles() {
    DIR* d = ::opendir(layout_.ready_dir.c_str());
    if (!d) return;
    while (struct dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 1 && name[0] == '.' && name.find(".json.tmp.") != std::string::npos)
        ::unlinkat(::dirfd(d), name.c_str(), 0);
    }
    ::closedir(d);
  }

  GateLayout layout_;
  UniqueFd lock_fd_;
  RecordFile holder_;
  RecordFile local_owner_;
  std::unique_ptr<bip::named_mutex> mutex_;
  OwnerRecord self_;
};

}  // namespace

GateClock* RealGateClock() {
  static RealClock clock;
  return &clock;
}

std::unique_ptr<GateBackend> OpenOsGateBackend(const std::string& dir, GateLayout* layout,
                                               std::string* err) {
  GateLayout l;
  if (!PrepareGateDir(dir, &l, err)) return nullptr;
  auto backend = std::make_unique<OsGateBackend>(l);
  if (!backend->Open(err)) return nullptr;
  if (layout) *layout = std::move(l);
  return backend;
}

bool RemoveHostLocalObjects(const GateLayout& layout, std::string* err) {
  bool ok = true;
  if (!bip::named_mutex::remove(layout.local_name.c_str()) && errno != ENOENT) {
    *err = ErrnoMessage("sem_unlink(" + layout.local_sem_path + ")", errno);
    ok = false;
  }
  if (::unlink(layout.local_owner_path.c_str()) != 0 && errno != ENOENT) {
    *err = ErrnoMessage("unlink(" + layout.local_owner_path + ")", errno);
    ok = false;
  }
  return ok;
}

}  // namespace dflash
