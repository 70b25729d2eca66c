#include "launcher/core/run_verdict.h"

#include "common/exit_codes.h"

namespace dflash {

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
