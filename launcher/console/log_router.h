// Moves a child's stdout/stderr from its pipe to its log file (every byte, in
// order) and to the console (whole prefixed lines, droppable when slow).
#pragma once

#include "common/private_files.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/fd.h"
#include "launcher/console/console.h"

namespace dflash {

/// Used by the supervisor's event loop, from that thread only. The loop owns
/// epoll; the router owns the read ends and the files. Per readable event:
///
///   if (!router.OnReadable(id)) { epoll_ctl(DEL, router.fd(id)); router.Remove(id); }
///
/// The file path is one `read` (<= 64 KiB) -> one `write`, no per-line work;
/// the console path splits lines and hands them to the Console, which never
/// blocks this thread.
class LogRouter {
 public:
  struct Options {
    /// Read buffer; also what one read may move at most.
    size_t read_bytes = 64 << 10;
    /// A console line longer than this is written in pieces of this size
    /// (each with the prefix), so one huge line cannot pin memory. The file
    /// is not affected.
    size_t max_console_line = 64 << 10;
    /// Reads per OnReadable call while the pipe keeps filling the buffer:
    /// bounds the time one chatty child holds the loop.
    int max_reads_per_event = 4;
    /// Drain() returns after this much even without EAGAIN: a grandchild that
    /// holds the pipe and keeps writing must not keep the loop here forever.
    uint64_t max_drain_bytes = 64 << 20;
    /// How a log file and its attempt dir are made (common/private_files.h):
    /// private by default; never through a link or into someone else's file.
    FileMode files;
  };

  /// `console` may be null (files only); it must outlive the router.
  explicit LogRouter(Console* console);
  LogRouter(Console* console, Options options);
  /// Finishes any stream still open (partial line to the console, file closed).
  ~LogRouter();
  LogRouter(const LogRouter&) = delete;
  LogRouter& operator=(const LogRouter&) = delete;

  /// Takes `pipe` (a read end; made O_NONBLOCK and FD_CLOEXEC if it is not)
  /// and opens `file_path` for appending as common/private_files.h does
  /// (Options::files; its attempt dir made likewise; never through a link or
  /// into a file that is not ours). `process` ("drafter:1") is the console prefix.
  /// Returns the stream id (>= 0). A file that cannot be opened (no inodes, no
  /// fds, the dir swapped for a file) does not end the stream: the pipe is
  /// still read, to the console only, so the child never dies of SIGPIPE; `err`
  /// and file_error() say why, file_lost_bytes() counts what the file missed.
  /// -1 (with `err`; `pipe` closed) only if the pipe itself cannot be used.
  int Add(UniqueFd pipe, const std::string& process, bool is_stderr, const std::string& file_path,
          std::string* err);
  /// The same with a file the caller opened (`file_path` names it in messages).
  int Add(UniqueFd pipe, const std::string& process, bool is_stderr, const std::string& file_path, UniqueFd file,
          std::string* err);

  /// Reads what the pipe has (up to max_reads_per_event reads). Returns true
  /// while the stream is open; false at EOF or on a read error, after the
  /// partial last line went to the console and the file was closed. The pipe
  /// fd stays open until Remove(), so the caller can still epoll_ctl(DEL) it.
  bool OnReadable(int id);

  /// Reads until the pipe is empty (EAGAIN) or at EOF: for a child that has
  /// exited, so nothing it wrote is left behind. Same result as OnReadable.
  /// A grandchild holding the pipe's write end means EOF may never come; this
  /// returns at EAGAIN regardless, or after max_drain_bytes (true: still open).
  bool Drain(int id);

  /// Ends the stream at EOF semantics (if still open) and closes the pipe.
  /// The id is invalid afterwards.
  void Remove(int id);

  /// REQUIRES for the accessors: `id` came from Add() and was not Remove()d.
  int fd(int id) const;
  bool open(int id) const;
  /// Bytes read from the pipe (all of which were offered to the file).
  uint64_t bytes(int id) const;
  /// Lines seen: newlines, plus one for a partial last line at EOF.
  uint64_t lines(int id) const;
  /// Console lines (a piece of a long line counts as one) dropped as too slow.
  uint64_t console_dropped(int id) const;
  /// Bytes the file did not take (disk full, I/O error); "" / 0 if none.
  uint64_t file_lost_bytes(int id) const;
  const std::string& file_error(int id) const;

 private:
  struct Stream;

  Stream& Get(int id) const;
  /// 1: data, 0: EOF/error (stream finished), -1: EAGAIN.
  int ReadOnce(Stream& s);
  void ToFile(Stream& s, const char* p, size_t n);
  void ToConsole(Stream& s, const char* p, size_t n);
  void ConsoleLine(Stream& s, std::string_view line);
  void ConsoleLines(Stream& s, std::string_view lines);
  void Finish(Stream& s);

  Console* const console_;
  const Options options_;
  std::vector<char> buf_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

}  // namespace dflash
