#include "cachelock/cluster_gate.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "cachelock/holder_tree.h"
#include "common/fd.h"
#include "common/hash.h"
#include "common/proc_info.h"

namespace dflash {
namespace {

using Clock = std::chrono::steady_clock;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

/// A private staging dir (mkdtemp: 0700, ours) and the archive file in it; both go on destruction.
class Scratch {
 public:
  bool Make(const std::string& base, std::string* err) {
    std::string tmpl = base + "/dflash-cluster-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      *err = ErrnoMessage("mkdtemp " + tmpl, errno);
      return false;
    }
    dir_ = tmpl;
    return true;
  }
  std::string File() const { return dir_ + "/kernels.tar.zst"; }
  ~Scratch() {
    if (dir_.empty()) return;
    ::unlink(File().c_str());
    ::rmdir(dir_.c_str());
  }

 private:
  std::string dir_;
};

bool WriteNewFile(const std::string& path, const std::string& data, std::string* err) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    *err = ErrnoMessage("open " + path, errno);
    return false;
  }
  return WriteAll(fd.get(), data, err);
}

}  // namespace

ClusterGate::ClusterGate(ClusterGateOptions options)
    : o_(std::move(options)), lease_(o_.store, o_.key, o_.lease_ttl, o_.io_timeout, o_.auth, o_.sign_key) {
  me_.host = HostName();
  me_.role = o_.role;
  me_.pid = ::getpid();
}

ClusterGate::~ClusterGate() {
  StopRenewing();
  if (me_.token > 0) Abandon();
}

std::string ClusterGate::ScratchDir() const {
  if (!o_.scratch_dir.empty()) return o_.scratch_dir;
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

bool ClusterGate::Resolve(ClusterDecision* d, std::string* err) {
  *d = ClusterDecision{};
  const std::string store = o_.store.ToString();
  auto fallback = [&](const std::string& why) {
    d->outcome = ClusterOutcome::kLocalFallback;
    d->warning = "gate " + o_.key + ": " + why + "; compiling locally, without the cluster lease";
    return true;
  };
  if (o_.sign_key.empty())
    return fallback("no run secret (DFLASH_STORE_SECRET_FILE, written by the launcher when the run's store has a "
                    "password): what the cluster gate ships is code every process loads, so it is signed, and "
                    "cannot be without one");
  Clock::time_point start = Clock::now(), next_progress = start + o_.progress_every;
  Clock::time_point hint_since{};
  double hint_cpu0 = 0;
  int64_t hint_token = -1;
  bool waited = false;
  ClusterHolder last;
  for (int fetch_races = 0;;) {
    ClusterLease::Take take;
    ClusterHolder h;
    std::string terr;
    me_.since = UnixNow();
    if (!lease_.TryTake(me_, &take, &h, &terr)) return fallback("the store " + store + " cannot be used (" + terr + ")");
    Clock::time_point now = Clock::now();
    d->wait_s = waited ? Seconds(now - start) : 0;
    if (take == ClusterLease::Take::kTaken) {
      d->outcome = ClusterOutcome::kLeader;
      d->token = me_.token = h.token;
      me_.lease = h.lease;
      d->took_over = waited;
      d->previous = last;
      return true;
    }
    if (take == ClusterLease::Take::kPublished) {
      std::string why;
      if (FetchAndImport(d, &why)) return true;
      if (!why.empty()) return fallback(why);
      if (++fetch_races > 3) return fallback("the published kernels in " + store + " keep vanishing");
      continue;  // removed between the look and the fetch: look again
    }
    // kHeld: another node compiles. Wait, visibly and within the timeout.
    waited = true;
    last = h;
    double held_for = h.since > 0 ? UnixNow() - h.since : Seconds(now - start);
    if (now - start >= o_.timeout) {
      *err = "timed out after " + FormatDuration(o_.timeout) + " waiting for gate " + o_.key +
             " in the cluster store " + store + ": its lease is held by " + h.Describe() + " for " +
             FormatSeconds(held_for);
      return false;
    }
    if (now >= next_progress) {
      next_progress = now + o_.progress_every;
      if (o_.on_progress)
        o_.on_progress("waiting for gate " + o_.key + ": cluster lease held by " + h.Describe() + " for " +
                       FormatSeconds(held_for) + " (store " + store + ")");
    }
    // The idle hint, from the CPU time the holder's renewals carry. They come every TTL/3, so the window
    // is at least one TTL: a shorter one could see no renewal at all and call a busy leader idle.
    Millis window_len = std::max(o_.idle_hint, o_.lease_ttl);
    if (o_.idle_hint.count() > 0) {
      if (h.token != hint_token) {
        hint_token = h.token;
        hint_since = now;
        hint_cpu0 = h.cpu_s;
      } else if (now - hint_since >= window_len) {
        double window = Seconds(now - hint_since), used = h.cpu_s - hint_cpu0;
        hint_since = now;
        hint_cpu0 = h.cpu_s;
        if (HolderTreeLooksIdle(used, window) && o_.on_hint)
          o_.on_hint("gate " + o_.key + ": the cluster leader " + h.Describe() + " has used " + Num(used) +
                     " s of CPU in the last " + FormatSeconds(window) +
                     ": it is not compiling, it is blocked. If the role's processes form a process group "
                     "(DDP/FSDP, init_process_group), the leader waits for peers that wait here: use gate mode "
                     "\"warmup\" (the default for roles of several processes) -- see docs/cachelock.md");
      }
    }
    std::this_thread::sleep_for(o_.poll);  // the store is polled: a waiter costs one small script per poll
  }
}

bool ClusterGate::FetchAndImport(ClusterDecision* d, std::string* why) {
  Clock::time_point t0 = Clock::now();
  std::string archive, err;
  ClusterKernelsMeta meta;
  bool present = false;
  if (!lease_.Fetch(&archive, &meta, &present, &err)) {
    *why = "the kernels published in " + o_.store.ToString() + " were refused: " + err;
    return false;
  }
  if (!present) return false;  // gone meanwhile; why stays empty
  Scratch scratch;
  if (!scratch.Make(ScratchDir(), &err) || !WriteNewFile(scratch.File(), archive, &err)) {
    *why = "cannot stage the cluster's kernels: " + err;
    return false;
  }
  ImportReport report;
  // Vouched for: its meta (which holds the archive's SHA-256) was verified under the run's secret above.
  ArchiveTrust vouched;
  vouched.vouched = true;
  ImportResult r = ImportCache(scratch.File(), o_.cache_dir, o_.here, /*force=*/false, vouched, &report, &err);
  if (r != ImportResult::kOk) {
    std::string state = report.cache_changed ? "; some files could not be taken out again, but no READY marker "
                                               "was installed"
                        : report.rolled_back ? "; the files already renamed in were taken out again"
                                             : "; the cache is untouched";
    *why = "the kernels published by " + meta.role + " on host " + meta.host + " (token " +
           std::to_string(meta.token) + ") were refused: " + err + state +
           " (to drop them: redis-cli -u " + o_.store.ToString() + " DEL " + lease_.Key("kernels") + ")";
    return false;
  }
  d->outcome = ClusterOutcome::kFetched;
  d->fetched_bytes = archive.size();
  d->fetch_s = Seconds(Clock::now() - t0);
  d->from = meta.role + " on host " + meta.host + " in " + FormatSeconds(meta.compile_s);
  return true;
}

void ClusterGate::StartRenewing(const std::string& tree_token) {
  if (me_.token <= 0 || renewer_.joinable()) return;
  ClusterHolder me = me_;
  renewer_ = std::thread([this, me, tree_token]() mutable {
    // Its own connection: a RedisClient is used by one thread.
    ClusterLease lease(o_.store, o_.key, o_.lease_ttl, o_.io_timeout, o_.auth, o_.sign_key);
    Millis every = std::max(Millis(50), o_.lease_ttl / 3);
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, every, [&] { return stop_; })) {
      lock.unlock();
      me.cpu_s = tree_token.empty() ? 0 : HolderTreeCpuSeconds(tree_token);
      bool ours = true;
      std::string err;
      bool asked = lease.Renew(me, &ours, &err);  // a store that is down: try again next time
      lock.lock();
      if (asked && !ours) {
        lost_ = true;
        return;
      }
    }
  });
}

