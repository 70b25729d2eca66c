// What `dflash-cachelock status` reports: who holds the gate, judged live, and the READY keys.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cachelock/records.h"

namespace dflash {

/// A snapshot of one gate, read without taking it. "Held" comes from the
/// kernel (F_OFD_GETLK on gate.lock), never from the record alone: a record
/// can outlive its writer, the lock cannot.
struct GateStatusReport {
  std::string dir;
  bool exists = false;                  ///< <dir>/.dflash is there
  bool held = false;                    ///< level (b) is taken right now
  pid_t lock_pid = 0;                   ///< kernel's view: pid of a classic lock, -1 for OFD
  std::optional<OwnerRecord> holder;    ///< holder.json, when it names a live holder
  std::optional<OwnerRecord> stale;     ///< holder.json naming a process that is gone
  std::string local_sem_path;           ///< level (a): /dev/shm/sem.<name>
  bool local_exists = false;
  int local_value = -1;                 ///< 1 free, 0 taken, -1 unknown
  std::optional<OwnerRecord> local_owner;
  bool local_owner_alive = false;
  std::vector<ReadyRecord> ready;       ///< sorted by key
  std::vector<std::string> unreadable;  ///< marker files that do not parse
};

/// Reads the gate of `dir` without creating or locking anything. A dir with
/// no `.dflash/` is reported as free with no keys. False with `err` (and the
/// fixing chmod/chown) if the dir is insecure.
bool ReadGateStatus(const std::string& dir, GateStatusReport* out, std::string* err);

/// For people: "gate /c: held by drafter:0 (pid 1234, key drafter) for 42 s", then the keys.
std::string StatusText(const GateStatusReport& s, double now_unix);

/// For scripts (`status --json`): the same facts, ages in seconds.
nlohmann::json StatusJson(const GateStatusReport& s, double now_unix);

}  // namespace dflash
