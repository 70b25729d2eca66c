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
  // Whole words only: KEY in MONKEY or KEYBOARD, PASS in BYPASS, PAT in PATH, AUTH in AUTHOR are not secrets.
  // AUTH: REDISCLI_AUTH, HF_AUTH; PAT: GH_PAT (a personal access token); DSN: SENTRY_DSN (its key is the URL's
  // user); WEBHOOK: SLACK_WEBHOOK_URL (its path is the secret); SSHPASS: sshpass's variable.
  for (std::string_view exact : {"KEY", "PASS", "APIKEY", "AUTH", "PAT", "DSN", "WEBHOOK", "WEBHOOKS", "SSHPASS",
                                 "COOKIE"})
    if (w == exact) return true;
  // Compounds too (GITHUBTOKEN, DBPASSWORD). No TOKENS or KEYS: MAX_TOKENS, NUM_KEYS are counts.
  static constexpr std::array<std::string_view, 13> kEndings = {
      "TOKEN",      "SECRET",      "SECRETS", "PASSWORD",      "PASSWORDS", "PASSWD",    "PASSPHRASE",
      "CREDENTIAL", "CREDENTIALS", "JWT",     "AUTHORIZATION", "ACCESSKEY", "PRIVATEKEY"};
  for (std::string_view e : kEndings)
    if (EndsWith(w, e)) return true;
  return false;
}

/// Names of `key=value` parts whose value is a secret whatever the variable is called: an Azure connection
/// string's AccountKey/SharedAccessKey/SharedAccessSignature, ODBC's Pwd, a SAS URL's sig, plus every
/// secret-looking name (?token=, &access_token=, password= of a libpq DSN).
bool IsSecretParam(std::string_view name) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (std::string_view k : {"ACCOUNTKEY", "SHAREDACCESSKEY", "SHAREDACCESSSIGNATURE", "PWD", "SIG", "CODE"})
    if (up == k) return true;
  return IsSecretEnvName(name);
}

bool IsParamChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }

/// `text` with the value of every `name=value` whose name is secret (IsSecretParam) replaced by "***": a
/// part starts the text or follows one of `?&;` or white space, its value ends at one of `&;#` or white space.
std::string RedactSecretParams(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const bool starts = i == 0 || std::string_view("?&; \t").find(text[i - 1]) != std::string_view::npos;
    size_t j = i;
    while (starts && j < text.size() && IsParamChar(text[j])) ++j;
    if (starts && j > i && j < text.size() && text[j] == '=' && IsSecretParam(text.substr(i, j - i))) {
      size_t end = j + 1;
      while (end < text.size() && std::string_view("&;# \t\n").find(text[end]) == std::string_view::npos) ++end;
      out.append(text.substr(i, j + 1 - i));
      if (end > j + 1) out += kRedactedUrlPassword;
      i = end;
      continue;
    }
    out += text[i++];
  }
  return out;
}

/// A webhook's path is its secret (https://hooks.slack.com/services/T0/B0/XXXX, discord.com/api/webhooks/1/x):
/// a URL whose host starts with "hooks." or whose path has a "webhook" part keeps only "/***" of its path.
std::string RedactWebhookPaths(std::string_view text) {
  std::string out;
  size_t done = 0;
  for (size_t sep = text.find("://"); sep != std::string_view::npos; sep = text.find("://", sep + 3)) {
    size_t host = sep + 3, slash = host;
    while (slash < text.size() && text[slash] != '/' && !std::isspace(static_cast<unsigned char>(text[slash])))
      ++slash;
    if (slash >= text.size() || text[slash] != '/') continue;
    size_t end = slash;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    std::string lower;
    for (size_t k = host; k < end; ++k) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(text[k])));
    const bool hook = lower.rfind("hooks.", 0) == 0 || lower.find("/webhook") != std::string::npos;
    if (!hook || end == slash + 1) continue;
    out.append(text.substr(done, slash + 1 - done));
    out += kRedactedUrlPassword;
    done = end;
    sep = end - 3;  // the next URL starts after this one
  }
  out.append(text.substr(done));
  return out;
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

std::string RedactSecretsInText(std::string_view text) {
  return RedactWebhookPaths(RedactSecretParams(RedactUrlCredentials(text)));
}

std::string RedactEnvValue(std::string_view name, std::string_view value) {
  if (!value.empty() && IsSecretEnvName(name)) return kRedacted;
  return RedactSecretsInText(value);
}

}  // namespace dflash
