// What the launcher shows of an environment value (docs/config.md, "Secrets in env"): `check`, `check
// --json` and anything else written about the plan go through here, the processes get the real value.
// Pure string functions: no I/O, no state.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dflash {

/// What a whole secret value is shown as.
inline constexpr char kRedacted[] = "<redacted>";
/// What the password of a URL's `user:password@` is shown as.
inline constexpr char kRedactedUrlPassword[] = "***";

/// Whether a variable's name says its value is a secret. The name is cut into words at every character
/// that is not a letter or digit (`_`, `-`, `.`) and where a lower-case letter meets an upper-case one
/// (`hfToken`); case does not matter. A secret name has a word that is KEY, PASS, APIKEY, AUTH, PAT, DSN,
/// WEBHOOK(S), SSHPASS, COOKIE, PW, PWD, CRED or CREDS, or that ends in TOKEN, SECRET(S), PASSWORD(S), PASSWD,
/// PASSPHRASE, CREDENTIAL(S), JWT, AUTHORIZATION or a KEY compound (ACCESSKEY, PRIVATEKEY, SECRETKEY,
/// SESSIONKEY, SIGNINGKEY, ...): HF_TOKEN, hf_token, WANDB_API_KEY, DB_PASS, MYSQL_PWD, DB_PW, DB_CREDS,
/// SECRETKEY, GITHUBTOKEN, REDISCLI_AUTH, GH_PAT, CI_JOB_JWT, SENTRY_DSN, SLACK_WEBHOOK_URL; not KEYBOARD,
/// MONKEY_PATCH, TOKENIZERS_PARALLELISM, MAX_TOKENS, PATH, AUTHOR, nor PWD and OLDPWD (the shell's directories).
bool IsSecretEnvName(std::string_view name);

/// `text` with the password of every `scheme://user:password@host` in it replaced by "***"
/// (`postgres://u:***@h/db`), and a user without a password, which is then the credential
/// (`https://TOKEN@github.com`), too (`https://***@github.com`). The authority ends at the first '/', '?', '#' or white space after "://",
/// as RFC 3986 has it, so an '@' in a path is left alone; its last '@' ends the user part, so an
/// unencoded '@' in a password is hidden too.
std::string RedactUrlCredentials(std::string_view text);

/// `text` with every secret that a value can carry whatever its variable is called hidden as "***": URL
/// passwords (RedactUrlCredentials), the values of secret-named `name=value` parts (`?token=`,
/// `&access_token=`, `password=` of a libpq DSN, Azure's `AccountKey=`/`SharedAccessSignature=`, ODBC's
/// `Pwd=`, a SAS URL's `sig=`), a webhook URL's path (host `hooks.*`, or a `/webhook` in the path), and by
/// value: a word shaped like a well-known token (GitHub ghp_/github_pat_, GitLab glpat-, Hugging Face hf_,
/// OpenAI-style sk-, Slack xox?-, npm_, AWS AKIA/ASIA, a JWT), what follows "Bearer " or "Basic ", and a
/// long high-entropy word (32+ characters of a base62/base64 alphabet; hex hashes and UUIDs stay visible).
/// Also for what is not an environment value: a probe URL as `check` and the reasons show it.
std::string RedactSecretsInText(std::string_view text);

/// What to show for `name=value`: "<redacted>" for a non-empty value of a secret name (an empty one is
/// nothing to hide, and worth seeing), else RedactSecretsInText(value).
std::string RedactEnvValue(std::string_view name, std::string_view value);

/// What to show of a command line: each word through RedactSecretsInText, and the word after a flag with a
/// secret name (`--hf-token X`, `-password X`; `--token=X` is a secret param already) as "***".
std::vector<std::string> RedactArgv(const std::vector<std::string>& argv);

}  // namespace dflash
