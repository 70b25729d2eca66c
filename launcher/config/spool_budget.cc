#include "launcher/config/spool_budget.h"

#include <sys/statvfs.h>

#include <cstdio>
#include <filesystem>

namespace dflash {
namespace {

// A frame's JSON header (two tensors, producer and seq metadata) is a few hundred bytes; the producers pad it to 8.
constexpr int64_t kHeaderBound = 4096;

int64_t DtypeBytes(const std::string& dtype) { return dtype == "fp32" ? 4 : 2; }

std::string Bytes(int64_t n) {
  char buf[64];
  if (n >= (int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%lld bytes (%.1f GiB)", static_cast<long long>(n), n / double(1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%lld bytes (%.1f MiB)", static_cast<long long>(n), n / double(1 << 20));
  return buf;
}

bool ProducesFrames(const RunConfig& config) {
  for (const RoleSpec& r : config.roles)
    if (r.ProducesFrames()) return true;
  return false;
}

}  // namespace

int64_t SpoolFrameBytes(const ModelSpec& m) {
  const int64_t rows = int64_t{m.batch} * m.seq_len;
  return rows * m.NumTaps() * m.hidden * DtypeBytes(m.dtype) + rows * 8 + kHeaderBound;
}

int64_t SpoolFreeBytes(const std::string& dir) {
  std::filesystem::path p(dir);
  while (true) {
    struct statvfs st {};
    if (::statvfs(p.c_str(), &st) == 0) return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
    if (!p.has_parent_path() || p.parent_path() == p) return -1;
    p = p.parent_path();
  }
}

void AddSpoolBudgetWarnings(const RunConfig& config, int64_t free_bytes, std::vector<ConfigError>* warnings) {
  const RunSpec& run = config.run;
  if (!config.model.present || !ProducesFrames(config)) return;
  const int64_t frame = SpoolFrameBytes(config.model);
  const std::string what = "one frame of [model] (batch x seq_len x taps x hidden x dtype + tokens + header) is " +
                           Bytes(frame);
  if (run.spool_max_bytes > 0 && run.spool_max_bytes < frame) {
    ConfigError w;
    w.warning = true;
    w.pos = run.spool_max_bytes_pos;
    w.key = "run.spool_max_bytes";
    w.message = "the spool's byte budget cannot hold one frame: producers fail at their first frame";
    w.expected = "at least " + std::to_string(frame) + " (" + what + ")";
    w.found = std::to_string(run.spool_max_bytes);
    w.hint = "spool_max_bytes = " + std::to_string(4 * frame) +
             " (four frames) or more; or remove the key for half the spool filesystem's free space";
    warnings->push_back(std::move(w));
  }
  if (free_bytes < 0) return;
  // The default budget is half the free space (dflash_launch.spool.write.DEFAULT_SHARE); a written one is
  // bounded by the filesystem all the same.
  const int64_t usable = run.spool_max_bytes > 0 ? free_bytes : free_bytes / 2;
  if (usable >= frame) return;
  ConfigError w;
  w.warning = true;
  w.pos = run.spool_dir_given ? run.spool_dir_pos : run.spool_max_bytes_pos;
  if (w.pos.file.empty()) w.pos.file = config.path;
  w.key = run.spool_dir_given ? "run.spool_dir" : "run.spool_max_bytes";
  w.message = "the spool's filesystem (under " + run.spool_dir + ") has " + Bytes(free_bytes) + " free" +
              (run.spool_max_bytes > 0 ? "" : ", and the default budget is half of it") +
              ": it cannot hold one frame, producers would wait or fail at their first";
  w.expected = "room for at least one frame: " + what;
  w.found = Bytes(free_bytes) + " free";
  w.hint = "give the spool room: a larger /dev/shm (docker run --shm-size, or mount -o remount,size=... /dev/shm), "
           "or [run] spool_dir on a larger tmpfs";
  warnings->push_back(std::move(w));
}

}  // namespace dflash
