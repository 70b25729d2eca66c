#include "launcher/console/console.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/fd.h"

namespace dflash {
namespace {

/// Hues that read on dark and light terminals; red is left out so that it
/// keeps meaning "error" in the payloads' own output.
constexpr auto kSaidWindow = std::chrono::seconds(10);  // the same fact, said twice this close together
constexpr size_t kSaidLineBytes = 512;
constexpr auto kStatusHold = std::chrono::milliseconds(100);  // a STATUS= waits this long for the line that says it

constexpr const char* kPalette[] = {"32", "33", "34", "35", "36", "92", "93", "94", "95", "96"};

/// FNV-1a: the same name gets the same colour on every run and every build
/// (std::hash promises neither).
uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string MakePrefix(std::string_view name, bool is_stderr, bool color) {
  std::string p;
  if (color) {
    // stderr: same hue in reverse video, so a process keeps its colour and
    // its stderr still stands out.
    p += "\x1b[";
    if (is_stderr) p += "7;";
    p += kPalette[Fnv1a(name) % std::size(kPalette)];
    p += 'm';
  }
  p += '[';
  p += name;
  p += ']';
  if (color) p += "\x1b[0m";
  p += ' ';
  return p;
}

}  // namespace

bool ResolveColor(ColorMode mode, bool is_tty, const char* no_color, const char* term) {
  switch (mode) {
    case ColorMode::kAlways: return true;
    case ColorMode::kNever: return false;
    case ColorMode::kAuto: break;
  }
  if (!is_tty) return false;
  if (no_color != nullptr && no_color[0] != '\0') return false;
  if (term != nullptr && std::strcmp(term, "dumb") == 0) return false;
  return true;
}

bool ResolveColor(ColorMode mode, int fd) {
  return ResolveColor(mode, ::isatty(fd) == 1, std::getenv("NO_COLOR"), std::getenv("TERM"));
}

Console::Console(Options options)
    : fd_(options.fd),
      max_queued_(options.max_queued_bytes),
      color_(ResolveColor(options.color, options.fd)),
      live_(options.live),
      dedup_roles_(options.dedup_window.count() > 0 ? options.dedup_roles : std::vector<std::string>{}),
      dedup_(options.dedup_window) {
  // The writer thread takes no signals: the loop thread owns them (signalfd
  // or ppoll), whatever the mask is when the Console is made. SIGPIPE is
  // thread-directed, so a closed console gives this thread EPIPE instead of
  // killing the supervisor.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  writer_ = std::thread([this] { WriterMain(); });
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

Console::~Console() {
  Flush();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  writer_cv_.notify_all();
  writer_.join();
}

Console::SourceId Console::AddSource(std::string_view process, bool is_stderr,
                                     std::string_view file_path) {
  std::lock_guard<std::mutex> lock(mu_);
  Source s;
  s.name = process;
  s.file_path = file_path;
  s.prefix = MakePrefix(process, is_stderr, color_);
  s.said = static_cast<size_t>(&SaidFor(process) - said_.data());
  // "role:rank" of a role that dedups: its stream joins the role's group.
  const size_t colon = process.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < process.size() && colon + 7 > process.size() &&
      process.find_first_not_of("0123456789", colon + 1) == std::string_view::npos &&
      std::find(dedup_roles_.begin(), dedup_roles_.end(), process.substr(0, colon)) != dedup_roles_.end()) {
    std::pair<std::string, bool> g{std::string(process.substr(0, colon)), is_stderr};
    auto it = std::find(groups_.begin(), groups_.end(), g);
    s.group = static_cast<int>(it - groups_.begin());
    if (it == groups_.end()) groups_.push_back(std::move(g));
    s.member = std::stoi(std::string(process.substr(colon + 1)));
  }
  sources_.push_back(std::move(s));
  return static_cast<SourceId>(sources_.size() - 1);
}

bool Console::RoomLocked(size_t bytes) {
  size_t queued = QueuedLocked();
  if (dropping_) {
    if (queued > max_queued_ / 2) return false;
    dropping_ = false;
  }
  if (queued + bytes > max_queued_) {
    dropping_ = true;
    return false;
  }
  // Room again: the notices go first, exactly where the gap is in each
  // source's sequence (nothing of a skipping source was queued since).
  if (sources_skipping_ != 0) AppendNoticesLocked();
  return true;
}

void Console::AppendLineLocked(const Source& s, std::string_view line) { AppendLineLocked(s.prefix, line); }

void Console::AppendLineLocked(const std::string& prefix, std::string_view line) {
  pending_ += prefix;
  pending_ += line;
  // A child's own colour must not bleed into the next process's line.
  if (color_ && line.find('\x1b') != std::string_view::npos) pending_ += "\x1b[0m";
  pending_ += '\n';
}

void Console::AppendNoticesLocked() {
  for (Source& s : sources_) {
    if (s.skipped == 0) continue;
    pending_ += "[dflash] skipped ";
    pending_ += std::to_string(s.skipped);
    pending_ += " console lines of ";
    pending_ += s.name;
    pending_ += " (console too slow); all are in ";
    pending_ += s.file_path;
    pending_ += '\n';
    s.skipped = 0;
  }
  sources_skipping_ = 0;
}

void Console::WakeWriterLocked(bool was_empty) {
  // The writer sleeps only while pending_ is empty, so only that edge wakes it.
  if (was_empty && !pending_.empty()) writer_cv_.notify_one();
}

size_t Console::EnqueueLines(SourceId id, std::string_view lines) {
  std::lock_guard<std::mutex> lock(mu_);
  Source& s = sources_[static_cast<size_t>(id)];
  const bool was_empty = pending_.empty();
  size_t dropped = 0;
  while (!lines.empty()) {
    size_t nl = lines.find('\n');
    std::string_view line = lines.substr(0, nl);
    lines.remove_prefix(nl == std::string_view::npos ? lines.size() : nl + 1);
    if (RepeatsStatusLocked(s, line)) continue;
    if (!OfferLocked(id, line)) ++dropped;
  }
  WakeWriterLocked(was_empty);
  return dropped;
}

bool Console::EnqueueLine(SourceId id, std::string_view line) {
  std::lock_guard<std::mutex> lock(mu_);
  Source& s = sources_[static_cast<size_t>(id)];
  const bool was_empty = pending_.empty();
  if (RepeatsStatusLocked(s, line)) return true;
  const bool offered = OfferLocked(id, line);
  WakeWriterLocked(was_empty);
  return offered;
}

bool Console::OfferLocked(SourceId id, std::string_view line) {
  Source& s = sources_[static_cast<size_t>(id)];
  if (s.group >= 0) {
    // The writer sleeps without a deadline while nothing is held: the first held line wakes it.
    if (dedup_.held() == 0) writer_cv_.notify_one();
    dedup_.Add(s.group, s.member, id, line, std::chrono::steady_clock::now());
    return true;
  }
  if (!RoomLocked(s.prefix.size() + line.size() + 1)) {
    if (s.skipped++ == 0) ++sources_skipping_;
    ++dropped_total_;
    return false;
  }
  AppendLineLocked(s, line);
  return true;
}

void Console::ReleaseDedupLocked(bool all) {
  if (dedup_.held() == 0) return;
  std::vector<LineDedup::Line> due;
  dedup_.TakeDue(std::chrono::steady_clock::now(), all, &due);
  const bool was_empty = pending_.empty();
  // What each due line prints as: (prefix, text, the source it counts against if dropped).
  struct Out {
    std::string prefix, text;
    size_t source;
  };
  std::vector<Out> outs;
  for (LineDedup::Line& l : due) {
    if (l.verbatim) {  // the supervisor's own: never dropped (see Supervisor())
      outs.push_back({"", std::move(l.text), SIZE_MAX});
      continue;
    }
    const size_t first = static_cast<size_t>(l.sources.front());
    if (l.members.size() == 1) {
      outs.push_back({sources_[first].prefix, std::move(l.text), first});
      continue;
    }
    const std::pair<std::string, bool>& g = groups_[static_cast<size_t>(l.group)];
    std::string prefix = MakePrefix(g.first + ":" + RankRanges(l.members), g.second, color_);
    if (!l.varied) {
      outs.push_back({std::move(prefix), std::move(l.text), first});
      continue;
    }
    // Matched with the numbers masked: every rank's numbers are printed, in rank order, so nobody reads rank
    // 0's loss as everyone's ("step 50 loss 4.11|4.21|4.31").
    std::vector<size_t> order(l.members.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return l.members[a] < l.members[b]; });
    std::vector<std::string> texts;
    for (size_t i : order) texts.push_back(l.texts[i]);
    std::string merged;
    if (MergeNumbers(texts, &merged)) {
      outs.push_back({std::move(prefix), std::move(merged), first});
    } else {  // they do not line up: each rank's own line
      for (size_t i : order) {
        const size_t src = static_cast<size_t>(l.sources[i]);
        outs.push_back({sources_[src].prefix, std::move(l.texts[i]), src});
      }
    }
  }
  for (size_t i = 0; i < outs.size();) {
    Out& o = outs[i];
    // The same line again and again (a wait loop's "waiting for rank 0"): once, with the count, as Ray folds it.
    size_t n = 1;
    while (o.source != SIZE_MAX && i + n < outs.size() && outs[i + n].source != SIZE_MAX &&
           outs[i + n].prefix == o.prefix && outs[i + n].text == o.text)
      ++n;
    i += n;
    if (o.source == SIZE_MAX) {
      pending_ += o.text;
      if (o.text.empty() || o.text.back() != '\n') pending_ += '\n';
      continue;
    }
    if (n > 1) o.text += " [repeated " + std::to_string(n) + "x]";
    if (RoomLocked(o.prefix.size() + o.text.size() + 1)) {
      AppendLineLocked(o.prefix, o.text);
    } else {
      Source& src = sources_[o.source];
      if (src.skipped == 0) ++sources_skipping_;
      src.skipped += n;
      dropped_total_ += n;
    }
  }
  WakeWriterLocked(was_empty);
}

