#include "common/redact.h"

#include <array>
#include <cctype>
#include <cmath>
#include <utility>

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
  // PW, PWD: MYSQL_PWD, DB_PW (the name PWD alone is the shell's directory: IsSecretEnvName); CRED(S): DB_CREDS.
  for (std::string_view exact : {"KEY", "PASS", "APIKEY", "AUTH", "PAT", "DSN", "WEBHOOK", "WEBHOOKS", "SSHPASS",
                                 "COOKIE", "PW", "PWD", "CRED", "CREDS"})
    if (w == exact) return true;
  // Compounds too (GITHUBTOKEN, DBPASSWORD, SECRETKEY, SESSIONKEY). No TOKENS or KEYS: MAX_TOKENS, NUM_KEYS are
  // counts; no bare ...KEY ending: MONKEY, HOTKEY, TURKEY are not secrets, so KEY compounds are listed.
  static constexpr std::array<std::string_view, 26> kEndings = {
      "TOKEN",      "SECRET",      "SECRETS",    "PASSWORD",   "PASSWORDS",     "PASSWD",     "PASSPHRASE",
      "CREDENTIAL", "CREDENTIALS", "JWT",        "AUTHORIZATION", "ACCESSKEY", "PRIVATEKEY", "SECRETKEY",
      "SESSIONKEY", "SIGNINGKEY",  "MASTERKEY",  "ENCRYPTIONKEY", "AUTHKEY",   "LICENSEKEY", "CLIENTKEY",
      "SSHKEY",     "DBPASS",      "DBPW",       "DBPWD",         "DBCREDS"};
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

/// A character of a token word: '/' is not one, so a path or a URL is judged piece by piece ("/***" hides only
/// the piece that is a key; a base64 key with a '/' is two pieces, each judged alone).
bool IsTokenChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("_-.+=~").find(c) != std::string_view::npos;
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

/// Whether `w` (a run of token characters) is shaped like a well-known credential: GitHub (ghp_, gho_, ghu_,
/// ghs_, ghr_, github_pat_), GitLab (glpat-), Hugging Face (hf_), OpenAI-style (sk-), Slack (xox?-), npm (npm_),
/// AWS access key ids (AKIA/ASIA + 16), a JWT (eyJ... with two dots).
bool IsTokenShaped(std::string_view w) {
  struct Prefix {
    std::string_view text;
    size_t min_rest;
    bool alnum_rest;  // hf_ + letters: "hf_cache_dir_of_the_models" is a name, not a token
  };
  static constexpr Prefix kPrefixes[] = {
      {"ghp_", 20, true},  {"gho_", 20, true},  {"ghu_", 20, true},  {"ghs_", 20, true},  {"ghr_", 20, true},
      {"github_pat_", 20, false}, {"glpat-", 16, false}, {"hf_", 20, true}, {"sk-", 20, false},
      {"xoxb-", 10, false}, {"xoxp-", 10, false}, {"xoxa-", 10, false}, {"xoxr-", 10, false},
      {"xoxs-", 10, false}, {"xoxe-", 10, false}, {"npm_", 30, true}};
  for (const Prefix& p : kPrefixes) {
    if (!StartsWith(w, p.text) || w.size() < p.text.size() + p.min_rest) continue;
    bool alnum = true;
    for (char c : w.substr(p.text.size())) alnum = alnum && IsAlnum(c);
    if (alnum || !p.alnum_rest) return true;
  }
  if ((StartsWith(w, "AKIA") || StartsWith(w, "ASIA")) && w.size() >= 20) {
    bool upper = true;
    for (char c : w.substr(0, 20)) upper = upper && (std::isupper(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)));
    if (upper) return true;
  }
  if (StartsWith(w, "eyJ") && w.size() >= 20) {
    size_t dots = 0;
    for (char c : w) dots += c == '.';
    if (dots >= 2) return true;
  }
  return false;
}

