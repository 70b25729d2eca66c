// cachelock_bench: the gate's acquire+release and process-to-process hand-off
// latency, beside the bare kernel primitives it is built on.
//
//   cachelock_bench --what uncontended|handoff --impl gate|gate-reuse|ofd|sem --n N --dir DIR
//
// Prints one JSON line: {"impl", "what", "n", "p50_us", "p99_us", "mean_us", "max_us"}.
// run_bench.py runs every row, and the Python peers, in one go.
//
// Hand-off: two processes take strict turns. The holder waits until the other
// has announced it is about to block and then 1 ms more (so it is asleep in
// the kernel, or between polls), stamps CLOCK_MONOTONIC, releases, and does not
// ask for the lock again until the other has it -- otherwise an unfair or
// polling lock would hand it straight back to the releaser. The other stamps
// right after its acquire returns. The sample is the difference: release call
// -> next holder holds, including everything our acquire does (READY look,
// both levels, both records) and the wake-up.
#include <fcntl.h>
#include <semaphore.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cachelock/gate.h"
#include "cachelock/gate_dir.h"
#include "cachelock/os_backend.h"
#include "common/fd.h"

namespace {

using namespace dflash;

long long MonoNs() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string g_sem_name;  // one per bench run, set before any fork

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "cachelock_bench: %s\n", what.c_str());
  std::exit(1);
}

/// One lock as the bench sees it; opened in each process after fork.
class BenchLock {
 public:
  virtual ~BenchLock() = default;
  virtual void Acquire() = 0;
  virtual void Release() = 0;
};

class GateLock final : public BenchLock {
 public:
  GateLock(const std::string& dir, const std::string& key) : key_(key) {
    GateOptions o;
    o.dir = dir;
    o.role = "bench";
    std::string err;
    if (CompileGate::Open(o, &gate_, &err) != GateError::kOk) Die(err);
  }
  void Acquire() override {
    AcquireResult got;
    std::string err;
    if (gate_->Acquire(key_, &got, &err) != GateError::kOk) Die(err);
  }
  void Release() override { gate_->Release(); }

 private:
  std::string key_;
  std::unique_ptr<CompileGate> gate_;
};

class OfdLock final : public BenchLock {
 public:
  explicit OfdLock(const std::string& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (!fd_) Die(ErrnoMessage("open " + path, errno));
  }
  void Acquire() override { Set(F_WRLCK); }
  void Release() override { Set(F_UNLCK); }

 private:
  void Set(short type) {
    struct flock fl {};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    while (::fcntl(fd_.get(), F_OFD_SETLKW, &fl) != 0)
      if (errno != EINTR) Die(ErrnoMessage("F_OFD_SETLKW", errno));
  }
  UniqueFd fd_;
};

class SemLock final : public BenchLock {
 public:
  explicit SemLock(const std::string& name) : sem_(::sem_open(name.c_str(), O_CREAT, 0600, 1)) {
    if (sem_ == SEM_FAILED) Die(ErrnoMessage("sem_open " + name, errno));
  }
  ~SemLock() override { ::sem_close(sem_); }
  void Acquire() override {
    while (::sem_wait(sem_) != 0)
      if (errno != EINTR) Die(ErrnoMessage("sem_wait", errno));
  }
  void Release() override { ::sem_post(sem_); }

 private:
  sem_t* sem_;
};

std::unique_ptr<BenchLock> MakeLock(const std::string& impl, const std::string& dir) {
  if (impl == "gate" || impl == "gate-reuse") return std::make_unique<GateLock>(dir, "bench");
  if (impl == "ofd") return std::make_unique<OfdLock>(dir + "/bare.lock");
  if (impl == "sem") return std::make_unique<SemLock>(g_sem_name);
  Die("unknown --impl " + impl);
}

void Report(const std::string& impl, const std::string& what, std::vector<long long> ns) {
  std::sort(ns.begin(), ns.end());
  auto pct = [&](double p) { return ns[std::min(ns.size() - 1, static_cast<size_t>(p * ns.size()))] / 1e3; };
  double mean = std::accumulate(ns.begin(), ns.end(), 0.0) / ns.size() / 1e3;
  std::printf("{\"impl\": \"%s\", \"what\": \"%s\", \"n\": %zu, \"p50_us\": %.2f, \"p99_us\": %.2f, "
              "\"mean_us\": %.2f, \"max_us\": %.1f}\n",
              impl.c_str(), what.c_str(), ns.size(), pct(0.50), pct(0.99), mean, ns.back() / 1e3);
  std::fflush(stdout);
}

