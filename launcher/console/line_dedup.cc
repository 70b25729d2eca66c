#include "launcher/console/line_dedup.h"

#include <algorithm>
#include <cctype>

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

namespace {

/// A line cut where MaskNumbers puts its stars: literal text and numbers, alternating.
struct Piece {
  bool number;
  std::string_view text;
};

std::vector<Piece> Pieces(std::string_view line) {
  std::vector<Piece> out;
  size_t lit = 0;
  for (size_t i = 0; i < line.size();) {
    if (!IsDigit(line[i])) {
      ++i;
      continue;
    }
    const size_t start = i;
    if (line[i] == '0' && i + 2 < line.size() && (line[i + 1] == 'x' || line[i + 1] == 'X') && IsHex(line[i + 2])) {
      i += 2;
      while (i < line.size() && IsHex(line[i])) ++i;
    } else {
      while (i < line.size() && IsDigit(line[i])) ++i;
    }
    if (start > lit) out.push_back({false, line.substr(lit, start - lit)});
    out.push_back({true, line.substr(start, i - start)});
    lit = i;
  }
  if (lit < line.size()) out.push_back({false, line.substr(lit)});
  return out;
}

/// What joins two digit runs into one number: "4.11", "1e-05", "2E+3".
bool Joins(std::string_view lit) {
  return lit == "." || lit == "e" || lit == "E" || lit == "e-" || lit == "e+" || lit == "E-" || lit == "E+";
}

/// The pieces grouped into units: a literal, or a whole number with its sign.
/// Decided by the literals alone, so lines with one mask group alike.
std::vector<std::string> Units(std::string_view line, std::vector<bool>* is_number) {
  std::vector<Piece> p = Pieces(line);
  std::vector<std::string> units;
  is_number->clear();
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].number) {
      std::string_view lit = p[i].text;
      // "-0.5" (start, space, '=', '(' before the '-'): the sign is the number's, not the line's.
      bool sign = i + 1 < p.size() && !lit.empty() && lit.back() == '-' &&
                  (lit.size() == 1 ? i == 0 : !std::isalnum(static_cast<unsigned char>(lit[lit.size() - 2])) &&
                                                  lit[lit.size() - 2] != '_' && lit[lit.size() - 2] != '.');
      if (sign) lit.remove_suffix(1);
      if (!lit.empty()) {
        units.emplace_back(lit);
        is_number->push_back(false);
      }
      if (!sign) continue;
      units.emplace_back("-");
      is_number->push_back(true);
      ++i;
    } else {
      units.emplace_back();
      is_number->push_back(true);
    }
    std::string& u = units.back();
    u += p[i].text;
    while (i + 2 < p.size() && Joins(p[i + 1].text) && p[i + 2].number) {
      u += p[i + 1].text;
      u += p[i + 2].text;
      i += 2;
    }
  }
  return units;
}

}  // namespace

bool MergeNumbers(const std::vector<std::string>& texts, std::string* out) {
  out->clear();
  if (texts.empty()) return true;
  std::vector<bool> kinds, other_kinds;
  std::vector<std::vector<std::string>> units;
  for (const std::string& t : texts) {
    units.push_back(Units(t, units.empty() ? &kinds : &other_kinds));
    if (units.size() > 1 && (other_kinds != kinds || units.back().size() != units.front().size())) return false;
  }
  for (size_t u = 0; u < kinds.size(); ++u) {
    const std::string& first = units.front()[u];
    bool alike = true;
    for (const auto& us : units) alike = alike && us[u] == first;
    if (alike) {
      *out += first;
      continue;
    }
    if (!kinds[u]) return false;  // literals that differ: not one line
    for (size_t m = 0; m < units.size(); ++m) {
      if (m > 0) *out += '|';
      *out += units[m][u];
    }
  }
  return true;
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
    Held& h = held_[static_cast<size_t>(*it - held_.front().seq)];
    Line& held = h.line;
    if (!held.varied && held.text != line) {
      held.varied = true;
      held.texts.assign(held.members.size(), held.text);  // the members so far said the first's words
      h.bytes += held.text.size() * held.members.size();
      held_bytes_ += held.text.size() * held.members.size();
    }
    held.members.push_back(member);
    held.sources.push_back(source);
    if (held.varied) {
      held.texts.emplace_back(line);
      h.bytes += line.size();
      held_bytes_ += line.size();
    }
    last = *it;
    return;
  }
  Held h{next_seq_++, std::move(key), Line{}};
  h.line.group = group;
  h.line.members = {member};
  h.line.sources = {source};
  h.line.text.assign(line);
  h.line.first_at = now;
  h.bytes = line.size();
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
  h.bytes = text.size();
  held_bytes_ += text.size();
  held_.push_back(std::move(h));
}

void LineDedup::TakeDue(Clock::time_point now, bool all, std::vector<Line>* out) {
  while (!held_.empty() && (all || held_.size() > max_held_ || held_bytes_ > max_held_bytes_ ||
                             now - held_.front().line.first_at >= window_)) {
    Held& h = held_.front();
    held_bytes_ -= h.bytes;
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
