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
#pragma once

#include <string>
#include <string_view>

namespace dflash {

/// False (with a 1-based line/column and a message) if `text` holds a byte
/// sequence toml++ 3.3 cannot parse safely, or is not valid UTF-8.
bool ScreenTomlText(std::string_view text, int* line, int* col, std::string* message);

}  // namespace dflash
