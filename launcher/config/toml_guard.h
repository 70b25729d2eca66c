// A pre-scan of run.toml text before toml++ sees it.
//
// toml++ 3.3 (Debian 12) reaches __builtin_unreachable() in
// is_non_ascii_horizontal_whitespace() for many non-ASCII code points wherever
// it tests for whitespace: outside strings and comments, and right after a
// backslash in a """multi-line""" string (marzer/tomlplusplus#190, #295; fixed
// upstream in PR #305, not in 3.3). Found here by `make fuzz`. Undefined
// behaviour on user input is not acceptable, so those inputs are rejected
// with a position first. TOML allows non-ASCII only inside strings and
// comments anyway, except after a line-ending backslash, where we ask for ASCII.
//
// toml++ also parses and destroys nested tables and arrays by recursion, with
// no bound on dotted keys: `a.b.c...` of 40,000 parts overflows the stack
// (SIGSEGV in `check`). A run.toml needs a handful of levels, so nesting
// deeper than kMaxTomlNesting is refused here, before toml++ sees it.
#pragma once

#include <string>
#include <string_view>

namespace dflash {

/// Levels of nesting a run.toml may use: the parts of one dotted key, plus the
/// [ ] and { } open around it.
constexpr int kMaxTomlNesting = 64;

/// False (with a 1-based line/column, a message and a hint) if `text` holds a
/// byte sequence toml++ 3.3 cannot parse safely, is not valid UTF-8, or nests
/// deeper than kMaxTomlNesting.
bool ScreenTomlText(std::string_view text, int* line, int* col, std::string* message, std::string* hint = nullptr);

}  // namespace dflash
