// The run's story of failure and of its end: the incident (the first failure since the run was last healthy),
// the culprit it names if the run ends before it recovers, why the run stops, and from those the ONE verdict
// (run_verdict.h) that the exit status, summary.json, the console and the store all give
// (docs/summary-json.md, "culprit"; docs/exit-codes.md).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "launcher/core/node_culprit.h"
#include "launcher/core/process_unit.h"
#include "launcher/core/run_verdict.h"

namespace dflash {

/// What an attempt (process index, attempt) said of training: read by the shell from its metrics file.
using TrainingOf = std::function<AttemptTraining(size_t proc, int attempt)>;

class Incident {
 public:
  explicit Incident(const std::vector<ProcessUnit>& units) : units_(units) {}

  // --- failures ---------------------------------------------------------------------------------------
  /// Unit `i` failed (a restartable failure too): the incident's first failure, unless one is open. The
  /// run is healthy again, and an open incident closes, once nothing waits to restart, start or stop and
  /// every live process has run its role's reset_after.
  /// `unit`: the processes restarted with `i` (RestartUnit): their attempts running now that fail next are
  /// its echo (a peer its death took down), never a root cause of their own in the story (Verdict's restarts).
  void NoteFailure(size_t i, SteadyTime now, const std::vector<size_t>& unit);
  /// Unit `i`'s failure (its reason, set) ends the run: the culprit is the incident's first failure if that was
  /// another process (the others may only be its echo), else `i` (failing again: its last failure). Returns what
  /// the run stops for, in words: `i`'s name and its failure.
  std::string Blame(size_t i);
  /// Whether a culprit other than `i`, here or on another node, came first: `i`'s end is collateral.
  bool BlamesOther(size_t i) const;

  // --- the end ---------------------------------------------------------------------------------------
  /// The run stops for `reason`; false if it was stopping already (the first reason stands).
  bool BeginStop(const std::string& reason);
  bool stopping() const { return stopping_; }
  const std::string& stop_reason() const { return stop_reason_; }
  void StoppedBySignal(int sig) { stop_signal_ = sig; }
  int stop_signal() const { return stop_signal_; }
  void StoppedByHand() { manual_stop_ = true; }
  void RolesDone() { roles_done_ = true; }
  void Unguarded() { unguarded_ = true; }
  bool unguarded() const { return unguarded_; }
  /// Another node's failure stops the run (store mode): it is the culprit (named here, NodeCulpritName),
  /// `exit_code` the run's.
  void StoppedForNode(const NodeCulprit& culprit, const std::string& reason, int exit_code, nlohmann::json record);

  // --- what it comes to -------------------------------------------------------------------------------
  int culprit() const { return culprit_; }
  const AttemptRecord* culprit_attempt() const;
  const std::string& node_culprit() const { return node_culprit_; }
  const nlohmann::json& node_record() const { return node_record_; }
  /// The verdict; `start_error`: the loop could not even start, and nothing ran (never success). `training`:
  /// each attempt's training step (none: the story names no steps).
  RunVerdict Verdict(const std::string& start_error = "", const TrainingOf& training = {}) const;

 private:
  void MaybeClose(SteadyTime now);
  /// " (after 1 restart: d:1 killed by SIGKILL at step 25, resumed from step 20 (restarted with it: d:0))" for a
  /// run that ended 0 after restarts; "" without any.
  std::string RestartNote(const std::vector<RestartStory>& story) const;
  /// Every restart by its root cause, in the order they ended.
  std::vector<RestartStory> Restarts(const TrainingOf& training) const;

  /// A failure that is no echo of another: the process, its attempt, and its unit's others as they ran then.
  struct RootFailure {
    int proc = -1, attempt = -1;
    std::vector<std::pair<size_t, int>> unit;  ///< (process, attempt) of the rest of its restart unit
  };
  std::vector<RootFailure> roots_;

  const std::vector<ProcessUnit>& units_;
  int incident_proc_ = -1, incident_attempt_ = -1;
  int culprit_ = -1, culprit_attempt_ = -1;
  bool culprit_restarted_ = false;  ///< the root cause was restarted; another failure ended the run
  bool stopping_ = false;
  std::string stop_reason_;
  int stop_signal_ = 0;
  bool manual_stop_ = false;  ///< `ctl stop all` ended the run
  bool roles_done_ = false;   ///< the roles that are not services are done: the services were stopped
  bool unguarded_ = false;    ///< stopped for want of a guardian
  std::string node_culprit_, node_reason_;
  nlohmann::json node_record_;
  int node_exit_code_ = exit_code::kNodeFailed;
};

}  // namespace dflash
