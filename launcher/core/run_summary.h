// The end of a run: per process what happened, which one caused it, and why. Built once by the core
// (SupervisorCore::Summary, run_summary.cc) from what it decided and what the shell told it; said by the report
// (launcher/report: summary_json.h, training_report.h), which changes nothing of it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "launcher/control/control.h"
#include "launcher/core/attempt_record.h"
#include "launcher/core/run_verdict.h"

namespace dflash {

struct ProcessSummary {
  std::string name;  // "drafter:1"
  std::string role;
  int role_rank = 0;
  int rank = 0;
  std::string device;  // "cuda:5" or "cpu"
  int pid = -1;        // of the last attempt
  std::string state;   // EXITED, FATAL, ...
  int exit_code = -1;  // shell style (128+N for a signal); -1 if it never ran to an end
  int signal = 0;      // N when a signal killed it
  RestartCounts restarts;   // every start after the first, by why (CountRestarts: as `ctl status` says it)
  bool held = false;        // stopped by hand when the run ended
  bool culprit = false;
  bool collateral = false;  // stopped by the supervisor after the culprit failed
  double runtime_s = 0;     // of the last attempt
  double ready_s = 0;       // spawn to ready, of the last attempt (0: never ready)
  std::string reason;       // "exited with code 3", "stopped (SIGTERM)"
  std::string stdout_log, stderr_log;
  nlohmann::json error_file;  // TORCHELASTIC_ERROR_FILE content, or null
  std::string error_file_unreadable;  // why its error file was not read ("a FIFO, not a regular file"), or ""
  GateFacts gate;             // of its last attempt (none: null)
  nlohmann::json metrics;     // the payload's DFLASH_METRICS_FILE, or null
  std::string metrics_unreadable;  // why its metrics file was not read, or ""
  int64_t memory_peak_bytes = -1;  // max memory.peak of its attempts' cgroups; -1: not measured
  std::vector<AttemptRecord> attempts;  // every attempt, first to last, as the core recorded them
  std::vector<std::pair<std::string, int>> ports;  // its role's named ports as given: ("http", 23456)
};

/// The run's verdict (exit code, culprit, reason: run_verdict.h) with its processes.
struct RunSummary : RunVerdict {
  std::string run_id;
  std::string config;
  std::string run_dir;
  double wall_s = 0;
  std::vector<std::string> warnings;  // e.g. a gate reuse that still missed the cache
  std::vector<ProcessSummary> processes;
  /// The warm-ups of roles in gate mode "warmup" ("drafter:warmup"): they ran
  /// before their role, in a world of one; not ranks of the run.
  std::vector<ProcessSummary> warmups;
};

}  // namespace dflash
