// How a judge of deadlines (the supervisor, dflash-worker) tells time it did
// not see -- it was stopped, frozen or starved -- from silence of the process
// it judges (docs/design.md, "Time that did not pass for the run").
#pragma once

#include <chrono>

namespace dflash {

/// While a deadline runs, the judge looks at the clock at least this often,
/// so a pause shows as a late wake-up rather than as a deadline due.
inline constexpr std::chrono::milliseconds kPauseProbe{250};
/// A wake-up later than asked by more than this is a pause, not scheduling noise.
inline constexpr std::chrono::milliseconds kPauseSlack{500};

}  // namespace dflash
