#include "launcher/console/log_router.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dflash {

struct LogRouter::Stream {
  UniqueFd pipe;
  UniqueFd file;
  std::string path;
  Console::SourceId source = -1;
  bool open = true;
  bool ends_with_newline = true;  // of what was read so far; "" counts as ended
  std::string partial;            // console only: the line not yet ended
  uint64_t bytes = 0;
  uint64_t lines = 0;
  uint64_t dropped = 0;
  uint64_t lost = 0;
  std::string file_error;
};

LogRouter::LogRouter(Console* console) : LogRouter(console, Options{}) {}

LogRouter::LogRouter(Console* console, Options options)
    : console_(console), options_(options), buf_(std::max<size_t>(options.read_bytes, 1)) {}

LogRouter::~LogRouter() {
  for (auto& s : streams_) {
    if (s && s->open) Finish(*s);
  }
}

namespace {

// The read end is ours alone (unlike the console), so non-blocking is safe
// here and is what lets one event read "what there is" and return.
bool SetPipeFlags(int pipe, const std::string& process, std::string* err) {
  int fl = ::fcntl(pipe, F_GETFL);
  if (fl < 0 || (!(fl & O_NONBLOCK) && ::fcntl(pipe, F_SETFL, fl | O_NONBLOCK) != 0)) {
    if (err) *err = ErrnoMessage("fcntl(O_NONBLOCK) on the pipe of " + process, errno);
    return false;
  }
  int fdfl = ::fcntl(pipe, F_GETFD);
  if (fdfl < 0 || (!(fdfl & FD_CLOEXEC) && ::fcntl(pipe, F_SETFD, fdfl | FD_CLOEXEC) != 0)) {
    if (err) *err = ErrnoMessage("fcntl(FD_CLOEXEC) on the pipe of " + process, errno);
    return false;
  }
  return true;
}

}  // namespace

int LogRouter::Add(UniqueFd pipe, const std::string& process, bool is_stderr,
                   const std::string& file_path, std::string* err) {
  std::string open_err;
  UniqueFd file(OpenPrivateFile(file_path, O_WRONLY | O_APPEND, options_.files, RunDirUse(), &open_err));
  int id = Add(std::move(pipe), process, is_stderr, file_path, std::move(file), err);
  if (id < 0 || open_err.empty()) return id;
  // No file (inodes or fds exhausted, the attempt dir swapped for something else): the pipe is still read,
  // or the child dies of SIGPIPE at its first write; every byte is counted lost and shown on the console.
  Stream& s = Get(id);
  s.file_error = "cannot open " + file_path + ": " + open_err;
  if (err) *err = open_err;
  return id;
}

int LogRouter::Add(UniqueFd pipe, const std::string& process, bool is_stderr, const std::string& file_path,
                   UniqueFd file, std::string* err) {
  if (!SetPipeFlags(pipe.get(), process, err)) return -1;
  auto s = std::make_unique<Stream>();
  s->pipe = std::move(pipe);
  s->file = std::move(file);
  s->path = file_path;
  if (console_) s->source = console_->AddSource(process, is_stderr, file_path);
  streams_.push_back(std::move(s));
  return static_cast<int>(streams_.size() - 1);
}

LogRouter::Stream& LogRouter::Get(int id) const { return *streams_[static_cast<size_t>(id)]; }

int LogRouter::fd(int id) const { return Get(id).pipe.get(); }
bool LogRouter::open(int id) const { return Get(id).open; }
uint64_t LogRouter::bytes(int id) const { return Get(id).bytes; }
uint64_t LogRouter::lines(int id) const { return Get(id).lines; }
uint64_t LogRouter::console_dropped(int id) const { return Get(id).dropped; }
uint64_t LogRouter::file_lost_bytes(int id) const { return Get(id).lost; }
const std::string& LogRouter::file_error(int id) const { return Get(id).file_error; }

bool LogRouter::OnReadable(int id) {
  Stream& s = Get(id);
  if (!s.open) return false;
  for (int i = 0; i < options_.max_reads_per_event; ++i) {
    int r = ReadOnce(s);
    if (r == 0) return false;
    if (r < 0) break;
    // A short read means the pipe is empty now: skip the EAGAIN round trip.
    if (r < static_cast<int>(buf_.size())) break;
  }
  return true;
}

bool LogRouter::Drain(int id) {
  Stream& s = Get(id);
  uint64_t moved = 0;
  while (s.open) {
    int r = ReadOnce(s);
    if (r == 0) return false;
    if (r < 0) return true;
    moved += static_cast<uint64_t>(r);
    if (moved >= options_.max_drain_bytes) return true;
  }
  return false;
}

