#include "contract/readiness.h"

namespace dflash {

bool Readiness::Init(std::string* err) {
  if (spec_.mode != ReadyMode::kLog) return true;
  if (matcher_.Compile(spec_.arg, err)) return true;
  *err = "bad regex '" + spec_.arg + "': " + *err;
  return false;
}

bool Readiness::Evidence() {
  if (!waiting()) return false;
  if (exited_ && !exit_ok_) {
    discounted_ = true;  // a process that failed is judged by its exit, not its last words
    return false;
  }
  verdict_ = Verdict::kReady;
  return true;
}

bool Readiness::OnExec(Clock::time_point now) {
  started_ = now;
  // "none" is ready at exec, whatever follows.
  if (spec_.mode != ReadyMode::kNone || !waiting()) return false;
  verdict_ = Verdict::kReady;
  return true;
}

bool Readiness::OnNotifyReady() { return spec_.mode == ReadyMode::kNotify && Evidence(); }

bool Readiness::OnLine(int stream, std::string_view line) {
  return WantsLines() && spec_.Matches(stream) && matcher_.compiled() && matcher_.Matches(line) && Evidence();
}

bool Readiness::OnFileExists() { return spec_.mode == ReadyMode::kFile && Evidence(); }

bool Readiness::OnProbe(bool answered, const std::string& detail) {
  if (!spec_.probes()) return false;
  if (!answered) {
    last_probe_ = detail;
    return false;
  }
  return Evidence();
}

void Readiness::OnExit(bool ok) {
  exited_ = true;
  exit_ok_ = ok;
}

bool Readiness::OnExitDrained() {
  if (!waiting()) return false;
  if (spec_.mode == ReadyMode::kExit && exit_ok_) {
    verdict_ = Verdict::kReady;
    return true;
  }
  verdict_ = Verdict::kFailed;
  return false;
}

bool Readiness::OnClock(Clock::time_point now) {
  std::optional<Clock::time_point> d = deadline();
  if (!d || now < *d) return false;
  verdict_ = Verdict::kTimedOut;
  return true;
}

std::optional<Readiness::Clock::time_point> Readiness::deadline() const {
  if (!started_ || !waiting() || spec_.timeout.count() <= 0 || spec_.mode == ReadyMode::kNone) return std::nullopt;
  return *started_ + spec_.timeout;
}

std::string Readiness::TimeoutText() const {
  return "not ready after " + FormatDuration(spec_.timeout) + " (ready = " + DescribeNotReady(spec_) +
         (last_probe_.empty() ? "" : "; last try: " + last_probe_) + ")";
}

}  // namespace dflash
