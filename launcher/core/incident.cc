#include "launcher/core/incident.h"

#include <algorithm>

#include "common/exit_codes.h"

namespace dflash {

void Incident::NoteFailure(size_t i, SteadyTime now, const std::vector<size_t>& unit) {
  const int attempt = units_[i].view().attempt;
  // The story's root causes: a peer that went down with an earlier failure (its attempt of then) is its echo.
  bool echo = false;
  for (const RootFailure& r : roots_)
    for (const auto& [j, a] : r.unit) echo |= j == i && a == attempt;
  if (!echo) {
    RootFailure r{static_cast<int>(i), attempt, {}};
    for (size_t j : unit)
      if (j != i) r.unit.emplace_back(j, units_[j].view().attempt);
    roots_.push_back(std::move(r));
  }
  MaybeClose(now);
  if (incident_proc_ >= 0) return;
  incident_proc_ = static_cast<int>(i);
  incident_attempt_ = units_[i].view().attempt;
}

void Incident::MaybeClose(SteadyTime now) {
  // The run is healthy again when nothing waits to restart, starts or stops,
  // and every live process has run its role's reset_after (the same "ran long
  // enough" that resets the backoff): a failure after that is a new incident.
  if (incident_proc_ < 0 || stopping_) return;
  for (const ProcessUnit& u : units_) {
    const CoreProc& p = u.view();
    if (p.state == ProcState::kBackoff || p.state == ProcState::kStarting || p.state == ProcState::kStopping ||
        p.state == ProcState::kFailed || p.state == ProcState::kFatal)
      return;
    if (p.alive() && now - p.started < u.role().restart.reset_after) return;
  }
  incident_proc_ = incident_attempt_ = -1;
}

std::string Incident::Blame(size_t i) {
  std::string stop_reason = units_[i].name() + " " + units_[i].view().reason;
  if (culprit_ >= 0) return stop_reason;
  // The root cause: the first failure of the incident, even if that one was
  // restartable when it happened (the others may only be its echo).
  // (The same process failing again is its own story: its last failure is named.)
  if (incident_proc_ >= 0 && incident_proc_ != static_cast<int>(i)) {
    culprit_ = incident_proc_;
    culprit_attempt_ = incident_attempt_;
    culprit_restarted_ = true;
  } else {
    culprit_ = static_cast<int>(i);
    culprit_attempt_ = units_[i].view().attempt;
  }
  return stop_reason;
}

bool Incident::BlamesOther(size_t i) const {
  return (culprit_ >= 0 && culprit_ != static_cast<int>(i)) || !node_culprit_.empty();
}

bool Incident::BeginStop(const std::string& reason) {
  if (stopping_) return false;
  stopping_ = true;
  stop_reason_ = reason;
  return true;
}

std::string NodeCulpritName(const NodeCulprit& c) {
  const std::string node = "node " + std::to_string(c.node);
  switch (c.kind) {
    case NodeCulprit::Kind::kNodeFailed: return node + (c.process.empty() ? "" : ": " + c.process);
    case NodeCulprit::Kind::kNodeLost: return node + " (launcher lost)";
    case NodeCulprit::Kind::kNodeReplaced: return node + " (replaced)";
    case NodeCulprit::Kind::kLeftBehind: return node + " (left behind)";
    case NodeCulprit::Kind::kStore: return "the store";
    case NodeCulprit::Kind::kPrivateStore: return "node 0 (its private store)";
    case NodeCulprit::Kind::kRound: return "round " + std::to_string(c.round);
  }
  return node;
}

void Incident::StoppedForNode(const NodeCulprit& culprit, const std::string& reason, int exit_code,
                              nlohmann::json record) {
  node_culprit_ = NodeCulpritName(culprit);
  node_record_ = std::move(record);
  node_exit_code_ = exit_code;
  node_reason_ = reason;
}

const AttemptRecord* Incident::culprit_attempt() const {
  if (culprit_ < 0) return nullptr;
  const CoreProc& c = units_[static_cast<size_t>(culprit_)].view();
  for (const AttemptRecord& a : c.attempts)
    if (a.attempt == culprit_attempt_) return &a;
  return c.last();
}

std::vector<RestartStory> Incident::Restarts(const TrainingOf& training) const {
  auto record = [&](size_t proc, int attempt) -> const AttemptRecord* {
    for (const AttemptRecord& a : units_[proc].view().attempts)
      if (a.attempt == attempt) return &a;
    return nullptr;
  };
  auto told = [&](size_t proc, const AttemptRecord& a, bool by_ctl) {
    RestartStory t;
    t.process = units_[proc].name();
    t.attempt = a.attempt;
    t.reason = by_ctl ? "restarted by ctl" : a.reason;
    t.signal = a.signal;
    t.exit_code = a.exit_code;
    t.by_ctl = by_ctl;
    if (training) {
      t.step = training(proc, a.attempt).step;
      if (record(proc, a.attempt + 1)) t.resumed_from_step = training(proc, a.attempt + 1).resumed_from_step;
    }
    return t;
  };
  std::vector<std::pair<double, RestartStory>> out;  // by when the attempt ended
  for (const RootFailure& r : roots_) {
    const AttemptRecord* a = record(static_cast<size_t>(r.proc), r.attempt);
    if (!a || a->outcome != AttemptOutcome::kRestarted) continue;  // the failure that ended the run: the culprit
    RestartStory t = told(static_cast<size_t>(r.proc), *a, false);
    for (const auto& [j, attempt] : r.unit) {
      const AttemptRecord* b = record(j, attempt);
      if (b && Restarted(b->outcome)) t.restarted_with.push_back(units_[j].name());
    }
    out.emplace_back(a->end_s, std::move(t));
  }
  for (size_t i = 0; i < units_.size(); ++i)
    for (const AttemptRecord& a : units_[i].view().attempts)
      if (a.outcome == AttemptOutcome::kRestartedByCtl) out.emplace_back(a.end_s, told(i, a, true));
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<RestartStory> story;
  for (auto& [t, s] : out) story.push_back(std::move(s));
  return story;
}

std::string Incident::RestartNote(const std::vector<RestartStory>& story) const {
  // Restarts on the way to an exit 0 are part of the story: "succeeded" alone would hide a run that limped.
  // Told by their root causes (the peers of a torch world restarted with it are named with it).
  if (!story.empty()) {
    std::string o = " (after " + std::to_string(story.size()) + (story.size() == 1 ? " restart: " : " restarts: ");
    for (size_t k = 0; k < story.size(); ++k) o += (k ? "; " : "") + story[k].Text();
    return o + ")";
  }
  // Restarts with no root cause here (another node's round): counted as summary.json's "restarts", every start
  // after a process's first.
  int total = 0;
  std::string who;
  for (const ProcessUnit& u : units_) {
    int n = std::max(0, u.view().attempt);
    if (n == 0) continue;
    total += n;
    who += (who.empty() ? "" : ", ") + u.name() + " " + std::to_string(n) + "x";
  }
  if (!total) return "";
  return " (after " + std::to_string(total) + (total == 1 ? " restart: " : " restarts: ") + who + ")";
}

RunVerdict Incident::Verdict(const std::string& start_error, const TrainingOf& training) const {
  RunVerdict v;
  v.restarts = Restarts(training);
  // How the run ended when no process of this node is to blame.
  v.exit_code = !node_culprit_.empty() ? node_exit_code_
                : unguarded_           ? exit_code::kFailure
                : stop_signal_         ? exit_code::kSignalBase + stop_signal_
                                       : exit_code::kOk;
  v.reason = !node_culprit_.empty()                                         ? node_reason_
             : unguarded_ || stop_signal_ || manual_stop_ || roles_done_ ? stop_reason_
                                                                           : "all processes succeeded";
  if (culprit_ >= 0) {
    const ProcessUnit& c = units_[static_cast<size_t>(culprit_)];
    const AttemptRecord* a = culprit_attempt();
    v.culprit = c.name();
    v.culprit_attempt = a ? a->attempt : -1;
    // The root cause may be an earlier attempt, restarted then: name that one. "Restarted" only when a later
    // attempt started: a restart still in its backoff when the run stopped never came.
    const bool restarted = a && static_cast<size_t>(a->attempt) + 1 < c.view().attempts.size();
    const std::string attempt_words = restarted ? a->reason + " (attempt " + std::to_string(a->attempt) + ", restarted)"
                                      : a       ? a->reason
                                                : c.view().reason;
    v.culprit_why = restarted ? attempt_words : c.view().reason;
    if (a) v.exit_code = a->ready_timeout ? exit_code::kTimeout : a->exit_code > 0 ? a->exit_code : exit_code::kFailure;
    // The root cause's restart was decided and something else ended the run: say both.
    v.reason = culprit_restarted_ && a ? c.name() + " " + attempt_words + "; then " + stop_reason_
                                       : c.name() + " " + c.view().reason;
  } else if (!start_error.empty()) {  // nothing ran: never "succeeded"
    v.exit_code = exit_code::kFailure;
    v.reason = "the supervisor could not start (" + start_error + "); no process was started";
  }
  if (v.exit_code == exit_code::kOk) v.reason += RestartNote(v.restarts);
  if (!node_culprit_.empty()) {  // another node's failure stopped the run (store mode): that node is the culprit
    v.culprit = node_culprit_;
    v.culprit_attempt = -1;
    v.node_culprit = node_record_;
    // A failure here after it: its row names its own last words, no attempt of the other node's.
    if (culprit_ >= 0) v.culprit_why = units_[static_cast<size_t>(culprit_)].view().reason;
  }
  return v;
}

}  // namespace dflash
