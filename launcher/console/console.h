// The terminal side of the log path: prefixed whole lines from every child,
// plus the supervisor's own lines, written by one thread behind a bounded queue.
#pragma once

#include <chrono>
#include <condition_variable>
#include <array>
#include <deque>
#include <map>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "launcher/control/control.h"
#include "launcher/console/line_dedup.h"
#include "launcher/console/live_view.h"

namespace dflash {

enum class ColorMode { kAuto, kAlways, kNever };

/// kAuto: colour only if the console is a TTY, NO_COLOR is unset or empty
/// (https://no-color.org) and TERM is not "dumb". Pure, so tests need no TTY.
bool ResolveColor(ColorMode mode, bool is_tty, const char* no_color, const char* term);

/// The same, with isatty(fd) and the process environment.
bool ResolveColor(ColorMode mode, int fd);

/// Writes lines to the console (fd 1 by default) from a thread of its own, so
/// the single-threaded event loop never waits for a slow terminal, a paused
/// pager or a pipe nobody reads. O_NONBLOCK is never set on the console fd: it
/// is shared with the user's shell, which would see EAGAIN afterwards.
///
/// The queue is bounded in bytes. A child's line that does not fit is dropped
/// for the console only (the log file has every byte) and counted per source;
/// once the queue has drained to half, one notice per source says how many
/// lines were skipped and which file has them. Dropping, once it starts, lasts
/// until that low-water mark, so a stalled console yields one notice per
/// stall, not one per line.
///
/// Thread-safety: every public method may be called from any thread, but the
/// router calls them from the loop thread only. Never call any of them in a
/// forked child before exec (the writer thread may hold the lock at fork).
class Console {
 public:
  struct Options {
    int fd = 1;                         // borrowed; never closed, never made non-blocking
    size_t max_queued_bytes = 4 << 20;  // formatted bytes queued or being written
    ColorMode color = ColorMode::kAuto;
    /// The live view (launcher/console/live_view.h): the status block redrawn in place
    /// below the scrolling lines, on change and once a second. Only for a
    /// terminal: the caller decides (a TTY, not --plain, TERM not dumb).
    bool live = false;
    /// Roles whose processes ("drafter:0", "drafter:1", ...) say the same
    /// lines: a line that several of them say within `dedup_window` is printed
    /// once, "[drafter:0-2] line" (launcher/console/line_dedup.h). Their lines
    /// reach the console `dedup_window` late; the log files are untouched.
    /// Empty (or a zero window): every line as it comes.
    std::vector<std::string> dedup_roles = {};
    std::chrono::milliseconds dedup_window{1000};
  };
  using SourceId = int;

  explicit Console(Options options);
  /// Flushes everything queued (this blocks for as long as the console does
  /// not take it: "every line reaches the console before exit"), then joins.
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  /// One child stream: `process` is its name ("drafter:1"), `file_path` is
  /// where its full output is (named in skip notices). Sources are never
  /// removed; there are a handful per attempt.
  SourceId AddSource(std::string_view process, bool is_stderr, std::string_view file_path);

  /// Queues `lines`: zero or more whole lines, each ending in '\n' (a last
  /// piece without one is taken as a line too). Each is written as
  /// "[process] line\n". Returns how many were dropped because the queue was
  /// full; a dropped line is never partly written. A line held to be said once
  /// (Options::dedup_roles) is not dropped here: if it is when it comes out,
  /// dropped_lines() and the skip notice count it.
  size_t EnqueueLines(SourceId source, std::string_view lines);

  /// One line without its '\n' (a partial last line, or a piece of a very long
  /// one). Returns false if it was dropped.
  bool EnqueueLine(SourceId source, std::string_view line);

  /// The supervisor's own text, written as given plus a '\n' if it lacks one.
  /// Never dropped: it bypasses the bound (these lines are rare). While lines
  /// are held to be said once, it waits behind them (at most the window), so
  /// it never comes before what they say.
  void Supervisor(std::string_view text);

  /// Queues the notices for lines skipped so far, then waits until every
  /// queued byte has been written (or the console failed). False on timeout.
  bool Flush(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());

  /// A process's STATUS= text. Shown once: in the live view it is the
  /// process's row; otherwise "[dflash] <process>: <text>", unless the
  /// process's own output says it too (a line of its that contains the text,
  /// within 10 s before, or within 100 ms after: the STATUS= line is held that
  /// long, so the process's own line wins whichever reached us first).
  void StatusText(std::string_view process, std::string_view text);

  /// Ends the live view: erases the block and returns once that is written;
  /// later lines are plain. For the summary at the end of a run.
  void EndLive();
  bool live() const;

  /// The supervisor's latest view of the run (every state change, and at least
  /// once a second while it runs): what a live view draws. Plain mode ignores it.
  void SetStatus(RunStatus status);
  RunStatus status() const;

