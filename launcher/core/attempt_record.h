// One start of a process as the supervisor's core records it (SupervisorCore keeps
// them per process), and as summary.json's "attempts" writes it: one record from the
// core to the file (docs/summary-json.md).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "contract/enum_names.h"
#include "contract/gate_facts.h"

namespace dflash {

/// What came of an attempt's end (summary.json's "outcome"); kNone while it runs.
enum class AttemptOutcome {
  kNone, kRestarted, kRestartedByCtl, kStopped, kStoppedByCtl, kSucceeded, kFailed, kFatal, kHung, kCollateral,
};
inline constexpr EnumName<AttemptOutcome> kAttemptOutcomeNames[] = {
    {AttemptOutcome::kNone, ""},
    {AttemptOutcome::kRestarted, "restarted"},
    {AttemptOutcome::kRestartedByCtl, "restarted by ctl"},
    {AttemptOutcome::kStopped, "stopped"},
    {AttemptOutcome::kStoppedByCtl, "stopped by ctl"},
    {AttemptOutcome::kSucceeded, "succeeded"},
    {AttemptOutcome::kFailed, "failed"},
    {AttemptOutcome::kFatal, "fatal"},
    {AttemptOutcome::kHung, "hung"},
    {AttemptOutcome::kCollateral, "collateral"},
};
inline const char* AttemptOutcomeName(AttemptOutcome o) { return NameIn(kAttemptOutcomeNames, o).data(); }
inline bool Restarted(AttemptOutcome o) {
  return o == AttemptOutcome::kRestarted || o == AttemptOutcome::kRestartedByCtl;
}

/// What an attempt's training metrics said (DFLASH_METRICS_FILE: `steps`, `resumed_from_step`, `checkpoint`;
/// docs/checkpoints.md). Read from the attempt's file when the run's summary is built: the core reads no files.
struct AttemptTraining {
  int64_t steps = -1;              ///< steps this attempt ran; -1: it reported none
  int64_t step = -1;               ///< the training step it had reached (resumed_from_step + steps); -1: unknown
  int64_t resumed_from_step = -1;  ///< the checkpoint step it resumed from (0: none there yet); -1: not reported
};

/// What the files a payload left for one attempt said (its torch error file, its DFLASH_METRICS_FILE:
/// launcher/supervise/payload_files.h), read once by the shell when the attempt was reaped and told to the core
/// with its end (SupervisorCore::OnExit). The core judges the end and builds the run's summary from these facts;
/// nothing reads those files again.
struct AttemptFiles {
  std::string error_message;          ///< the error file's message ("" without one): the end's words
  nlohmann::json error_file;          ///< the error file (parsed, or {"unparsed": text}); null: none
  std::string error_file_unreadable;  ///< why it was not read ("a FIFO, not a regular file"), or ""
  nlohmann::json metrics;             ///< the metrics file; null: none
  std::string metrics_unreadable;     ///< why it was not read, or ""
  AttemptTraining training;           ///< what the metrics said of training
};

/// One start of a process, kept for summary.json's history.
struct AttemptRecord {
  int attempt = 0;
  pid_t pid = -1;
  double start_s = -1;  ///< since the run began; -1: never started
  double end_s = -1;    ///< -1 while it runs
  int exit_code = -1;   ///< shell style (128+N for signal N); -1: no end yet
  int signal = 0;
  std::string reason;   ///< how it ended ("exited with code 3: ...")
  AttemptOutcome outcome = AttemptOutcome::kNone;  ///< what came of its end; kNone while it runs
  bool start_failed = false;  ///< could not be started (pipes, fork, exec: 126/127)
  bool ready_timeout = false; ///< not ready within ready.timeout (the run exits 75)
  bool hung = false;          ///< killed by its watchdog
  bool with_unit = false;     ///< stopped and restarted because another process of its restart unit failed
  double ready_s = 0;         ///< spawn to ready (0: never ready)
  GateFacts gate;             ///< what its worker reported of the compile gate (summary.json "gate")
  AttemptTraining training;   ///< from its metrics file, told by the shell at its end (AttemptFiles)
  std::string metrics_unreadable;  ///< why its metrics file was not read (AttemptFiles), or ""
};

}  // namespace dflash
