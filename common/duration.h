// Durations as people write them in run.toml: "250ms", "30s", "20m", "1h30m".
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace dflash {

using Millis = std::chrono::milliseconds;
using SteadyTime = std::chrono::steady_clock::time_point;

/// Parses a duration: one or more <number><unit> parts, units ms, s, m, h, d.
/// A bare "0" is zero. Returns false with a reason in `err` otherwise.
bool ParseDuration(std::string_view text, Millis* out, std::string* err);

/// The shortest exact spelling that ParseDuration reads back: 90000ms -> "1m30s".
std::string FormatDuration(Millis d);

/// Seconds with one decimal for people: "12.3s".
std::string FormatSeconds(double seconds);

}  // namespace dflash