void Console::Supervisor(std::string_view text) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dedup_.held() > 0) {
    // Behind the held lines: "drafter:1 exited with 1" must not come before what drafter:1 said last.
    dedup_.AddAfterHeld(text, std::chrono::steady_clock::now());
    return;
  }
  const bool was_empty = pending_.empty();
  pending_ += text;
  if (text.empty() || text.back() != '\n') pending_ += '\n';
  WakeWriterLocked(was_empty);
}

bool Console::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  ReleaseHeldLocked(true);  // "everything said so far" includes held STATUS= texts
  ReleaseDedupLocked(true);  // and the lines held to be said once
  const bool was_empty = pending_.empty();
  if (sources_skipping_ != 0) AppendNoticesLocked();
  WakeWriterLocked(was_empty);
  auto done = [this] { return QueuedLocked() == 0; };
  if (timeout == std::chrono::milliseconds::max()) {
    idle_cv_.wait(lock, done);
    return true;
  }
  return idle_cv_.wait_for(lock, timeout, done);
}

uint64_t Console::dropped_lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_total_;
}

size_t Console::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return QueuedLocked();
}

std::string Console::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Console::WriterMain() {
  std::string batch;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (live_) {
      // Redraw on change, and once a second for the clocks (uptime, CPU):
      // an idle run costs one wake-up and one small write per second.
      writer_cv_.wait_until(lock, std::min(std::chrono::steady_clock::now() + std::chrono::seconds(1), dedup_.NextDue()),
                            [this] { return !pending_.empty() || stop_ || end_live_ || status_dirty_; });
      if (LiveFrameLocked(lock, batch)) continue;
    } else if (held_ > 0 || dedup_.held() > 0) {
      auto until = dedup_.NextDue();
      if (held_ > 0) until = std::min(until, std::chrono::steady_clock::now() + kStatusHold / 2);
      writer_cv_.wait_until(lock, until, [this] { return !pending_.empty() || stop_; });
      ReleaseHeldLocked(stop_);
      ReleaseDedupLocked(stop_);
      if (pending_.empty() && !stop_) continue;
    } else {
      writer_cv_.wait(lock, [this] { return !pending_.empty() || stop_ || held_ > 0 || dedup_.held() > 0; });
      if (pending_.empty() && !stop_) continue;
    }
    if (pending_.empty()) return;  // stop_, and Flush() already ran
    // Take everything queued in one swap: one write(2) per batch, and the
    // buffers keep their capacity, so a busy console allocates nothing.
    batch.swap(pending_);
    in_flight_ = batch.size();
    const bool broken = !error_.empty();
    WriteReleased(lock, batch, broken);
    batch.clear();
    idle_cv_.notify_all();
  }
}