/// Whether a piece of a value looks random enough to be a key whatever it is called: 32 characters or more of
/// [A-Za-z0-9+=_-], letters and digits, few '_' or '-' (names
/// like LD_LIBRARY_PATH_usr_local_cuda have many), and at least 4.3 bits of entropy a character: a hex hash or
/// a UUID (16 symbols: 4 bits at most) stays visible, a base62/base64 key (about 4.5 and up) does not.
bool IsHighEntropy(std::string_view piece) {
  if (piece.size() < 32) return false;
  size_t digits = 0, letters = 0, seps = 0;
  int counts[256] = {};
  for (char c : piece) {
    unsigned char u = static_cast<unsigned char>(c);
    digits += std::isdigit(u) != 0;
    letters += std::isalpha(u) != 0;
    seps += c == '_' || c == '-';
    ++counts[u];
  }
  if (digits == 0 || letters == 0 || seps * 10 > piece.size()) return false;
  double bits = 0, n = static_cast<double>(piece.size());
  for (int k : counts)
    if (k) bits -= k / n * std::log2(k / n);
  return bits >= 4.3;
}

/// Whether a run of token characters between '/' is a credential: token-shaped, or with a high-entropy piece
/// between '.' or '~' (a path or a dotted name is cut there; a JWT is token-shaped whole).
bool IsCredentialWord(std::string_view w) {
  if (IsTokenShaped(w)) return true;
  size_t start = 0;
  for (size_t i = 0; i <= w.size(); ++i)
    if (i == w.size() || w[i] == '.' || w[i] == '~') {
      if (IsHighEntropy(w.substr(start, i - start))) return true;
      start = i + 1;
    }
  return false;
}

/// `text` with every token-shaped or high-entropy run of token characters, and the credential after a
/// "Bearer " or "Basic " scheme word, replaced by "***".
std::string RedactTokenValues(std::string_view text) {
  std::string out;
  size_t i = 0;
  bool after_scheme = false;
  while (i < text.size()) {
    if (!IsTokenChar(text[i])) {
      out += text[i++];
      continue;
    }
    size_t j = i;
    while (j < text.size() && IsTokenChar(text[j])) ++j;
    std::string_view w = text.substr(i, j - i);
    std::string lower;
    for (char c : w) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    // "***" is what an earlier rule left: not a credential to hide again.
    if (after_scheme || IsCredentialWord(w)) out += kRedactedUrlPassword;
    else out.append(w);
    // "Authorization: Bearer x", "AUTH=Bearer x": whatever follows the scheme word is the credential.
    after_scheme = (lower == "bearer" || lower == "basic" || EndsWith(lower, "=bearer") || EndsWith(lower, "=basic")) &&
                   j < text.size() && text[j] == ' ';
    i = j;
  }
  return out;
}

bool IsQuote(char c) { return c == '"' || c == '\''; }
bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string Lower(std::string_view s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

/// `text` with `hide` (sorted, non-overlapping [begin, end) ranges) each replaced by "***".
std::string HideRanges(std::string_view text, const std::vector<std::pair<size_t, size_t>>& hide) {
  std::string out;
  size_t done = 0;
  for (const auto& [b, e] : hide) {
    if (b < done || e <= b) continue;
    out.append(text.substr(done, b - done));
    out += kRedactedUrlPassword;
    done = e;
  }
  out.append(text.substr(done));
  return out;
}

/// The value of every JSON (or Python dict) member whose key is a secret name: `"password": "x"`,
/// `{'api_key': 'x'}` -> `"password": "***"`. Only a quoted value: a number or `true` under a secret-looking
/// key (`"token_count": 5`) is a count, not a secret.
std::string RedactJsonMembers(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> hide;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!IsQuote(text[i])) continue;
    const char q = text[i];
    size_t key_end = text.find(q, i + 1);
    if (key_end == std::string_view::npos) break;
    std::string_view key = text.substr(i + 1, key_end - i - 1);
    size_t k = key_end + 1;
    while (k < text.size() && IsSpace(text[k])) ++k;
    if (k >= text.size() || text[k] != ':' || key.empty() || key.size() > 64 || !IsSecretParam(key)) {
      i = key_end - 1;  // the closing quote may open the next key
      continue;
    }
    ++k;
    while (k < text.size() && IsSpace(text[k])) ++k;
    // JSON inside a string of its own ("{\"password\": \"x\"}"): the value ends at the next escaped quote.
    const bool escaped = k + 1 < text.size() && text[k] == '\\' && IsQuote(text[k + 1]) && key.back() == '\\';
    if (escaped) ++k;
    if (k >= text.size() || !IsQuote(text[k])) continue;
    const char vq = text[k];
    size_t end = k + 1;
    if (escaped) {
      while (end < text.size() && !(text[end] == vq && text[end - 1] == '\\')) ++end;
      if (end < text.size()) --end;  // the backslash before the quote stays
    } else {
      while (end < text.size() && text[end] != vq) end += text[end] == '\\' ? 2 : 1;
    }
    if (end > text.size()) end = text.size();
    if (end > k + 1) hide.emplace_back(k + 1, end);
    i = end;
  }
  return HideRanges(text, hide);
}

