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

/// One pass over the text, as toml++ would lex it: each character is read in the
/// state it meets (outside strings, in a comment, in one of the four strings).
class TomlScreen {
 public:
  TomlScreen(std::string_view t, int* line, int* col, std::string* message, std::string* hint)
      : t_(t), line_(line), col_(col), message_(message), hint_(hint) {}

  bool Run() {
    for (size_t i = 0; i < t_.size();) {
      size_t n = Utf8Length(t_, i);
      if (n == 0) {
        *message_ = "not valid UTF-8 (byte 0x" + std::string(1, "0123456789abcdef"[(t_[i] >> 4) & 15]) +
                    std::string(1, "0123456789abcdef"[t_[i] & 15]) + "); save the file as UTF-8";
        return Refuse();
      }
      size_t adv = n;
      if (!Read(i, n, &adv)) return false;
      Advance(i, adv);
      i += adv;
    }
    return true;
  }

 private:
  /// The character at t_[i] (`n` bytes) in state s_: the next state, and in `adv` the bytes it
  /// spans (an escape, a closing """). False: refused (the message is set).
  bool Read(size_t i, size_t n, size_t* adv) {
    char c = t_[i];
    switch (s_) {
      case State::kNormal:
        return ReadNormal(i, n, adv);
      case State::kComment:
        if (c == '\n') s_ = State::kNormal;
        break;
      case State::kBasic:
        if (c == '\\' && i + 1 < t_.size() && t_[i + 1] != '\n')
          *adv = 1 + Utf8Length(t_, i + 1);  // the escaped character (a malformed one is reported next)
        else if (c == '"' || c == '\n')
          s_ = State::kNormal;
        break;
      case State::kLiteral:
        if (c == '\'' || c == '\n') s_ = State::kNormal;
        break;
      case State::kMultiBasic:
        return ReadMultiBasic(i, n, adv);
      case State::kMultiLiteral:
        if (Starts(i, "'''")) {
          *adv = ClosingQuotes(i, '\'');
          s_ = State::kNormal;
        }
        break;
    }
    return true;
  }

  /// Outside strings and comments: ASCII only, nesting bounded; where a string or a comment starts.
  bool ReadNormal(size_t i, size_t n, size_t* adv) {
    char c = t_[i];
    if (n != 1) return RefuseChar(i, n, "outside a string or comment (TOML keys and values are ASCII; quote it)");
    if (c == '[' || c == '{') ++brackets_, dots_ = 0;
    else if (c == ']' || c == '}') brackets_ = brackets_ > 0 ? brackets_ - 1 : 0, dots_ = 0;
    else if (c == '.') ++dots_;
    else if (c == '\n' || c == '=' || c == ',') dots_ = 0;
    if (brackets_ + dots_ > kMaxTomlNesting) {
      *message_ = "nested deeper than " + std::to_string(kMaxTomlNesting) +
                  " levels (dotted key parts, [ ] and { }): toml++ would overflow its stack";
      *hint_ = "a run.toml needs a few levels: split the key, or write a [table] header";
      return Refuse();
    }
    if (c == '#') s_ = State::kComment;
    else if (Starts(i, "\"\"\"")) s_ = State::kMultiBasic, *adv = 3;
    else if (c == '"') s_ = State::kBasic;
    else if (Starts(i, "'''")) s_ = State::kMultiLiteral, *adv = 3;
    else if (c == '\'') s_ = State::kLiteral;
    return true;
  }

  /// In a """multi-line basic string""": ASCII right after a backslash (toml++ 3.3's bug), and its end.
  bool ReadMultiBasic(size_t i, size_t n, size_t* adv) {
    char c = t_[i];
    if (after_backslash_ || continuation_) {
      bool blank = c == ' ' || c == '\t' || c == '\r' || c == '\n';
      if (n != 1)
        return RefuseChar(i, n, "right after a backslash in a \"\"\" string: toml++ 3.3 cannot parse this safely "
                                "(marzer/tomlplusplus#190); put an ASCII character before it");
      if (after_backslash_) {
        after_backslash_ = false;
        continuation_ = blank;  // a line-ending backslash skips blanks up to the next text
        return true;
      }
      if (blank) return true;
      continuation_ = false;
    }
    if (c == '\\') {
      after_backslash_ = true;
    } else if (Starts(i, "\"\"\"")) {
      *adv = ClosingQuotes(i, '"');
      s_ = State::kNormal;
    }
    return true;
  }

  bool Starts(size_t i, const char* p) const { return t_.substr(i, 3) == p; }

  /// The bytes of a closing """ or ''' at t_[i]: up to two quotes more may end the content.
  size_t ClosingQuotes(size_t i, char quote) const {
    size_t q = 3;
    while (q < 5 && i + q < t_.size() && t_[i + q] == quote) ++q;
    return q;
  }

  /// Lines and columns past the `adv` bytes at t_[i].
  void Advance(size_t i, size_t adv) {
    for (size_t k = 0; k < adv && i + k < t_.size(); ++k) {
      if (t_[i + k] == '\n') {
        ++ln_;
        cl_ = 1;
      } else if ((static_cast<unsigned char>(t_[i + k]) & 0xC0) != 0x80) {
        ++cl_;  // columns count code points, as toml++ does
      }
    }
  }

  /// Refused here: the position of the character being read.
  bool Refuse() {
    *line_ = ln_, *col_ = cl_;
    return false;
  }
  bool RefuseChar(size_t i, size_t n, const std::string& why) {
    *message_ = "character " + CodePoint(t_, i, n) + " " + why;
    return Refuse();
  }

  std::string_view t_;
  int* line_;
  int* col_;
  std::string* message_;
  std::string* hint_;
  State s_ = State::kNormal;
  int brackets_ = 0;  // [ and { open around here
  int dots_ = 0;      // dots of the key (or float) being read: a dotted key nests one table per part
  int ln_ = 1, cl_ = 1;
  bool after_backslash_ = false;  // in a multi-line basic string, right after '\'
  bool continuation_ = false;     // after a line-ending backslash, before the next non-blank
};

}  // namespace

bool ScreenTomlText(std::string_view t, int* line, int* col, std::string* message, std::string* hint) {
  std::string ignored;
  if (!hint) hint = &ignored;
  *hint = "non-ASCII text belongs in \"quoted strings\" or # comments";
  return TomlScreen(t, line, col, message, hint).Run();
}

}  // namespace dflash
