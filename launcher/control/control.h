// The live-control contract: what `dflash-launch ctl` may ask of a running run, and
// the status it answers with. One definition for the supervisor (which answers),
// the control socket (which carries it), the ctl client and the live view (which show it).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "contract/enum_names.h"

namespace dflash {

/// A process's restarts, with one meaning everywhere (`ctl status`, the live view, the summary table,
/// summary.json, dflash_restarts_total): every time it was started again, or will be (in BACKOFF), told by why
/// the attempt before it ended.
struct RestartCounts {
  int own = 0;   ///< its own failure: an exit, a signal not ours, hung, not ready, failed to start
  int unit = 0;  ///< another process of its restart unit or torch world failed (or a round of every node)
  int ctl = 0;   ///< asked by hand: `ctl restart`, or `ctl start` after a stop asked by hand
  int total() const { return own + unit + ctl; }
  /// The count and why, for a table's cell: "0", "1 own", "2 unit", "3 (1 own, 2 ctl)".
  std::string Text() const;
};
/// {"own": n, "unit": n, "ctl": n}; FromJson: false (`err`) unless it is one.
nlohmann::json ToJson(const RestartCounts& r);
bool FromJson(const nlohmann::json& j, RestartCounts* out, std::string* err);

/// One process as `ctl status` and the live view show it.
struct ProcessStatus {
  std::string name;          // "drafter:1", or "drafter:warmup"
  std::string role;
  int rank = -1;             // role rank; -1 for a warm-up
  std::string state;         // ProcStateName(): "RUNNING", "BACKOFF", ...
  int pid = -1;              // the process the supervisor started, while it lives
  int payload_pid = -1;      // the payload under dflash-worker (MAINPID=), or -1
  std::string gpu;           // its CUDA_VISIBLE_DEVICES, or ""
  std::string gate;          // "lead", "reuse", "waiting" or "" (ungated / not yet)
  std::string status;        // the last STATUS= it sent ("step 190 loss 2.31"), or ""
  int attempt = 0;           // spawns so far - 1 (0 before the first)
  RestartCounts restarts;    // every start after the first, by why (the JSON's "restarts" is their total)
  bool held = false;         // stopped by hand: stays stopped until `ctl start`
  double uptime_s = 0;       // since this attempt started; 0 when not running
  int64_t rss_bytes = -1;    // sampled from /proc by whoever shows it; -1: unknown
  double cpu_percent = -1;   // likewise
  std::string reason;        // why it is in this state ("exit 3", "stopped by ctl", ...)
};

struct RunStatus {
  std::string run_id;
  std::string run_dir;
  int supervisor_pid = -1;
  double uptime_s = 0;
  bool stopping = false;
  std::vector<ProcessStatus> processes;
  /// Where it serves Prometheus metrics ("http://127.0.0.1:PORT/metrics"), "" if it does not (docs/metrics.md).
  std::string metrics_url;
};

nlohmann::json ToJson(const ProcessStatus& p);
nlohmann::json ToJson(const RunStatus& s);
/// False with `err` naming the key when `j` is not a status this version wrote.
bool FromJson(const nlohmann::json& j, RunStatus* out, std::string* err);

/// kMetrics: the Prometheus text of the run (docs/metrics.md), in the reply's body "text"; no target.
enum class ControlVerb { kStatus, kRestart, kStop, kStart, kSignal, kMetrics };
/// The verbs as `ctl` and the wire spell them (contract/enum_names.h).
inline constexpr EnumName<ControlVerb> kControlVerbNames[] = {
    {ControlVerb::kStatus, "status"}, {ControlVerb::kRestart, "restart"}, {ControlVerb::kStop, "stop"},
    {ControlVerb::kStart, "start"},   {ControlVerb::kSignal, "signal"}, {ControlVerb::kMetrics, "metrics"},
};
/// Verbs that name no target.
inline bool VerbTakesTarget(ControlVerb v) { return v != ControlVerb::kStatus && v != ControlVerb::kMetrics; }
const char* ControlVerbName(ControlVerb v);
bool ParseControlVerb(const std::string& text, ControlVerb* out);

struct ControlRequest {
  ControlVerb verb = ControlVerb::kStatus;
  std::string target;  // "all", "role", "role:rank" (not for kStatus)
  int signal = 0;      // kSignal only
};

/// ok: body is the status (kStatus) or {"affected": [names]}; else `error` says why.
struct ControlReply {
  bool ok = false;
  std::string error;
  nlohmann::json body;
};

/// What the supervisor implements for the control socket. Called on the
/// supervisor's own thread: the socket is served from its event loop.
class ControlHandler {
 public:
  virtual ~ControlHandler() = default;
  virtual RunStatus Status() = 0;
  virtual ControlReply Apply(const ControlRequest& request) = 0;
};

/// Resolves TARGET against the run's process names (warm-ups excluded unless
/// named): "all", a role, or "role:rank". Indices into `names`, in order; false
/// with `err` ("no process drafter:7; drafter has ranks 0-2") otherwise.
bool ResolveTarget(const std::string& target, const std::vector<std::string>& names,
                   std::vector<size_t>* out, std::string* err);

}  // namespace dflash
