// Test support: a whole file (or pipe) in one call.
#pragma once

#include <string>
#include <string_view>

namespace dflash::test {

/// The whole content of `path`; a test failure (ADD_FAILURE, naming the path and errno) and ""
/// when it cannot be read. For a file that may legitimately be missing, use ReadFile (common/fd.h).
std::string Slurp(const std::string& path);

/// Everything read from `fd` until EOF (EINTR retried); what was read before an error.
/// REQUIRES: every write end of a pipe is closed, or this never returns.
std::string ReadToEof(int fd);

/// Writes `text` to `path` (truncating), creating its parent directories; a test failure if it cannot.
void WriteText(const std::string& path, std::string_view text);

}  // namespace dflash::test