void ClusterGate::StopRenewing() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (renewer_.joinable()) renewer_.join();
}

bool ClusterGate::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

bool ClusterGate::Publish(double compile_s, uint64_t* archive_bytes, std::string* err) {
  if (me_.token <= 0) {
    *err = "not the cluster leader";
    return false;
  }
  Scratch scratch;
  ExportReport report;
  std::string archive;
  if (!scratch.Make(ScratchDir(), err) || !ExportCache(o_.cache_dir, scratch.File(), o_.here, &report, err) ||
      !ReadFile(scratch.File(), &archive, err)) {
    *err = "exporting the cache for the cluster failed: " + *err;
    Abandon();
    return false;
  }
  ClusterKernelsMeta meta;
  meta.token = me_.token;
  meta.host = me_.host;
  meta.role = me_.role;
  meta.torch_version = o_.here.torch_version;
  meta.device = o_.here.device;
  meta.bytes = archive.size();
  meta.sha256 = Sha256Hex(archive);
  meta.compile_s = compile_s;
  meta.published_at = UnixNow();
  bool published = false;
  std::string perr;
  bool asked = lease_.Publish(me_.lease, archive, meta, &published, &perr);
  StopRenewing();
  if (!asked) {
    *err = "publishing to " + o_.store.ToString() + " failed: " + perr;
    Abandon();
    return false;
  }
  if (!published) {
    *err = "the cluster lease of gate " + o_.key + " was lost (token " + std::to_string(me_.token) +
           " is no longer current: it expired and another process took over): nothing published";
    me_.token = 0;
    return false;
  }
  me_.token = 0;  // the publish script dropped the lease
  *archive_bytes = archive.size();
  return true;
}

void ClusterGate::Abandon() {
  StopRenewing();
  if (me_.token <= 0) return;
  std::string err;
  lease_.Release(me_.lease, &err);  // best effort: if the store is down, the lease expires on its own
  me_.token = 0;
}

}  // namespace dflash
