// Test support: wait for the event itself, with a deadline -- never a sleep standing in for it.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace dflash::test {

using namespace std::chrono_literals;

/// How long a test waits for an event that normally takes milliseconds: a hang detector, not a
/// speed assertion (a machine under load must never fail a test by being slow).
inline constexpr std::chrono::milliseconds kEventTimeout = std::chrono::seconds(60);

/// Polls `condition` every `step` until it holds or `deadline` passes; its last answer, so a
/// condition that became true just at the deadline still counts.
bool WaitUntil(const std::function<bool()>& condition, std::chrono::steady_clock::time_point deadline,
               std::chrono::milliseconds step = 5ms);

/// WaitUntil(condition, now + timeout).
bool WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout = kEventTimeout,
               std::chrono::milliseconds step = 5ms);

/// Reads `fd` (a pipe) until what was read contains `want`, EOF, or `timeout`; true if `want`
/// was seen. Everything read is appended to `*got`.
bool ReadUntil(int fd, std::string_view want, std::string* got,
               std::chrono::milliseconds timeout = kEventTimeout);

}  // namespace dflash::test
