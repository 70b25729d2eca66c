#include "launcher/config/toml_guard.h"

#include <cstdio>
#include <string>

namespace dflash {
namespace {

// Length of the UTF-8 sequence at text[i], or 0 if it is malformed.
size_t Utf8Length(std::string_view t, size_t i) {
  unsigned char c = static_cast<unsigned char>(t[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > t.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(t[i + k]) & 0xC0) != 0x80) return 0;
  return n;
}

std::string CodePoint(std::string_view t, size_t i, size_t n) {
  unsigned cp = static_cast<unsigned char>(t[i]) & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(t[i + k]) & 0x3F);
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", cp);
  return buf;
}

enum class State { kNormal, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };

}  // namespace

bool ScreenTomlText(std::string_view t, int* line, int* col, std::string* message, std::string* hint) {
  std::string ignored;
  if (!hint) hint = &ignored;
  *hint = "non-ASCII text belongs in \"quoted strings\" or # comments";
  State s = State::kNormal;
  int brackets = 0;  // [ and { open around here
  int dots = 0;      // dots of the key (or float) being read: a dotted key nests one table per part
  int ln = 1, cl = 1;
  bool after_backslash = false;  // in a multi-line basic string, right after '\'
  bool continuation = false;     // after a line-ending backslash, before the next non-blank
  for (size_t i = 0; i < t.size();) {
    size_t n = Utf8Length(t, i);
    if (n == 0) {
      *line = ln, *col = cl;
      *message = "not valid UTF-8 (byte 0x" + std::string(1, "0123456789abcdef"[(t[i] >> 4) & 15]) +
                 std::string(1, "0123456789abcdef"[t[i] & 15]) + "); save the file as UTF-8";
      return false;
    }
    char c = t[i];
    bool ascii = n == 1;
    auto reject = [&](const std::string& why) {
      *line = ln, *col = cl;
      *message = "character " + CodePoint(t, i, n) + " " + why;
      return false;
    };
    auto starts = [&](const char* p) { return t.substr(i, 3) == p; };
    size_t adv = n;
    switch (s) {
      case State::kNormal:
        if (!ascii) return reject("outside a string or comment (TOML keys and values are ASCII; quote it)");
        if (c == '[' || c == '{') ++brackets, dots = 0;
        else if (c == ']' || c == '}') brackets = brackets > 0 ? brackets - 1 : 0, dots = 0;
        else if (c == '.') ++dots;
        else if (c == '\n' || c == '=' || c == ',') dots = 0;
        if (brackets + dots > kMaxTomlNesting) {
          *line = ln, *col = cl;
          *message = "nested deeper than " + std::to_string(kMaxTomlNesting) +
                     " levels (dotted key parts, [ ] and { }): toml++ would overflow its stack";
          *hint = "a run.toml needs a few levels: split the key, or write a [table] header";
          return false;
        }
        if (c == '#') s = State::kComment;
        else if (starts("\"\"\"")) s = State::kMultiBasic, adv = 3;
        else if (c == '"') s = State::kBasic;
        else if (starts("'''")) s = State::kMultiLiteral, adv = 3;
        else if (c == '\'') s = State::kLiteral;
        break;
      case State::kComment:
        if (c == '\n') s = State::kNormal;
        break;
      case State::kBasic:
        if (c == '\\' && i + 1 < t.size() && t[i + 1] != '\n')
          adv = 1 + Utf8Length(t, i + 1);  // the escaped character (a malformed one is reported next)
        else if (c == '"' || c == '\n')
          s = State::kNormal;
        break;
      case State::kLiteral:
        if (c == '\'' || c == '\n') s = State::kNormal;
        break;
      case State::kMultiBasic:
        if (after_backslash || continuation) {
          bool blank = c == ' ' || c == '\t' || c == '\r' || c == '\n';
          if (!ascii)
            return reject("right after a backslash in a \"\"\" string: toml++ 3.3 cannot parse this safely "
                          "(marzer/tomlplusplus#190); put an ASCII character before it");
          if (after_backslash) {
            after_backslash = false;
            continuation = blank;  // a line-ending backslash skips blanks up to the next text
            break;
          }
          if (blank) break;
          continuation = false;
        }
        if (c == '\\') {
          after_backslash = true;
        } else if (starts("\"\"\"")) {
          size_t q = 3;
          while (q < 5 && i + q < t.size() && t[i + q] == '"') ++q;  // up to two quotes may end the content
          adv = q;
          s = State::kNormal;
        }
        break;
      case State::kMultiLiteral:
        if (starts("'''")) {
          size_t q = 3;
          while (q < 5 && i + q < t.size() && t[i + q] == '\'') ++q;
          adv = q;
          s = State::kNormal;
        }
        break;
    }
    for (size_t k = 0; k < adv && i + k < t.size(); ++k) {
      if (t[i + k] == '\n') {
        ++ln;
        cl = 1;
      } else if ((static_cast<unsigned char>(t[i + k]) & 0xC0) != 0x80) {
        ++cl;  // columns count code points, as toml++ does
      }
    }
    i += adv;
  }
  return true;
}

}  // namespace dflash
