// A payload behind the compile gate: take the gate on the payload's behalf,
// run it (lead: it compiles; reuse: READY is there, it loads the cache), and
// when the leader's payload is ready publish READY and release the gate while
// the payload keeps running. What `dflash-worker --gate-dir` and
// `dflash-cachelock run` both are.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/ready_spec.h"

namespace dflash {

struct GatedRunOptions {
  std::string name;               ///< "drafter:1": in messages and gate records
  std::vector<std::string> argv;  ///< the payload
  ReadySpec ready;                ///< when the payload counts as ready (timeout 0: forever)
  Millis stop_grace{10'000};

  /// The gate; an empty dir runs the payload ungated.
  std::string gate_dir;
  std::string gate_key;
  Millis gate_timeout{std::chrono::minutes(60)};
  Millis progress_every{std::chrono::seconds(5)};
  std::string torch_version;  ///< recorded in READY

  /// Lines for people (gate decisions, progress, failures); stderr by default.
  std::function<void(const std::string& line)> say;
  /// Report to the parent through $NOTIFY_SOCKET (the supervisor): MAINPID,
  /// READY=1 when the payload is ready, STATUS= lines, X_DFLASH_GATE_* facts,
  /// how the payload ended. Off for dflash-cachelock run.
  bool report = true;
  /// Also say "<name> ready" and each STATUS= line.
  bool verbose = false;
};

/// Runs the payload to its end; returns the exit code to exit with: the
/// payload's (128+N for signal N), 127/126 if it could not be executed, 75 on
/// a gate or readiness timeout, 73 if the gate dir is unusable, 64 for a bad key.
int RunGated(const GatedRunOptions& options);

}  // namespace dflash
