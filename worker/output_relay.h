// Copies a payload's output stream through unchanged while cutting it into
// lines for `log` readiness.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dflash {

/// One output stream of the payload (stdout or stderr) relayed to an fd of
/// the host. Every byte is written through, in order; writes happen at line
/// boundaries ('\n', and '\r' so progress bars stay live) so the payload's
/// lines are not torn apart by the other stream's writes, and a partial line
/// is held back only until it ends, grows past a bound, or the stream ends.
class OutputRelay {
 public:
  /// `on_line` gets each whole line without its '\n' (and without a '\r'
  /// before it); it may be empty to skip line splitting.
  OutputRelay(int out_fd, std::function<void(std::string_view)> on_line);

  /// Bytes read from the payload. Writes what ends a line, then hands the
  /// completed lines to `on_line` (so a matching line is out before anyone
  /// reacts to it).
  void Feed(std::string_view data);
  /// The stream ended: flushes the unterminated last line, and hands it to
  /// `on_line` as a line too.
  void Finish();
  /// Stop splitting lines (readiness reached); bytes still flow.
  void StopLines();

  /// False once a write failed (e.g. EPIPE: the host's stdout was closed);
  /// further output is then read and dropped so the payload never blocks.
  bool output_ok() const { return out_ok_; }
  size_t bytes_written() const { return written_; }

 private:
  void Write(std::string_view data);

  int out_fd_;
  std::function<void(std::string_view)> on_line_;
  bool lines_on_;
  std::string unwritten_;  // bytes after the last line boundary written
  std::string line_;       // the current line, for on_line_
  bool out_ok_ = true;
  size_t written_ = 0;
};

}  // namespace dflash
