#include "worker/output_relay.h"

#include "common/fd.h"

namespace dflash {
namespace {

/// A partial line longer than this is written out anyway: a payload that
/// prints megabytes without a newline must not grow the host's memory.
constexpr size_t kMaxHeldBytes = 64 * 1024;
/// Lines longer than this are matched on their first kMaxLineBytes only.
constexpr size_t kMaxLineBytes = 1024 * 1024;

}  // namespace

OutputRelay::OutputRelay(int out_fd, std::function<void(std::string_view)> on_line)
    : out_fd_(out_fd), on_line_(std::move(on_line)), lines_on_(static_cast<bool>(on_line_)) {}

void OutputRelay::Write(std::string_view data) {
  if (data.empty()) return;
  if (out_ok_) {
    std::string err;
    out_ok_ = WriteAll(out_fd_, data, &err);
  }
  if (out_ok_) written_ += data.size();
}

void OutputRelay::Feed(std::string_view data) {
  unwritten_.append(data);
  size_t cut = unwritten_.find_last_of("\n\r");
  if (cut != std::string::npos) {
    Write(std::string_view(unwritten_).substr(0, cut + 1));
    unwritten_.erase(0, cut + 1);
  }
  if (unwritten_.size() > kMaxHeldBytes) {
    Write(unwritten_);
    unwritten_.clear();
  }

  while (!data.empty() && lines_on_) {
    size_t nl = data.find('\n');
    std::string_view part = data.substr(0, nl);
    if (line_.size() < kMaxLineBytes)
      line_.append(part.substr(0, kMaxLineBytes - line_.size()));
    if (nl == std::string_view::npos) return;
    data.remove_prefix(nl + 1);
    std::string_view line = line_;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    on_line_(line);  // may call StopLines()
    line_.clear();
  }
}

void OutputRelay::Finish() {
  Write(unwritten_);
  unwritten_.clear();
  if (lines_on_ && !line_.empty()) {
    std::string_view line = line_;
    if (line.back() == '\r') line.remove_suffix(1);
    on_line_(line);
  }
  line_.clear();
}

void OutputRelay::StopLines() {
  // Only a flag: this runs inside on_line_, which must not be destroyed mid-call.
  lines_on_ = false;
  line_.clear();
  line_.shrink_to_fit();
}

}  // namespace dflash
