#include "launcher/config/config_error.h"

#include <algorithm>
#include <tuple>

namespace dflash {

std::string SourcePos::ToString() const {
  std::string s = file.empty() ? "<config>" : file;
  if (line > 0) s += ":" + std::to_string(line) + ":" + std::to_string(col);
  return s;
}

std::string ConfigError::Format() const {
  std::string s = pos.ToString() + (warning ? ": warning: " : ": error: ");
  if (!key.empty()) s += key + ": ";
  s += message;
  if (!expected.empty()) s += "\n    expected: " + expected;
  if (!found.empty()) s += "\n    found:    " + found;
  if (!hint.empty()) s += "\n    hint:     " + hint;
  return s;
}

std::string FormatErrors(std::vector<ConfigError> errors) {
  std::stable_sort(errors.begin(), errors.end(), [](const ConfigError& a, const ConfigError& b) {
    return std::tie(a.pos.line, a.pos.col) < std::tie(b.pos.line, b.pos.col);
  });
  std::string out;
  for (const ConfigError& e : errors) {
    if (!out.empty()) out += "\n";
    out += e.Format() + "\n";
  }
  if (errors.size() > 1) out += std::to_string(errors.size()) + " errors; nothing was started.\n";
  else if (errors.size() == 1) out += "nothing was started.\n";
  return out;
}

std::string FormatWarnings(const std::vector<ConfigError>& warnings) {
  std::string out;
  for (const ConfigError& w : warnings) out += w.Format() + "\n";
  return out;
}

}  // namespace dflash
