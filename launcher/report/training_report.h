// What the end of a run says of training, for any process that reports it in its DFLASH_METRICS_FILE
// (dflash_launch.train_metrics.TrainingMetrics, the reference and builtin drafters, or a script's own JSON):
// steps, loss first -> last, time to its first step, spool frames; the loss curves as an SVG; and whether the
// processes that all succeeded needed restarts to get there.
#pragma once

#include <cstdint>
#include <string>

#include "launcher/core/run_summary.h"

namespace dflash {

/// What one attempt's metrics say of training: `steps`, `resumed_from_step`, and the step reached (resumed_from_step
/// + steps, or the last committed `checkpoint.step` if later: a commit rewrites the file at once). Unknown: -1.
AttemptTraining TrainingOfMetrics(const nlohmann::json& metrics);

/// A process's training across its attempts (summary.json "training"): every attempt's steps summed, the step the
/// last one reached, and the steps done twice: each restart's step reached minus the step the next one resumed from.
struct TrainingAcross {
  int64_t steps = 0, step = -1, resumed_from_step = -1, steps_redone = 0;
  int attempts = 0;      ///< attempts that reported steps
  bool any = false;      ///< some attempt reported steps
};
TrainingAcross TrainingAcrossAttempts(const ProcessSummary& p);

/// The "training" table: a row per process (not warm-ups) whose metrics have a numeric `steps`; "" if none.
/// Steps count every attempt; a process restarted says where each restart resumed and what it redid.
/// Reads `steps`, `first_loss`/`last_loss` (else the ends of `losses`), `time_to_first_step_s` (else
/// `compile_wall_s`), `frames_acked` and `frames_padded`/`frames_dropped` (dflash_launch.spool.world).
std::string TrainingTable(const RunSummary& s);

/// Every such process's `losses` (at least 2; x = index * `loss_stride`) as one SVG line chart; "" if none.
/// Hand-written: a polyline per process is a few lines of text, and the launcher has no plotting library
/// (the demo's PNG needs matplotlib in a Python: dflash_launch.tools.demo_report).
std::string LossPlotSvg(const RunSummary& s);

}  // namespace dflash
