// How a run ended, decided once (Incident::Verdict) and said the same everywhere: the exit status, summary.json,
// the console's last line and the store all give this one verdict.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

/// A restart the run went through, told by its root cause: the process that failed first (not the peers of its
/// restart unit that went down with it), or one restarted by `ctl restart` (summary.json "restarts").
struct RestartStory {
  std::string process;     ///< "drafter:1"
  int attempt = 0;         ///< its attempt that ended
  std::string reason;      ///< how that attempt ended: "killed by SIGKILL"; "restarted by ctl"
  int signal = 0;          ///< N when a signal killed it
  int exit_code = -1;      ///< shell style; -1: no end recorded
  bool by_ctl = false;     ///< `ctl restart`, not a failure
  int64_t step = -1;               ///< the training step it had reached (its last metrics); -1: unknown
  int64_t resumed_from_step = -1;  ///< the step its next attempt resumed from; -1: not reported
  std::vector<std::string> restarted_with;  ///< the rest of its restart unit (a torch world, a role), restarted too
  /// "drafter:1 killed by SIGKILL at step 25, resumed from step 20 (restarted with it: drafter:0, drafter:2)"
  std::string Text() const;
};

struct RunVerdict {
  int exit_code = 0;
  std::string culprit;       ///< the process (or node) the end is blamed on; empty: none
  int culprit_attempt = -1;  ///< which of its attempts was the root cause (-1: another node's)
  /// The culprit's failure in words, as the summary table says it beside its row: its last reason, or, when the
  /// root cause was an earlier attempt that was restarted, that attempt's "<reason> (attempt N, restarted)".
  /// Empty without a culprit here.
  std::string culprit_why;
  std::string reason;        ///< "all processes succeeded", or what ended the run
  /// Store mode: the other node's failure that stopped this one ({node, process, exit_code, reason};
  /// docs/multinode.md), or null.
  nlohmann::json node_culprit;
  /// Non-empty: the run's own records are incomplete (summary.json not written, supervisor.log lines lost: a full
  /// disk); the table says so instead of "summary in".
  std::string records_error;
  /// Every restart, first to last, by its root cause (a failure the run recovered from, or `ctl restart`).
  std::vector<RestartStory> restarts;

  /// The run's records are incomplete (`what`): said in the reason, never a silent cut; a run whose processes all
  /// succeeded then exits 1, since its record cannot be trusted.
  void RecordsIncomplete(const std::string& what);
};

}  // namespace dflash
