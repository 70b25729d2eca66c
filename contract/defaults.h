// The defaults every tool shares (dflash-launch, dflash-worker, dflash-cachelock):
// one constant each, so `timeout = "30m"` in run.toml, the worker's flag and the
// gate CLI cannot drift apart. launcher/config/schema.cc prints these (config_test checks).
#pragma once

#include <chrono>

namespace dflash {

/// The one default for how long anyone waits for the gate (the schema's
/// role.gate.timeout, dflash-worker, dflash-cachelock, `cache` commands): long
/// enough for a large model's compile; a leader that is blocked rather than
/// compiling is reported long before (role.gate.idle_hint).
inline constexpr std::chrono::minutes kDefaultGateTimeout{30};
/// A waiter whose leader used ~no CPU this long says why (role.gate.idle_hint).
inline constexpr std::chrono::seconds kDefaultGateIdleHint{60};

}  // namespace dflash
