#include "cachelock/status.h"

#include <dirent.h>
#include <fcntl.h>
#include <semaphore.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cachelock/gate_dir.h"
#include "cachelock/ofd_lock.h"
#include "common/duration.h"
#include "common/fd.h"
#include "common/proc_info.h"
#include "common/inductor_layout.h"
#include "common/secure_path.h"

namespace dflash {
namespace {

using nlohmann::json;

bool ReadOwner(const std::string& path, OwnerRecord* out) {
  std::string text, err;
  return ReadFile(path, &text, &err) && DecodeOwner(text, out) == RecordState::kValid;
}

bool Alive(const OwnerRecord& r, const std::string& here) {
  return r.host != here || ProcessAlive(r.pid, r.start_time);
}

// Level (a)'s count, read through a second handle on the same semaphore.
void ReadLocalMutex(const GateLayout& l, GateStatusReport* s) {
  s->local_sem_path = l.local_sem_path;
  sem_t* sem = ::sem_open(("/" + l.local_name).c_str(), 0);
  if (sem == SEM_FAILED) return;
  s->local_exists = true;
  int value = -1;
  if (::sem_getvalue(sem, &value) == 0) s->local_value = value;
  ::sem_close(sem);
}

void ReadMarkers(const GateLayout& l, GateStatusReport* s) {
  DIR* d = ::opendir(l.ready_dir.c_str());
  if (!d) return;
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.size() <= 5 || name.compare(name.size() - 5, 5, ".json") != 0) continue;
    if (name[0] == '.' && name.find(".json.tmp.") != std::string::npos) continue;
    std::string text, err;
    ReadyRecord r;
    if (!ReadTrustedMarker(l.ready_dir + "/" + name, &text, &err))
      s->unreadable.push_back(name + " (" + err + ")");  // a symlink or another user's: never trusted
    else if (DecodeReady(text, &r, &err))
      s->ready.push_back(std::move(r));
    else
      s->unreadable.push_back(name);
  }
  ::closedir(d);
  std::sort(s->ready.begin(), s->ready.end(),
            [](const ReadyRecord& a, const ReadyRecord& b) { return a.key < b.key; });
  std::sort(s->unreadable.begin(), s->unreadable.end());
}

long long Age(double since, double now) { return static_cast<long long>(std::max(0.0, now - since)); }

std::string LocalTime(double unix_seconds) {
  time_t t = static_cast<time_t>(unix_seconds);
  struct tm tm {};
  ::localtime_r(&t, &tm);
  char buf[32];
  ::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

json OwnerJson(const OwnerRecord& r, double now) {
  json j = OwnerToJson(r);
  j["age_s"] = Age(r.since, now);
  return j;
}

}  // namespace

bool ReadGateStatus(const std::string& dir, GateStatusReport* out, std::string* err) {
  GateStatusReport s;
  s.dir = dir;
  struct stat st {};
  GateLayout l;
  if (::stat(dir.c_str(), &st) != 0 || !LocateGate(dir, &l, err)) {
    *out = std::move(s);  // nothing was ever gated there
    return true;
  }
  s.dir = l.dir;
  s.exists = ::lstat(l.meta_dir.c_str(), &st) == 0;
  if (!s.exists) {
    *out = std::move(s);
    return true;
  }
  if (!CheckSecurePath(dir, err) || !CheckPrivateDir(l.dir, err) || !CheckPrivateDir(l.meta_dir, err) ||
      !CheckPrivateTree(l.dir, InductorReads, err))
    return false;
  std::string here = HostName();

  UniqueFd lock_fd(::open(l.lock_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  LockProbe probe;
  if (lock_fd && !OfdProbe(lock_fd.get(), &probe, err)) return false;
  s.held = probe.held;
  s.lock_pid = probe.pid;

  OwnerRecord r;
  if (ReadOwner(l.holder_path, &r)) {
    if (Alive(r, here))
      s.holder = r;
    else
      s.stale = r;
  }
  ReadLocalMutex(l, &s);
  if (s.local_exists && ReadOwner(l.local_owner_path, &r)) {
    s.local_owner = r;
    s.local_owner_alive = Alive(r, here);
  }
  ReadMarkers(l, &s);
  *out = std::move(s);
  return true;
}

std::string StatusText(const GateStatusReport& s, double now) {
  std::string out = fmt::format("gate {}: ", s.dir);
  std::string here = HostName();
  if (!s.exists) {
    out += "free (never used: no .dflash/ here)\n";
  } else if (s.held && s.holder) {
    out += fmt::format("held by {} for {} s (key {})\n", DescribeOwner(*s.holder, here),
                       Age(s.holder->since, now), s.holder->key);
  } else if (s.held) {
    out += s.lock_pid > 0 ? fmt::format("held by pid {} (no holder record: a plain fcntl/lockf user?)", s.lock_pid)
                          : std::string("held by a process that wrote no holder record");
    if (s.stale) out += fmt::format(" (stale record of dead pid {})", s.stale->pid);
    out += "\n";
  } else if (s.stale) {
    out += fmt::format("free (stale record of dead pid {}, {}, key {})\n", s.stale->pid, s.stale->role,
                       s.stale->key);
  } else {
    out += "free\n";
  }
  if (s.local_exists && s.local_value == 0) {
    out += fmt::format("host-local mutex {}: taken", s.local_sem_path);
    if (s.local_owner && s.local_owner_alive)
      out += fmt::format(" by {}\n", DescribeOwner(*s.local_owner, here));
    else if (s.local_owner)
      out += fmt::format(" by dead pid {} (the next waiter recovers it)\n", s.local_owner->pid);
    else
      out += " (owner not recorded yet)\n";
  }
  out += fmt::format("ready keys: {}\n", s.ready.size());
  for (const ReadyRecord& r : s.ready) {
    long long age = Age(r.published_at, now);
    out += fmt::format("  {}  by {} (pid {} on {}), {} ({}), compiled in {}", r.key, r.role, r.pid, r.host,
                       LocalTime(r.published_at),
                       age == 0 ? "just now" : FormatDuration(std::chrono::seconds(age)) + " ago",
                       FormatSeconds(r.compile_seconds));
    if (!r.torch_version.empty()) out += ", torch " + r.torch_version;
    out += "\n";
  }
  for (const std::string& name : s.unreadable) out += fmt::format("  unreadable marker: {}\n", name);
  return out;
}

json StatusJson(const GateStatusReport& s, double now) {
  json j;
  j["dir"] = s.dir;
  j["exists"] = s.exists;
  j["state"] = s.held ? "held" : "free";
  j["holder"] = s.held && s.holder ? OwnerJson(*s.holder, now) : json(nullptr);
  j["stale_record"] = s.stale ? OwnerJson(*s.stale, now) : json(nullptr);
  j["lock_pid"] = s.held ? json(s.lock_pid) : json(nullptr);
  json local;
  local["path"] = s.local_sem_path;
  local["exists"] = s.local_exists;
  local["state"] = !s.local_exists ? "absent" : s.local_value > 0 ? "free" : s.local_value == 0 ? "taken" : "unknown";
  local["owner"] = s.local_owner ? OwnerJson(*s.local_owner, now) : json(nullptr);
  local["owner_alive"] = s.local_owner ? json(s.local_owner_alive) : json(nullptr);
  j["local_mutex"] = local;
  json ready = json::array();
  for (const ReadyRecord& r : s.ready) {
    json m = ReadyToJson(r);
    m["age_s"] = Age(r.published_at, now);
    ready.push_back(m);
  }
  j["ready"] = ready;
  j["unreadable_markers"] = s.unreadable;
  return j;
}

}  // namespace dflash