/// Whether `name` is an HTTP header that carries a credential: Authorization, Proxy-Authorization, Cookie, or a
/// secret name with a '-' in it (X-Api-Key, X-Auth-Token, Private-Token). A plain word before a ':' ("key:",
/// "password:" in prose) is not a header.
bool IsSecretHeader(std::string_view name) {
  const std::string l = Lower(name);
  if (l == "authorization" || l == "proxy-authorization" || l == "cookie" || l == "set-cookie") return true;
  return name.find('-') != std::string_view::npos && IsSecretEnvName(name);
}

/// The value of a credential header, `Authorization: Token X` -> `Authorization: Token ***`, `X-Api-Key: X` ->
/// `X-Api-Key: ***`: after an Authorization header's scheme word (Token, Bearer, Basic, Digest, ...), or after
/// the ':' of the others, up to the end of the line or a closing quote.
std::string RedactHeaders(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> hide;
  for (size_t i = 0; i < text.size(); ++i) {
    if (i > 0 && !IsSpace(text[i - 1]) && !IsQuote(text[i - 1])) continue;
    size_t j = i;
    while (j < text.size() && (IsAlnum(text[j]) || text[j] == '-' || text[j] == '_')) ++j;
    if (j == i || j >= text.size() || text[j] != ':' || !IsSecretHeader(text.substr(i, j - i))) continue;
    size_t v = j + 1;
    while (v < text.size() && (text[v] == ' ' || text[v] == '\t')) ++v;
    const std::string header = Lower(text.substr(i, j - i));
    if (header == "authorization" || header == "proxy-authorization") {
      size_t w = v;
      while (w < text.size() && std::isalpha(static_cast<unsigned char>(text[w]))) ++w;
      if (w > v && w < text.size() && text[w] == ' ') {  // a scheme word, then the credential
        v = w;
        while (v < text.size() && text[v] == ' ') ++v;
      }
    }
    size_t end = v;
    while (end < text.size() && text[end] != '\n' && text[end] != '\r' && !IsQuote(text[end])) ++end;
    while (end > v && IsSpace(text[end - 1])) --end;
    if (end > v) hide.emplace_back(v, end);
    i = end > i ? end - 1 : i;
  }
  return HideRanges(text, hide);
}

/// The password of a `.netrc` entry: `machine h login u password X` (or `default login u password X`) ->
/// `password ***`. Only inside an entry, keyword after keyword: "the machine password is x" is prose.
std::string RedactNetrc(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> words;
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && IsSpace(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && !IsSpace(text[j])) ++j;
    if (j > i) words.emplace_back(i, j);
    i = j;
  }
  auto word = [&](size_t k) { return text.substr(words[k].first, words[k].second - words[k].first); };
  std::vector<std::pair<size_t, size_t>> hide;
  for (size_t k = 0; k < words.size(); ++k) {
    size_t at = k;
    if (word(k) == "machine" && k + 1 < words.size()) at = k + 2;
    else if (word(k) == "default") at = k + 1;
    else continue;
    // keyword value pairs until a word that is not a keyword
    while (at + 1 < words.size()) {
      std::string_view kw = word(at);
      if (kw != "login" && kw != "password" && kw != "account" && kw != "port") break;
      if (kw == "password") hide.push_back(words[at + 1]);
      at += 2;
    }
    k = at > k ? at - 1 : k;
  }
  return HideRanges(text, hide);
}

