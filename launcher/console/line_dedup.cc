#include "launcher/console/line_dedup.h"

#include <algorithm>

namespace dflash {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

std::string MaskNumbers(std::string_view line) {
  // Hand-written: std::regex costs microseconds a line, and this runs on every
  // console line of a role with several processes.
  std::string out;
  out.reserve(line.size());
  for (size_t i = 0; i < line.size();) {
    if (!IsDigit(line[i])) {
      out += line[i++];
      continue;
    }
    if (line[i] == '0' && i + 2 < line.size() && (line[i + 1] == 'x' || line[i + 1] == 'X') && IsHex(line[i + 2])) {
      i += 2;
      while (i < line.size() && IsHex(line[i])) ++i;
    } else {
      while (i < line.size() && IsDigit(line[i])) ++i;
    }
    out += '*';
  }
  return out;
}

std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

void LineDedup::Add(int group, int member, int source, std::string_view line, Clock::time_point now) {
  std::string key = std::to_string(group);
  key += '\0';
  key += MaskNumbers(line);
  const uint64_t who = (static_cast<uint64_t>(static_cast<uint32_t>(group)) << 32) | static_cast<uint32_t>(member);
  uint64_t& last = last_seq_[who];
  std::vector<uint64_t>& seqs = open_[key];
  // The oldest held line like this one that is newer than the member's last:
  // joining it keeps the member's own order.
  auto it = std::upper_bound(seqs.begin(), seqs.end(), last);
  if (it != seqs.end()) {
    Line& held = held_[static_cast<size_t>(*it - held_.front().seq)].line;
    held.members.push_back(member);
    held.sources.push_back(source);
    if (held.text != line) held.varied = true;
    last = *it;
    return;
  }
  Held h{next_seq_++, std::move(key), Line{}};
  h.line.group = group;
  h.line.members = {member};
  h.line.sources = {source};
  h.line.text.assign(line);
  h.line.first_at = now;
  held_bytes_ += line.size();
  seqs.push_back(h.seq);
  last = h.seq;
  held_.push_back(std::move(h));
}

void LineDedup::AddAfterHeld(std::string_view text, Clock::time_point now) {
  Held h{next_seq_++, std::string(), Line{}};
  h.line.verbatim = true;
  h.line.text.assign(text);
  // Due with the newest held line (FIFO: after it), or at once.
  h.line.first_at = held_.empty() ? now - window_ : held_.back().line.first_at;
  held_bytes_ += text.size();
  held_.push_back(std::move(h));
}

void LineDedup::TakeDue(Clock::time_point now, bool all, std::vector<Line>* out) {
  while (!held_.empty() && (all || held_.size() > max_held_ || held_bytes_ > max_held_bytes_ ||
                             now - held_.front().line.first_at >= window_)) {
    Held& h = held_.front();
    held_bytes_ -= h.line.text.size();
    auto open = h.line.verbatim ? open_.end() : open_.find(h.key);
    if (open != open_.end()) {
      open->second.erase(open->second.begin());  // the oldest of its key: first in its list
      if (open->second.empty()) open_.erase(open);
    }
    out->push_back(std::move(h.line));
    held_.pop_front();
  }
}

LineDedup::Clock::time_point LineDedup::NextDue() const {
  if (held_.empty()) return Clock::time_point::max();
  return held_.front().line.first_at + window_;
}

}  // namespace dflash