void Console::WriteReleased(std::unique_lock<std::mutex>& lock, const std::string& bytes, bool broken) {
  lock.unlock();
  std::string err;
  bool ok = broken || bytes.empty() || WriteBatch(bytes);
  if (!ok) err = ErrnoMessage("write(console fd " + std::to_string(fd_) + ")", errno);
  lock.lock();
  if (!ok && error_.empty()) error_ = err;
  in_flight_ = 0;
  // Sources that skipped lines and queued nothing since get their notice
  // now, so a process that went quiet after a burst is not left unexplained.
  if (sources_skipping_ != 0 && QueuedLocked() <= max_queued_ / 2) {
    dropping_ = false;
    AppendNoticesLocked();
  }
}

bool Console::WriteBatch(const std::string& batch) {
  const char* p = batch.data();
  size_t left = batch.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        // Someone else made the shared fd non-blocking; wait instead of spinning.
        pollfd pfd{fd_, POLLOUT, 0};
        ::poll(&pfd, 1, -1);
        continue;
      }
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

namespace {


}  // namespace

Console::Said& Console::SaidFor(std::string_view process) {
  for (size_t i = 0; i < sources_.size(); ++i)
    if (sources_[i].name == process) return said_[sources_[i].said];
  said_.emplace_back();
  return said_.back();
}