/// The password of `user:pass@host` without a scheme (`rsync u:p@h:/x`, `--dsn=u:p@h`): "u:***@h". Not
/// `user@host`, `git@host:path`, a URL (its own rule), a path (`/a:b@c`), `mailto:a@b`, nor an image digest
/// (`python:3.11@sha256:...`).
std::string RedactBareUserPassword(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> hide;
  for (size_t at = text.find('@'); at != std::string_view::npos; at = text.find('@', at + 1)) {
    size_t start = at;
    while (start > 0 && !IsSpace(text[start - 1]) && !IsQuote(text[start - 1]) &&
           std::string_view("=,;(<>/@").find(text[start - 1]) == std::string_view::npos)
      --start;
    if (start > 0 && (text[start - 1] == '/' || text[start - 1] == '@')) continue;  // a URL's or a path's
    size_t colon = text.find(':', start);
    if (colon == std::string_view::npos || colon >= at || colon == start || colon + 1 == at) continue;
    bool user_ok = true;
    for (size_t k = start; k < colon; ++k)
      user_ok = user_ok && (IsAlnum(text[k]) || std::string_view("._~%+-").find(text[k]) != std::string_view::npos);
    const std::string user = Lower(text.substr(start, colon - start));
    if (!user_ok || user == "mailto" || user == "sip" || user == "sips" || user == "xmpp" || user == "tel") continue;
    const std::string host = Lower(text.substr(at + 1, 7));
    if (at + 1 >= text.size() || !(IsAlnum(text[at + 1]) || text[at + 1] == '[') || host == "sha256:" ||
        host == "sha384:" || host == "sha512:")
      continue;
    if (text.substr(colon + 1, at - colon - 1) != kRedactedUrlPassword) hide.emplace_back(colon + 1, at);
  }
  return HideRanges(text, hide);
}

/// A program whose command line can carry its password: sshpass (`-p X`, `-pX`) and the MySQL/MariaDB clients
/// (`-pX`; their `-p X` asks at a prompt, and X is the database).
enum class PasswordFlag { kNone, kSshpass, kMysql };

PasswordFlag ProgramOf(std::string_view word) {
  while (!word.empty() && IsQuote(word.front())) word.remove_prefix(1);
  size_t slash = word.rfind('/');
  if (slash != std::string_view::npos) word.remove_prefix(slash + 1);
  if (word == "sshpass") return PasswordFlag::kSshpass;
  for (std::string_view m : {"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow", "mysqlcheck",
                             "mysqlslap", "mysqlpump", "mariadb", "mariadb-dump", "mariadb-admin", "mariadb-import",
                             "mariadb-show", "mariadb-check", "mariadb-slap"})
    if (word == m) return PasswordFlag::kMysql;
  return PasswordFlag::kNone;
}