void LogRouter::Remove(int id) {
  auto& slot = streams_[static_cast<size_t>(id)];
  if (!slot) return;
  if (slot->open) Finish(*slot);
  slot.reset();
}

int LogRouter::ReadOnce(Stream& s) {
  ssize_t n;
  do {
    n = ::read(s.pipe.get(), buf_.data(), buf_.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
  if (n <= 0) {
    // EOF, or an error a pipe should never give (EIO, EBADF): either way
    // nothing more will come; keep what we have.
    Finish(s);
    return 0;
  }
  const char* p = buf_.data();
  size_t len = static_cast<size_t>(n);
  s.bytes += len;
  s.lines += static_cast<uint64_t>(std::count(p, p + len, '\n'));
  s.ends_with_newline = p[len - 1] == '\n';
  ToFile(s, p, len);
  if (console_) ToConsole(s, p, len);
  return static_cast<int>(len);
}

void LogRouter::ToFile(Stream& s, const char* p, size_t n) {
  if (!s.file) {
    s.lost += n;
    return;
  }
  while (n > 0) {
    ssize_t w = ::write(s.file.get(), p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      // Disk full or I/O error: the pipe must still be read (or the child
      // blocks), so these bytes are counted as lost and the next chunk tries
      // again. Said once on the console; the file is then visibly incomplete.
      int e = w < 0 ? errno : ENOSPC;
      if (s.file_error.empty()) {
        s.file_error = ErrnoMessage("write(" + s.path + ")", e);
        if (console_) {
          console_->Supervisor("[dflash] " + s.file_error + "; this log misses output from byte " +
                               std::to_string(s.bytes - n) + " on");
        }
      }
      s.lost += n;
      return;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void LogRouter::ToConsole(Stream& s, const char* p, size_t n) {
  const char* end = p + n;
  const size_t limit = std::max<size_t>(options_.max_console_line, 1);
  // Appends bytes of the current, unfinished line; a line that outgrows the
  // limit goes out in pieces. Emitting only when a byte beyond the limit
  // exists keeps a line of exactly `limit` bytes whole.
  auto hold = [&](const char* a, size_t len) {
    while (len > 0) {
      size_t room = limit - s.partial.size();
      if (len <= room) {
        s.partial.append(a, len);
        return;
      }
      s.partial.append(a, room);
      ConsoleLine(s, s.partial);
      s.partial.clear();
      a += room;
      len -= room;
    }
  };
  if (!s.partial.empty()) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', n));
    hold(p, static_cast<size_t>((nl ? nl : end) - p));
    if (!nl) return;
    ConsoleLine(s, s.partial);
    s.partial.clear();
    p = nl + 1;
  }
  if (p < end) {
    const char* last = static_cast<const char*>(::memrchr(p, '\n', static_cast<size_t>(end - p)));
    if (last) {
      ConsoleLines(s, std::string_view(p, static_cast<size_t>(last + 1 - p)));
      p = last + 1;
    }
  }
  if (p < end) hold(p, static_cast<size_t>(end - p));
}

void LogRouter::ConsoleLine(Stream& s, std::string_view line) {
  if (!console_->EnqueueLine(s.source, line)) ++s.dropped;
}

void LogRouter::ConsoleLines(Stream& s, std::string_view lines) {
  const size_t limit = std::max<size_t>(options_.max_console_line, 1);
  // Common case: no line in the block can exceed the limit; one call, one lock.
  if (lines.size() <= limit + 1) {
    s.dropped += console_->EnqueueLines(s.source, lines);
    return;
  }
  size_t run = 0;  // start of the lines not yet handed over
  size_t pos = 0;
  while (pos < lines.size()) {
    size_t nl = lines.find('\n', pos);  // every line in the block ends in '\n'
    if (nl - pos > limit) {
      if (run < pos) s.dropped += console_->EnqueueLines(s.source, lines.substr(run, pos - run));
      for (size_t a = pos; a < nl; a += limit) {
        ConsoleLine(s, lines.substr(a, std::min(limit, nl - a)));
      }
      run = nl + 1;
    }
    pos = nl + 1;
  }
  if (run < lines.size()) s.dropped += console_->EnqueueLines(s.source, lines.substr(run));
}

void LogRouter::Finish(Stream& s) {
  if (!s.open) return;
  s.open = false;
  if (console_ && !s.partial.empty()) ConsoleLine(s, s.partial);  // '\n' added on the console only
  s.partial.clear();
  s.partial.shrink_to_fit();
  if (!s.ends_with_newline) ++s.lines;
  s.file.reset();
}

}  // namespace dflash