bool Console::RepeatsStatusLocked(const Source& s, std::string_view line) {
  Said& said = said_[s.said];
  const auto now = std::chrono::steady_clock::now();
  while (!said.statuses.empty() && now - said.statuses.front().second > kSaidWindow) said.statuses.pop_front();
  for (auto it = said.statuses.begin(); it != said.statuses.end(); ++it) {
    if (line.find(it->first) != std::string_view::npos) {
      said.statuses.erase(it);
      return true;
    }
  }
  // A held STATUS= this line says: the line is shown, the STATUS= is not.
  for (auto it = said.held.begin(); it != said.held.end(); ++it) {
    if (line.find(it->first) != std::string_view::npos) {
      said.held.erase(it);
      --held_;
      return false;
    }
  }
  std::string& slot = said.lines[said.next_line];
  slot.assign(line.substr(0, kSaidLineBytes));
  said.line_at[said.next_line] = now;
  said.next_line = (said.next_line + 1) % said.lines.size();
  return false;
}

void Console::StatusText(std::string_view process, std::string_view text) {
  std::lock_guard<std::mutex> lock(mu_);
  Said* said = nullptr;
  for (size_t i = sources_.size(); i-- > 0;)
    if (sources_[i].name == process) {
      said = &said_[sources_[i].said];
      break;
    }
  if (said == nullptr) {  // no output stream yet (a direct process before its pipes): keep one anyway
    said_.emplace_back();
    said = &said_.back();
    Source s;
    s.name = process;
    s.said = said_.size() - 1;
    s.prefix = MakePrefix(process, false, color_);
    sources_.push_back(std::move(s));
  }
  said->latest_status.assign(text);
  status_dirty_ = true;
  if (live_) {
    writer_cv_.notify_one();
    return;  // the process's row shows it
  }
  const auto now = std::chrono::steady_clock::now();
  if (!text.empty()) {
    for (size_t i = 0; i < said->lines.size(); ++i) {
      if (now - said->line_at[i] <= kSaidWindow && said->lines[i].find(text) != std::string::npos) {
        said->lines[i].clear();  // one line answers one status
        return;
      }
    }
  }
  said->held.emplace_back(std::string(text), now);
  ++held_;
  if (said->held.size() > 8) {  // a flood of STATUS= with no output: print the oldest now
    ReleaseHeldLocked(true);
  }
  writer_cv_.notify_one();  // its clock for the hold starts
}

