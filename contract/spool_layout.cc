#include "contract/spool_layout.h"

#include <cstdio>

namespace dflash::spool::layout {
namespace {

/// The digits of `s` as a number; false for an empty string, any other character, or more digits than an
/// int64_t holds for sure (a hostile name must not overflow).
bool Digits(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

std::string Padded(int64_t n) {
  char num[32];
  std::snprintf(num, sizeof num, "%0*lld", kSeqDigits, static_cast<long long>(n));
  return num;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() > suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::string FrameFile(std::string_view producer, int64_t seq) {
  return std::string(producer) + "-" + Padded(seq) + std::string(kFrameExt);
}

bool ParseFrameFile(std::string_view file, std::string* producer, int64_t* seq) {
  if (!EndsWith(file, kFrameExt)) return false;
  std::string_view stem = file.substr(0, file.size() - kFrameExt.size());
  size_t dash = stem.rfind('-');
  if (dash == std::string_view::npos || dash == 0) return false;
  int64_t v = 0;
  if (!Digits(stem.substr(dash + 1), &v)) return false;
  *producer = std::string(stem.substr(0, dash));
  *seq = v;
  return true;
}

std::string PendingName(int64_t position, std::string_view frame) { return Padded(position) + "." + std::string(frame); }

bool ParsePendingName(std::string_view name, int64_t* position, std::string* frame) {
  size_t dot = name.find('.');
  if (dot != 10) return false;
  int64_t v = 0, seq = 0;
  std::string producer;
  if (!Digits(name.substr(0, dot), &v) || !ParseFrameFile(name.substr(dot + 1), &producer, &seq)) return false;
  *position = v;
  *frame = std::string(name.substr(dot + 1));
  return true;
}

std::string EndMarkerFile(std::string_view producer) { return std::string(producer) + std::string(kEndMarkerExt); }

bool ParseEndMarkerFile(std::string_view name, std::string* producer) {
  if (!EndsWith(name, kEndMarkerExt)) return false;
  *producer = std::string(name.substr(0, name.size() - kEndMarkerExt.size()));
  return true;
}

}  // namespace dflash::spool::layout
