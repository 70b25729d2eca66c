// The cells of the run's summary tables (summary_json.cc, training_report.cc): one padding, one way to say seconds.
#pragma once

#include <cstdio>
#include <string>

namespace dflash {

/// Left-aligned in `n` columns, and always at least one space after it.
inline std::string Pad(std::string s, size_t n) {
  s.append(s.size() < n ? n - s.size() : 1, ' ');
  return s;
}

/// "12.3s" under a minute, else whole minutes and seconds ("1m59s" for 119.6 s: never "1m60s").
inline std::string Seconds(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return buf;
}

}  // namespace dflash
