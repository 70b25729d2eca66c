// The real GateBackend: Boost named_mutex in /dev/shm, OFD lock and records in <dir>/.dflash.
#pragma once

#include <memory>
#include <string>

#include "cachelock/backend.h"
#include "cachelock/gate_dir.h"

namespace dflash {

/// Opens (creating what is missing, 0700/0600) the gate of `dir` after the
/// security checks of PrepareGateDir. Null with `err` set if the dir is
/// insecure or a file or the named mutex cannot be created or opened.
std::unique_ptr<GateBackend> OpenOsGateBackend(const std::string& dir, GateLayout* layout,
                                               std::string* err);

/// Removes the host-local objects of a gate (the named mutex and its owner
/// record in /dev/shm). REQUIRES: no process on this host uses the gate: a
/// process that still has the old mutex open keeps using it while newcomers
/// create a new one, and only level (b) would still keep them apart.
bool RemoveHostLocalObjects(const GateLayout& layout, std::string* err);

}  // namespace dflash
