#include "launcher/core/run_verdict.h"

#include "common/exit_codes.h"

namespace dflash {

std::string RestartStory::Text() const {
  std::string o = process + " " + reason;
  if (step >= 0) o += " at step " + std::to_string(step);
  if (resumed_from_step >= 0) o += std::string(step >= 0 ? "," : "") + " resumed from step " + std::to_string(resumed_from_step);
  if (!restarted_with.empty()) {
    o += " (restarted with it: ";
    for (size_t k = 0; k < restarted_with.size(); ++k) o += (k ? ", " : "") + restarted_with[k];
    o += ")";
  }
  return o;
}

void RunVerdict::RecordsIncomplete(const std::string& what) {
  records_error += (records_error.empty() ? "" : "; ") + what;
  if (exit_code == exit_code::kOk) {
    exit_code = exit_code::kFailure;
    reason = "every process succeeded, but the run's records are incomplete: " + what;
  } else {
    reason += "; and the run's records are incomplete: " + what;
  }
}

}  // namespace dflash
