// Bytes someone else wrote, made safe to print: another user's lock-file record
// or a name they chose reaches our terminal only as text, never as the escape
// sequences that retitle, clear or rewrite it (ESC [ 2 J, OSC 0 ; ... BEL).
#pragma once

#include <string>
#include <string_view>

namespace dflash {

/// `text` with every control byte (C0, DEL), every C1 control (U+0080-U+009F,
/// as UTF-8 or as a raw byte) and every byte of invalid UTF-8 written as \xHH
/// (and a backslash as \\); printable ASCII and valid UTF-8 stay as they are.
std::string Printable(std::string_view text);

}  // namespace dflash
