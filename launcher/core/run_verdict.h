// How a run ended, decided once (Incident::Verdict) and said the same everywhere: the exit status, summary.json,
// the console's last line and the store all give this one verdict.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dflash {

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

  /// The run's records are incomplete (`what`): said in the reason, never a silent cut; a run whose processes all
  /// succeeded then exits 1, since its record cannot be trusted.
  void RecordsIncomplete(const std::string& what);
};

}  // namespace dflash