void Console::ReleaseHeldLocked(bool all) {
  if (held_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const bool was_empty = pending_.empty();
  for (size_t i = 0; i < said_.size(); ++i) {
    Said& said = said_[i];
    while (!said.held.empty() && (all || now - said.held.front().second >= kStatusHold)) {
      std::string text = std::move(said.held.front().first);
      said.held.pop_front();
      --held_;
      const std::string* name = nullptr;
      for (const Source& s : sources_)
        if (s.said == i) {
          name = &s.name;
          break;
        }
      pending_ += "[dflash] ";
      pending_ += name ? *name : "?";
      pending_ += ": ";
      for (char c : text) pending_ += (c == '\n' || c == '\r') ? ' ' : c;
      pending_ += '\n';
      if (!text.empty()) {
        said.statuses.emplace_back(std::move(text), now);
        if (said.statuses.size() > 8) said.statuses.pop_front();
      }
    }
  }
  WakeWriterLocked(was_empty);
}

void Console::SetStatus(RunStatus status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = std::move(status);
  status_at_ = std::chrono::steady_clock::now();
  status_dirty_ = true;
  if (live_) writer_cv_.notify_one();
}

bool Console::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

void Console::EndLive() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!live_) return;
  end_live_ = true;
  writer_cv_.notify_one();
  idle_cv_.wait(lock, [this] { return !live_; });
}

std::vector<std::string> Console::RenderBlockLocked() {
  if (status_.processes.empty() && status_.run_id.empty()) return {};
  RunStatus st = status_;
  const double since = std::chrono::duration<double>(std::chrono::steady_clock::now() - status_at_).count();
  st.uptime_s += since;
  for (ProcessStatus& p : st.processes) {
    if (p.uptime_s > 0 && p.state == "RUNNING") p.uptime_s += since;
    for (const Source& s : sources_)
      if (s.name == p.name && !said_[s.said].latest_status.empty()) {
        p.status = said_[s.said].latest_status;
        break;
      }
    auto m = metered_.find(p.payload_pid > 0 ? p.payload_pid : p.pid);
    if ((p.payload_pid > 0 || p.pid > 0) && m != metered_.end()) {
      p.rss_bytes = m->second.first;
      p.cpu_percent = m->second.second;
    }
  }
  size_t width, height;
  TerminalSize(fd_, &width, &height);  // asked at every frame: a resize needs no SIGWINCH handler
  // Half the screen at most: the output above must stay readable.
  return RenderStatus(st, width, std::max<size_t>(height / 2, 4), color_);
}

RunStatus Console::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

}  // namespace dflash

namespace dflash {

bool Console::LiveFrameLocked(std::unique_lock<std::mutex>& lock, std::string& batch) {
  ReleaseDedupLocked(stop_ || end_live_);
  const bool ending = end_live_ || (stop_ && pending_.empty());
  batch.swap(pending_);
  in_flight_ = batch.size();
  status_dirty_ = false;
  const bool broken = !error_.empty();
  std::vector<std::string> block;
  if (!ending) {
    auto now = std::chrono::steady_clock::now();
    // Once a second, and at once for a process not sampled yet (just started).
    bool unsampled = false;
    for (const ProcessStatus& p : status_.processes)
      if ((p.payload_pid > 0 || p.pid > 0) && !metered_.count(p.payload_pid > 0 ? p.payload_pid : p.pid))
        unsampled = true;
    if (now - metered_at_ >= std::chrono::seconds(1) || (unsampled && now - metered_at_ >= std::chrono::milliseconds(100))) {
      // /proc is read here, off the loop thread, at most once a second.
      RunStatus st = status_;
      lock.unlock();
      meter_.Fill(&st);
      lock.lock();
      metered_.clear();
      for (const ProcessStatus& p : st.processes)
        if ((p.payload_pid > 0 || p.pid > 0) && p.rss_bytes >= 0)
          metered_[p.payload_pid > 0 ? p.payload_pid : p.pid] = {p.rss_bytes, p.cpu_percent};
      metered_at_ = now;
    }
    block = RenderBlockLocked();
  }
  std::string frame;
  // Ending: erase the block, then the last lines plainly where it was.
  if (ending) frame = screen_.Clear() + batch;
  else if (!batch.empty() || block != last_block_) frame = screen_.Frame(batch, block);
  last_block_ = block;
  WriteReleased(lock, frame, broken);
  batch.clear();
  if (ending) {
    live_ = false;
    end_live_ = false;
  }
  idle_cv_.notify_all();
  return true;  // after the end of the live view, the plain path takes over (and returns when stopping)
}

}  // namespace dflash
