// The live view: one line per process, redrawn in place at the bottom of a
// terminal while events and the processes' output scroll above it (as
// `docker compose up` does). Rendering is pure (status + width -> lines) so it
// is tested without a terminal; LiveScreen turns lines into the escape
// sequences; ProcMeter samples RSS and CPU from /proc. The Console (its writer
// thread) drives them; `ctl status` prints the same rows.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/control/control.h"

namespace dflash {

/// "42s", "2m13s", "1h02m", "3d04h".
std::string CompactDuration(double seconds);
/// "-" (unknown), "812K", "340M", "1.2G".
std::string CompactBytes(int64_t bytes);

/// `text` made safe for one terminal line: control characters (escape
/// sequences of a payload's STATUS=, tabs, newlines) become '?', then cut to
/// `width` columns (a UTF-8 sequence counts as one column and is never split).
std::string FitLine(std::string_view text, size_t width);

/// The block: a header ("run r1 | up 2m13s | 8/8 running"), a column header,
/// then one line per process, each at most `width - 1` columns (the last
/// column is never written, so no terminal ever wraps a line). When there are
/// more processes than `max_lines - 2`, the last line says how many are not
/// shown. Colour (the state only) when `color`.
std::vector<std::string> RenderStatus(const RunStatus& status, size_t width, size_t max_lines, bool color);

/// The bytes that put a frame on the terminal: the block drawn last is erased
/// (cursor to column 0, up to its first line, erase to the end of the screen),
/// `scroll` (whole lines, each ending in '\n') is written where it was, and the
/// block is drawn again below it, its last line without a '\n' so the block
/// always ends on the terminal's cursor line.
class LiveScreen {
 public:
  std::string Frame(std::string_view scroll, const std::vector<std::string>& block);
  /// Erases the block; nothing is drawn after it.
  std::string Clear();
  size_t drawn() const { return drawn_; }

 private:
  std::string Erase() const;
  size_t drawn_ = 0;
};

/// RSS and CPU of each process from /proc (the payload under a worker if
/// known, and still in the process's tree: a claimed pid that is gone may have
/// been reused, and is then shown as -1): CPU is the share of one core used
/// since the previous Fill (or since the process started, the first time).
class ProcMeter {
 public:
  void Fill(RunStatus* status);

 private:
  struct Last {
    uint64_t ticks = 0;
    std::chrono::steady_clock::time_point at;
  };
  std::map<int, Last> last_;
};

/// The terminal's width and height for `fd` (TIOCGWINSZ); 80x24 if unknown.
void TerminalSize(int fd, size_t* width, size_t* height);

}  // namespace dflash
