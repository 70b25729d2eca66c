#include "common/duration.h"

#include <cctype>
#include <cstdio>
#include <limits>

namespace dflash {

bool ParseDuration(std::string_view text, Millis* out, std::string* err) {
  if (text == "0") {
    *out = Millis(0);
    return true;
  }
  if (text.empty()) {
    *err = "empty duration";
    return false;
  }
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      std::string compact;
      for (char k : text)
        if (!std::isspace(static_cast<unsigned char>(k))) compact += k;
      *err = "no spaces in durations: write '" + compact + "'";
      return false;
    }
  }
  long long total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    long long n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (n > std::numeric_limits<long long>::max() / 10 - 10) {
        *err = "duration is too large";
        return false;
      }
      n = n * 10 + (text[i] - '0');
      ++i;
    }
    if (i == start) {
      *err = "expected a number at '" + std::string(text.substr(start)) + "'";
      return false;
    }
    size_t ustart = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    std::string_view unit = text.substr(ustart, i - ustart);
    long long scale;
    if (unit == "ms") scale = 1;
    else if (unit == "s") scale = 1000;
    else if (unit == "m") scale = 60'000;
    else if (unit == "h") scale = 3'600'000;
    else if (unit == "d") scale = 86'400'000;
    else if (unit.empty()) {
      *err = "missing unit after " + std::to_string(n) + " (use ms, s, m, h or d)";
      return false;
    } else {
      *err = "unknown unit '" + std::string(unit) + "' (use ms, s, m, h or d)";
      return false;
    }
    if (n > std::numeric_limits<long long>::max() / scale - total) {
      *err = "duration is too large";
      return false;
    }
    total += n * scale;
  }
  *out = Millis(total);
  return true;
}

std::string FormatDuration(Millis d) {
  long long ms = d.count();
  if (ms == 0) return "0";
  std::string s;
  struct Unit { long long scale; const char* name; };
  for (Unit u : {Unit{86'400'000, "d"}, Unit{3'600'000, "h"}, Unit{60'000, "m"}, Unit{1000, "s"},
                 Unit{1, "ms"}}) {
    if (ms >= u.scale) {
      s += std::to_string(ms / u.scale) + u.name;
      ms %= u.scale;
    }
  }
  return s;
}

std::string FormatSeconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  return buf;
}

}  // namespace dflash
