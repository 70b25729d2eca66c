// Config errors a person can act on: where, which key, expected, found, hint.
#pragma once

#include <string>
#include <vector>

namespace dflash {

struct SourcePos {
  std::string file;
  int line = 0;  // 1-based; 0 when unknown
  int col = 0;

  std::string ToString() const;  // "file:line:col"
};

struct ConfigError {
  SourcePos pos;
  std::string key;       // "role[drafter].restart.max"
  std::string message;   // one line: what is wrong
  std::string expected;
  std::string found;
  std::string hint;
  bool warning = false;  // a doubt, not an error: the run may go on (FormatWarnings)

  /// file:line:col: error: key: message (or "warning:")
  ///     expected: ...
  ///     found:    ...
  ///     hint:     ...
  std::string Format() const;
};

/// All errors, sorted by position, each formatted, separated by blank lines.
std::string FormatErrors(std::vector<ConfigError> errors);
/// Warnings the same way, without "nothing was started".
std::string FormatWarnings(const std::vector<ConfigError>& warnings);

}  // namespace dflash
