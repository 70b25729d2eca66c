// What the gate writes down: who holds it (owner records) and what was compiled (READY markers).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dflash {

/// Who holds a level of the gate. Written by the holder right after it takes
/// the level and cleared before it lets go; a record that outlives its writer
/// is judged by (pid, start_time): pids are reused, start times are not.
struct OwnerRecord {
  pid_t pid = 0;
  uint64_t start_time = 0;  ///< clock ticks since boot, /proc/<pid>/stat field 22
  std::string host;
  std::string role;         ///< who, for people: "drafter:0"
  std::string key;          ///< the gate key it acquired for
  double since = 0;         ///< unix seconds when it took the level
};

/// Same writer and same taking of the lock: a recoverer re-reads the record
/// under the file lock and acts only if it still names the owner it judged dead.
bool SameOwner(const OwnerRecord& a, const OwnerRecord& b);

/// "drafter:0 (pid 1234)", or "drafter:0 (pid 1234 on node7)" when the owner
/// is on another host than `local_host`.
std::string DescribeOwner(const OwnerRecord& r, std::string_view local_host);

/// A source file behind a derived key, as it was when READY was published. A
/// later leader of the same role compares them with its own to say which file
/// changed the key (worker/gated_run.cc).
struct ReadySource {
  std::string path;
  std::string sha256;  ///< hex; empty: the file was missing
};

/// A READY marker: the promise "the cache is warm for key". Written once,
/// atomically, by a leader whose payload became ready.
struct ReadyRecord {
  std::string key;
  std::string role;
  pid_t pid = 0;
  std::string host;
  double published_at = 0;     ///< unix seconds
  std::string torch_version;   ///< empty if the publisher did not know it
  std::string gpu;             ///< the GPU identity it was compiled for ("cpu", "NVIDIA H200 sm 9.0; cuda ..."); may be empty
  double compile_seconds = 0;  ///< from "lead" to publish()
  std::vector<ReadySource> sources;  ///< the key's files (GateOptions::sources); absent in older markers
  std::string cpu;             ///< the CPU identity it was compiled for (common/cpu_identity.h); empty in older markers
};

/// Which files differ between the sources of an older READY and ours, for
/// people: "/w/drafter_model.py changed, /w/extra.py is new" (at most `limit`
/// named, then "and N more"); empty when they are the same.
std::string DescribeSourceChanges(const std::vector<ReadySource>& before, const std::vector<ReadySource>& now,
                                  size_t limit = 4);

/// A record file can be read mid-write by a lock-free reader; such a read is
/// kGarbled (transient) and is never mistaken for kEmpty's "nobody".
enum class RecordState { kEmpty, kValid, kGarbled };

std::string EncodeOwner(const OwnerRecord& r);
RecordState DecodeOwner(std::string_view text, OwnerRecord* out);
nlohmann::json OwnerToJson(const OwnerRecord& r);

std::string EncodeReady(const ReadyRecord& r);
bool DecodeReady(std::string_view text, ReadyRecord* out, std::string* err);
nlohmann::json ReadyToJson(const ReadyRecord& r);

/// Gate keys name files: [A-Za-z0-9._-]{1,128}. Anything else is refused with
/// the offending character, so a key can never escape `.dflash/ready/`.
bool ValidGateKey(std::string_view key, std::string* err);

}  // namespace dflash