/// Of a command's words, which hold a password given on the command line: for each, the offset its secret
/// starts at (npos: none). sshpass's options end at its first non-option word (its command, whose own `-p`
/// may be a port: `sshpass -p X ssh -p 2222 h`); a MySQL client's words to the next `;`, `&&`, `||` or `|`.
std::vector<size_t> CommandLinePasswords(const std::vector<std::string_view>& words) {
  std::vector<size_t> from(words.size(), std::string_view::npos);
  PasswordFlag in = PasswordFlag::kNone;
  for (size_t k = 0; k < words.size(); ++k) {
    std::string_view w = words[k];
    if (w == ";" || w == "&&" || w == "||" || w == "|" || w == "&") {
      in = PasswordFlag::kNone;
      continue;
    }
    if (in == PasswordFlag::kSshpass) {
      if (w == "-p" && k + 1 < words.size()) {
        from[++k] = 0;
        continue;
      }
      if (StartsWith(w, "-p") && w.size() > 2) {
        from[k] = 2;
        continue;
      }
      if ((w == "-f" || w == "-d" || w == "-P") && k + 1 < words.size()) {
        ++k;
        continue;
      }
      if (StartsWith(w, "-")) continue;
      in = PasswordFlag::kNone;  // its command: judged as any other word below
    } else if (in == PasswordFlag::kMysql) {
      if (StartsWith(w, "-p") && w.size() > 2 && !IsQuote(w[2])) from[k] = 2;
      continue;
    }
    PasswordFlag p = ProgramOf(w);
    if (p != PasswordFlag::kNone) in = p;
  }
  return from;
}

/// CommandLinePasswords over the white-space separated words of a text (a `sh -c` line, an env value).
std::string RedactCommandLinePasswords(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> spans;
  std::vector<std::string_view> words;
  for (size_t i = 0; i < text.size();) {
    while (i < text.size() && IsSpace(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && !IsSpace(text[j])) ++j;
    if (j > i) {
      spans.emplace_back(i, j);
      words.push_back(text.substr(i, j - i));
    }
    i = j;
  }
  std::vector<size_t> from = CommandLinePasswords(words);
  std::vector<std::pair<size_t, size_t>> hide;
  for (size_t k = 0; k < words.size(); ++k) {
    if (from[k] == std::string_view::npos) continue;
    size_t b = spans[k].first + from[k], e = spans[k].second;
    while (e > b && IsQuote(text[e - 1])) --e;  // the quote that closes a `sh -c '...'` stays
    if (e > b) hide.emplace_back(b, e);
  }
  return HideRanges(text, hide);
}

}  // namespace

bool IsSecretEnvName(std::string_view name) {
  if (name == "PWD" || name == "OLDPWD") return false;  // the shell's working directories, not passwords
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
    } else if (at != std::string_view::npos && at > 0 && colon != 0) {
      // A user and no password ("https://TOKEN@host", "https://TOKEN:@host"): the user is the credential.
      const size_t user_end = colon == std::string_view::npos ? at : colon;
      out.append(text.substr(done, start - done));
      out += kRedactedUrlPassword;
      done = start + user_end;
    }
    sep = start;  // not `end`: "a://h,b://u:p@h2" has the next "://" at the authority's last ':'
  }
  out.append(text.substr(done));
  return out;
}

std::string RedactSecretsInText(std::string_view text) {
  std::string t = RedactBareUserPassword(RedactUrlCredentials(text));
  t = RedactNetrc(RedactHeaders(RedactJsonMembers(t)));
  return RedactTokenValues(RedactWebhookPaths(RedactSecretParams(RedactCommandLinePasswords(t))));
}

std::string RedactEnvValue(std::string_view name, std::string_view value) {
  if (!value.empty() && IsSecretEnvName(name)) return kRedacted;
  return RedactSecretsInText(value);
}

std::vector<std::string> RedactArgv(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  std::vector<size_t> password_from = CommandLinePasswords(std::vector<std::string_view>(argv.begin(), argv.end()));
  bool next_is_secret = false;
  for (size_t k = 0; k < argv.size(); ++k) {
    const std::string& a = argv[k];
    if (next_is_secret && !a.empty()) out.emplace_back(kRedactedUrlPassword);
    else if (password_from[k] != std::string::npos) out.push_back(a.substr(0, password_from[k]) + kRedactedUrlPassword);
    else out.push_back(RedactSecretsInText(a));
    next_is_secret = a.size() > 1 && a[0] == '-' && a.find('=') == std::string::npos && IsSecretEnvName(a);
  }
  return out;
}

}  // namespace dflash
