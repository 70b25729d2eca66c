#include "common/redact.h"

#include <array>
#include <cctype>

namespace dflash {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// One word of a name, upper-cased.
bool IsSecretWord(std::string_view w) {
  // Whole words only: KEY in MONKEY or KEYBOARD, PASS in BYPASS, are not secrets.
  for (std::string_view exact : {"KEY", "PASS", "APIKEY"})
    if (w == exact) return true;
  // Compounds too (GITHUBTOKEN, DBPASSWORD). No TOKENS or KEYS: MAX_TOKENS, NUM_KEYS are counts.
  static constexpr std::array<std::string_view, 9> kEndings = {
      "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS"};
  for (std::string_view e : kEndings)
    if (EndsWith(w, e)) return true;
  return false;
}

bool IsAlnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

}  // namespace

bool IsSecretEnvName(std::string_view name) {
  std::string word;
  for (size_t i = 0; i <= name.size(); ++i) {
    const bool end = i == name.size();
    const bool camel_break = !end && i > 0 && std::islower(static_cast<unsigned char>(name[i - 1])) &&
                             std::isupper(static_cast<unsigned char>(name[i]));
    if (end || !IsAlnum(name[i]) || camel_break) {
      if (!word.empty() && IsSecretWord(word)) return true;
      word.clear();
    }
    if (!end && IsAlnum(name[i])) word += static_cast<char>(std::toupper(static_cast<unsigned char>(name[i])));
  }
  return false;
}

std::string RedactUrlCredentials(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t done = 0;  // text[0, done) is in `out`
  for (size_t sep = text.find("://"); sep != std::string_view::npos; sep = text.find("://", sep)) {
    const size_t start = sep + 3;
    size_t end = start;
    while (end < text.size() && std::string_view("/?#").find(text[end]) == std::string_view::npos &&
           !std::isspace(static_cast<unsigned char>(text[end])))
      ++end;
    const std::string_view authority = text.substr(start, end - start);
    const size_t at = authority.rfind('@');
    const size_t colon = at == std::string_view::npos ? at : authority.substr(0, at).find(':');
    if (colon != std::string_view::npos && colon + 1 < at) {
      out.append(text.substr(done, start + colon + 1 - done));
      out += kRedactedUrlPassword;
      done = start + at;  // from the '@' on
    }
    sep = start;  // not `end`: "a://h,b://u:p@h2" has the next "://" at the authority's last ':'
  }
  out.append(text.substr(done));
  return out;
}

std::string RedactEnvValue(std::string_view name, std::string_view value) {
  if (!value.empty() && IsSecretEnvName(name)) return kRedacted;
  return RedactUrlCredentials(value);
}

}  // namespace dflash