  bool color() const { return color_; }
  /// Total console lines dropped so far (all sources).
  uint64_t dropped_lines() const;
  /// Bytes queued or being written right now.
  size_t queued_bytes() const;
  /// The first write error on the console fd ("" if none). After one, output
  /// is discarded (the files still have it) instead of blocking the shutdown.
  std::string error() const;

 private:
  /// What was said lately by one process, for StatusText's "say it once".
  struct Said {
    std::string latest_status;
    // Its last few lines of output (a ring whose strings keep their capacity:
    // no allocation per line once warm).
    std::array<std::string, 4> lines;
    std::array<std::chrono::steady_clock::time_point, 4> line_at{};
    size_t next_line = 0;
    std::deque<std::pair<std::string, std::chrono::steady_clock::time_point>> statuses;  // printed, unmatched
    // Not printed yet: a line of the process's own may still say it (then
    // that line is shown and this is not); printed after kStatusHold.
    std::deque<std::pair<std::string, std::chrono::steady_clock::time_point>> held;
  };
  struct Source {
    size_t said = 0;       // index into said_
    int group = -1;        // its role's stream in dedup_ (-1: printed as it comes)
    int member = -1;       // its rank in that role
    std::string name;
    std::string file_path;
    std::string prefix;  // "[name] ", with colour escapes when colour is on
    uint64_t skipped = 0;  // dropped since the last notice
  };

  size_t QueuedLocked() const { return pending_.size() + in_flight_; }
  /// True if `bytes` more may be queued; handles the drop/low-water hysteresis.
  bool RoomLocked(size_t bytes);
  void AppendLineLocked(const Source& s, std::string_view line);
  void AppendLineLocked(const std::string& prefix, std::string_view line);
  /// Queues `line` of source `id` (whole, no '\n'): held in dedup_ if its
  /// role dedups, else now. False if it was dropped (the queue is full).
  bool OfferLocked(SourceId id, std::string_view line);
  /// Prints the dedup_ lines that are due (all if `all`).
  void ReleaseDedupLocked(bool all);
  /// True if `line` repeats a STATUS= text already printed (then it is not).
  bool RepeatsStatusLocked(const Source& s, std::string_view line);
  /// Prints the held STATUS= texts older than the hold (all if `all`).
  void ReleaseHeldLocked(bool all);
  Said& SaidFor(std::string_view process);
  /// The block to draw now (live view), with uptimes advanced to now.
  std::vector<std::string> RenderBlockLocked();
  void AppendNoticesLocked();
  void WakeWriterLocked(bool was_empty);
  void WriterMain();
  /// One live-view turn of the writer: the queued lines above, the block
  /// below. True: loop on (false: stopping, nothing left). Ends the live view
  /// (erases the block) when EndLive() asked or the console stops.
  bool LiveFrameLocked(std::unique_lock<std::mutex>& lock, std::string& batch);
  bool WriteBatch(const std::string& batch);
  /// Writes `bytes` (unless the console is `broken`) with mu_ released, then,
  /// locked again: the first error kept, the batch done, owed skip notices queued.
  void WriteReleased(std::unique_lock<std::mutex>& lock, const std::string& bytes, bool broken);

  const int fd_;
  const size_t max_queued_;
  const bool color_;

  mutable std::mutex mu_;
  std::condition_variable writer_cv_;  // pending_ became non-empty, or stop_
  std::condition_variable idle_cv_;    // a batch was written
  std::string pending_;                // formatted, not yet taken by the writer
  size_t in_flight_ = 0;               // bytes the writer is writing now
  bool dropping_ = false;
  bool stop_ = false;
  uint64_t sources_skipping_ = 0;      // sources with skipped > 0
  uint64_t dropped_total_ = 0;
  std::string error_;
  std::vector<Source> sources_;
  RunStatus status_;
  std::chrono::steady_clock::time_point status_at_{};
  bool live_ = false;
  bool end_live_ = false;     // EndLive() asked; the writer clears the block
  bool status_dirty_ = false; // SetStatus/StatusText since the last frame
  std::vector<Said> said_;
  std::vector<std::string> dedup_roles_;
  std::vector<std::pair<std::string, bool>> groups_;  // dedup_'s groups: role, is_stderr
  LineDedup dedup_;
  size_t held_ = 0;           // STATUS= texts held, over all processes
  LiveScreen screen_;         // writer thread only
  ProcMeter meter_;           // writer thread only
  std::chrono::steady_clock::time_point metered_at_{};
  std::map<int, std::pair<int64_t, double>> metered_;  // pid -> rss, cpu (sampled at most 1 Hz)
  std::vector<std::string> last_block_;
  std::thread writer_;
};

}  // namespace dflash