void Uncontended(const std::string& impl, const std::string& dir, int n) {
  if (impl == "gate-reuse") {
    // The fast path of a warm cache: READY(key) is there, no lock is taken.
    GateOptions o;
    o.dir = dir;
    std::unique_ptr<CompileGate> g;
    std::string err;
    AcquireResult got;
    if (CompileGate::Open(o, &g, &err) != GateError::kOk || g->Acquire("warm", &got, &err) != GateError::kOk ||
        g->Publish(&err) != GateError::kOk)
      Die(err);
    g->Release();
    std::vector<long long> ns;
    for (int i = 0; i < n; ++i) {
      long long t0 = MonoNs();
      if (g->Acquire("warm", &got, &err) != GateError::kOk || got.decision != GateDecision::kReuse) Die(err);
      ns.push_back(MonoNs() - t0);
    }
    Report(impl, "uncontended", ns);
    return;
  }
  auto lock = MakeLock(impl, dir);
  std::vector<long long> ns;
  for (int i = 0; i < n + 100; ++i) {
    long long t0 = MonoNs();
    lock->Acquire();
    lock->Release();
    if (i >= 100) ns.push_back(MonoNs() - t0);  // the first few warm caches up
  }
  Report(impl, "uncontended", ns);
}

struct Shared {
  std::atomic<int> started{0}, done{0}, count{0}, owner{0};
  std::atomic<int> waiting[2] = {0, 0};
  std::atomic<long long> t_release{0};
  long long samples[1];  // really n of them
};

void Player(int me, BenchLock& lock, Shared* s, int n) {
  bool holding = false;
  if (me == 0) {
    lock.Acquire();
    holding = true;
    s->started = 1;
  } else {
    while (!s->started) ::usleep(20);
  }
  for (;;) {
    if (holding) {
      // Sleep-polls, not spins: on a small machine a spinning bystander
      // would steal the CPU the woken waiter needs.
      while (!s->waiting[1 - me]) ::usleep(20);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (s->count >= n) s->done = 1;
      s->t_release = MonoNs();
      lock.Release();
      holding = false;
      if (s->done) return;
      while (s->owner == me) ::usleep(20);  // strict turns
    } else {
      s->waiting[me] = 1;
      lock.Acquire();
      long long t1 = MonoNs();
      s->owner = me;
      s->waiting[me] = 0;
      if (s->done) {
        lock.Release();
        return;
      }
      s->samples[s->count] = t1 - s->t_release;
      s->count = s->count + 1;
      holding = true;
    }
  }
}

void Handoff(const std::string& impl, const std::string& dir, int n) {
  size_t bytes = sizeof(Shared) + sizeof(long long) * (n + 1);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) Die(ErrnoMessage("mmap", errno));
  Shared* s = new (mem) Shared;
  pid_t kids[2];
  for (int me = 0; me < 2; ++me) {
    kids[me] = ::fork();
    if (kids[me] == 0) {
      auto lock = MakeLock(impl, dir);
      Player(me, *lock, s, n);
      lock.reset();
      ::_exit(0);
    }
  }
  for (pid_t k : kids) {
    int status = 0;
    ::waitpid(k, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("a hand-off player failed");
  }
  Report(impl, "handoff", std::vector<long long>(s->samples, s->samples + n));
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = "handoff", impl = "gate", dir;
  int n = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--what") what = value;
    else if (flag == "--impl") impl = value;
    else if (flag == "--n") n = std::atoi(value.c_str());
    else if (flag == "--dir") dir = value;
    else Die("unknown flag " + flag);
  }
  if (dir.empty() || n <= 0) Die("usage: cachelock_bench --what uncontended|handoff --impl gate|gate-reuse|ofd|sem --n N --dir DIR");
  g_sem_name = fmt::format("/cachelock-bench-{}", ::getpid());
  if (what == "uncontended") {
    Uncontended(impl, dir, n);
  } else {
    Handoff(impl, dir, n);
  }
  if (impl == "gate" || impl == "gate-reuse") {
    GateLayout l;
    std::string err;
    if (LocateGate(dir, &l, &err)) RemoveHostLocalObjects(l, &err);
  }
  if (impl == "sem") ::sem_unlink(g_sem_name.c_str());
  return 0;
}
