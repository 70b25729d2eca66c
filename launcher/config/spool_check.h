// Who reads the hidden-state spool has someone who writes it.
#pragma once

#include <vector>

#include "launcher/config/config.h"

namespace dflash {

/// A role that consumes frames (spool = "consume", or a builtin drafter) needs a producer (spool = "produce",
/// or a builtin target) on every node it runs on: without one its sources could never end (DFLASH_SPOOL_PRODUCERS
/// would be 0, which SpoolSource.from_env refuses, so the run would burn its restarts). One error per such role,
/// at its `spool` (else `builtin`) value.
void CheckSpoolProducers(const RunConfig& cfg, std::vector<ConfigError>* errors);

}  // namespace dflash
