#include "common/redact.h"

#include <gtest/gtest.h>

namespace dflash {
namespace {

TEST(Redact, SecretNamesInAnyCaseAndSpelling) {
  for (const char* n : {"HF_TOKEN", "hf_token", "Hf_Token", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "api-key",
                        "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "DB_PASSWORD", "db.password", "MYSQL_PASS",
                        "PGPASSWORD", "GITHUBTOKEN", "ACCESSTOKEN", "hfToken", "MyAPIKey", "APIKEY", "KEY", "TOKEN",
                        "GOOGLE_APPLICATION_CREDENTIALS", "SSH_PASSPHRASE", "CLIENT_SECRETS", "LDAP_PASSWD",
                        "_TOKEN_", "__key"})
    EXPECT_TRUE(IsSecretEnvName(n)) << n;
}

// Issue #38: names the first list missed.
TEST(Redact, AuthPatJwtDsnWebhookAndSshpassNames) {
  for (const char* n : {"REDISCLI_AUTH", "SSHPASS", "CI_JOB_JWT", "CI_JOB_JWT_V2", "AUTHORIZATION", "HTTP_AUTHORIZATION",
                        "GH_PAT", "HF_AUTH", "SENTRY_DSN", "DATABASE_DSN", "SLACK_WEBHOOK_URL", "DISCORD_WEBHOOK",
                        "AZURE_STORAGE_ACCESSKEY", "GCP_PRIVATEKEY", "SESSION_COOKIE"})
    EXPECT_TRUE(IsSecretEnvName(n)) << n;
  for (const char* n : {"AUTHOR", "AUTHOR_NAME", "PATH", "PATCH_LEVEL", "DSNAME", "KILL_SIG", "HOOKS_DIR"})
    EXPECT_FALSE(IsSecretEnvName(n)) << n;
}

// Secrets a value carries whatever its variable is called, and a probe URL's token.
TEST(Redact, SecretParamsConnectionStringsAndWebhookPaths) {
  EXPECT_EQ(RedactSecretsInText("http://127.0.0.1:8080/health?token=abc123&x=1"),
            "http://127.0.0.1:8080/health?token=***&x=1");
  EXPECT_EQ(RedactSecretsInText("https://h/p?a=1&access_token=zz#frag"), "https://h/p?a=1&access_token=***#frag");
  EXPECT_EQ(RedactEnvValue("AZURE_STORAGE_CONNECTION_STRING",
                           "DefaultEndpointsProtocol=https;AccountName=acc;AccountKey=c2VjcmV0;EndpointSuffix=core"),
            "DefaultEndpointsProtocol=https;AccountName=acc;AccountKey=***;EndpointSuffix=core");
  EXPECT_EQ(RedactEnvValue("ODBC", "Driver=x;Server=h;Uid=u;Pwd=hunter2;"), "Driver=x;Server=h;Uid=u;Pwd=***;");
  EXPECT_EQ(RedactEnvValue("PG", "host=h user=u password=hunter2 dbname=d"), "host=h user=u password=*** dbname=d");
  EXPECT_EQ(RedactEnvValue("SAS_URL", "https://a.blob.core.windows.net/c?sv=2022&sig=AbC%2B"),
            "https://a.blob.core.windows.net/c?sv=2022&sig=***");
  EXPECT_EQ(RedactEnvValue("NOTIFY_URL", "https://hooks.slack.com/services/T0/B0/XXXXsecret"),
            "https://hooks.slack.com/***");
  EXPECT_EQ(RedactEnvValue("ALERTS", "see https://discord.com/api/webhooks/123/tok3n now"),
            "see https://discord.com/*** now");
  // Not secrets: a plain query, a key=value of no secret name, a URL with no webhook.
  for (const char* v : {"http://127.0.0.1:8080/health?ready=1", "a=1;b=2", "https://example.com/hooks/x",
                        "monkey=1", "tokenizer=bpe"})
    EXPECT_EQ(RedactSecretsInText(v), v) << v;
}

TEST(Redact, WordsThatOnlyContainASecretWordAreNot) {
  for (const char* n : {"KEYBOARD", "MONKEY_PATCH", "HOTKEY", "TOKENIZERS_PARALLELISM", "TOKENIZER_PATH", "MAX_TOKENS",
                        "NUM_KEYS", "BYPASS_CACHE", "PASSES", "PATH", "PWD", "OLDPWD", "HOME", "KEYCHAIN_DIR",
                        "SECRETARY", "", "_", "TOKENS", "CUDA_VISIBLE_DEVICES"})
    EXPECT_FALSE(IsSecretEnvName(n)) << n;
}

TEST(Redact, SecretValueIsHiddenWhole) {
  EXPECT_EQ(RedactEnvValue("HF_TOKEN", "hf_plantedsecret123"), "<redacted>");
  EXPECT_EQ(RedactEnvValue("hf_token", "x"), "<redacted>");
  // A URL under a secret name: all of it, host too.
  EXPECT_EQ(RedactEnvValue("DB_PASSWORD", "postgres://u:p@h/db"), "<redacted>");
  // Empty: nothing to hide, and "it is empty" is what one needs to see.
  EXPECT_EQ(RedactEnvValue("HF_TOKEN", ""), "");
  EXPECT_EQ(RedactEnvValue("KEYBOARD", "us"), "us");
}

TEST(Redact, UrlPasswordIsHiddenUserAndHostStay) {
  EXPECT_EQ(RedactUrlCredentials("postgres://u:p4ss@h/db"), "postgres://u:***@h/db");
  EXPECT_EQ(RedactEnvValue("DATABASE_URL", "postgres://u:p4ss@h/db"), "postgres://u:***@h/db");
  EXPECT_EQ(RedactUrlCredentials("redis://:s3cret@10.0.0.5:6379/0"), "redis://:***@10.0.0.5:6379/0");
  EXPECT_EQ(RedactUrlCredentials("https://u:p@host"), "https://u:***@host");  // no path
  EXPECT_EQ(RedactUrlCredentials("https://u:p@host?x=1"), "https://u:***@host?x=1");
  EXPECT_EQ(RedactUrlCredentials("HTTPS://U:P@HOST:8443"), "HTTPS://U:***@HOST:8443");
  // An unencoded '@' or ':' in the password: up to the last '@' of the authority.
  EXPECT_EQ(RedactUrlCredentials("amqp://u:p@ss:w@rd@h:5672/vh"), "amqp://u:***@h:5672/vh");
}

TEST(Redact, UrlsWithoutAPasswordStay) {
  for (const char* v : {"https://host/path", "redis://10.0.0.5:6379",
                        "https://host:8080/a@b", "https://host/users/@me:x", "git@github.com:o/r.git",
                        "mailto:a@b.c", "user:pass@host", "://", "a://", "x://@", "/usr/bin:/bin", ""})
    EXPECT_EQ(RedactUrlCredentials(v), v) << v;
}

// Issue #46: a URL's bare user is its credential (https://TOKEN@github.com).
TEST(Redact, AUrlsUserWithoutAPasswordIsHidden) {
  EXPECT_EQ(RedactUrlCredentials("https://user@host/x"), "https://***@host/x");
  EXPECT_EQ(RedactUrlCredentials("https://u:@host/x"), "https://***:@host/x");
  EXPECT_EQ(RedactUrlCredentials("https://x0tok3nvalue@github.com/o/r.git"), "https://***@github.com/o/r.git");
}

TEST(Redact, EveryUrlInAValue) {
  EXPECT_EQ(RedactUrlCredentials("a://u:p@h1,b://v:q@h2/x"), "a://u:***@h1,b://v:***@h2/x");
  EXPECT_EQ(RedactUrlCredentials("a://h1,b://v:q@h2"), "a://h1,b://v:***@h2");
  EXPECT_EQ(RedactUrlCredentials("--db postgres://u:p@h/db --cache redis://:r@c"),
            "--db postgres://u:***@h/db --cache redis://:***@c");
  EXPECT_EQ(RedactUrlCredentials("x://u:p@h/a://v:q@h2"), "x://u:***@h/a://v:***@h2");
}

TEST(Redact, VeryLongValues) {
  std::string secret(1 << 20, 's');
  EXPECT_EQ(RedactEnvValue("HF_TOKEN", secret), "<redacted>");
  std::string url = "https://u:" + secret + "@h/" + std::string(1 << 20, 'p');
  std::string shown = RedactUrlCredentials(url);
  EXPECT_EQ(shown, "https://u:***@h/" + std::string(1 << 20, 'p'));
  // Many URLs: linear, not quadratic (a quadratic scan of 100k of them would not finish in ctest's timeout).
  std::string many;
  for (int i = 0; i < 100000; ++i) many += "a://u:p@h ";
  std::string expect;
  for (int i = 0; i < 100000; ++i) expect += "a://u:***@h ";
  EXPECT_EQ(RedactUrlCredentials(many), expect);
}

// Issue #46 item 3: the names and values `check` still showed.
TEST(Redact, NamePartsPwCredAndKeyCompounds) {
  for (const char* n : {"MYSQL_PWD", "DB_PW", "DB_CREDS", "SECRETKEY", "SESSIONKEY", "DJANGO_SECRETKEY",
                        "APP_SESSIONKEY", "mysqlPwd", "CRED", "JWT_SIGNINGKEY", "DBPASS", "dbpw", "AUTH"})
    EXPECT_TRUE(IsSecretEnvName(n)) << n;
  for (const char* n : {"PWD", "OLDPWD", "HOTKEY", "TURKEY", "WHISKEY", "CREDIT_LIMIT", "PWM_CHIP", "KEYBOARD",
                        "INCREDIBLE", "SECRETARY", "AUTHOR", "PASSES", "TORCH_CUDA_ARCH_LIST", "OMP_NUM_THREADS"})
    EXPECT_FALSE(IsSecretEnvName(n)) << n;
}

TEST(Redact, TokenShapedValuesUnderInnocentNames) {
  const std::string gh = "ghp_" + std::string("A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8");
  EXPECT_EQ(RedactEnvValue("GIT_HELPER", gh), "***");
  EXPECT_EQ(RedactEnvValue("X", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"), "***");
  EXPECT_EQ(RedactEnvValue("X", "hf_abcdefghijklmnopqrstuvwxyzABCDEFGH"), "***");
  EXPECT_EQ(RedactEnvValue("X", "sk-proj-abcdefghij1234567890ABCDEFGHIJ"), "***");
  EXPECT_EQ(RedactEnvValue("X", "AKIAIOSFODNN7EXAMPLE"), "***");
  EXPECT_EQ(RedactEnvValue("X", "xoxb-123456789012-abcdefghij"), "***");
  EXPECT_EQ(RedactEnvValue("X", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"), "***");
  EXPECT_EQ(RedactEnvValue("HEADER", "Authorization: Bearer abc.def"), "Authorization: Bearer ***");
  EXPECT_EQ(RedactEnvValue("HEADER", "Bearer x"), "Bearer ***");
  EXPECT_EQ(RedactEnvValue("CURL_ARGS", "-H token:" + gh + " -v"), "-H token:*** -v");
  // A token in a URL's user with a password after it: both gone.
  EXPECT_EQ(RedactEnvValue("REMOTE", "https://" + gh + ":x-oauth-basic@github.com/o/r"),
            "https://***:***@github.com/o/r");
}

TEST(Redact, LongHighEntropyValues) {
  // An Azure storage key (base64 of 64 bytes), an Azure DevOps PAT (52 of base32), a random base62 key.
  for (const char* v : {"q3+Jf0Zr8WbE2nYcT5kLm9Pv1XsA7dGh4uQo6ViRy0BtCw8NaMz2KeUx5Sj3Hp1Fg9Ld7Qr4Ym6Tb0Wv2Nc8Ze==",
                        "a7kq2m4xw9zr5tc3hb6nd8pj2vy4lf7gs5ew3uq9ko6ri2ma8xty",
                        "Zx8Kq2Lm4Nw9Rt5Yc3Hb6Vd8Pj2Fg4Ls7Ge"})
    EXPECT_EQ(RedactEnvValue("INNOCENT", v), "***") << v;
}

TEST(Redact, ACommandLinesSecretFlagsAndTokenWords) {
  EXPECT_EQ(RedactArgv({"python", "train.py", "--hf-token", "abc", "--tokens", "data/t.jsonl", "--api_key=k1",
                        "--max-tokens", "4096", "hf_abcdefghijklmnopqrstuvwxyzABCD", "-p", "x"}),
            (std::vector<std::string>{"python", "train.py", "--hf-token", "***", "--tokens", "data/t.jsonl",
                                      "--api_key=***", "--max-tokens", "4096", "***", "-p", "x"}));
}

// Issue #55 item 10: eight shapes `check` still showed, each hidden, and the innocent text beside them kept.
TEST(Redact, JsonMembersWithSecretKeys) {
  EXPECT_EQ(RedactSecretsInText(R"({"user": "bob", "password": "hunter2", "port": 5432})"),
            R"({"user": "bob", "password": "***", "port": 5432})");
  EXPECT_EQ(RedactSecretsInText(R"({"api_key":"k55","model":"m"})"), R"({"api_key":"***","model":"m"})");
  EXPECT_EQ(RedactSecretsInText("{'password': 'hunter2'}"), "{'password': '***'}");  // a Python dict
  EXPECT_EQ(RedactSecretsInText(R"({"password": "a \"quoted\" one"})"), R"({"password": "***"})");
  EXPECT_EQ(RedactSecretsInText(R"("{\"password\": \"esc55\"}")"), R"("{\"password\": \"***\"}")");
  // Not secrets: a count under a token-ish key, a key that merely mentions one, a secret word as a value.
  for (const char* v : {R"({"token_count": 5})", R"({"tokenizer": "bpe"})", R"({"field": "password"})",
                        R"({"note": "rotate the api_key monthly"})"})
    EXPECT_EQ(RedactSecretsInText(v), v) << v;
}

TEST(Redact, CredentialHeaders) {
  EXPECT_EQ(RedactSecretsInText("Authorization: Token tok55"), "Authorization: Token ***");
  EXPECT_EQ(RedactSecretsInText("X-Api-Key: key55"), "X-Api-Key: ***");
  EXPECT_EQ(RedactSecretsInText("curl -H 'X-Api-Key: key55' -H \"Authorization: Token tok55\" https://h/x"),
            "curl -H 'X-Api-Key: ***' -H \"Authorization: Token ***\" https://h/x");
  EXPECT_EQ(RedactSecretsInText("Proxy-Authorization: Basic dXNlcjpwYXNz"), "Proxy-Authorization: Basic ***");
  EXPECT_EQ(RedactSecretsInText("Authorization: tok55"), "Authorization: ***");
  EXPECT_EQ(RedactSecretsInText("X-Auth-Token: t\nAccept: json"), "X-Auth-Token: ***\nAccept: json");
  for (const char* v : {"Accept: application/json", "Content-Type: text/plain", "the key: see the docs",
                        "password: none set here", "X-Request-Id: 42", "Authorization:"})
    EXPECT_EQ(RedactSecretsInText(v), v) << v;
}

TEST(Redact, PasswordsOnACommandLine) {
  EXPECT_EQ(RedactSecretsInText("sshpass -p ssh55 ssh -p 2222 u@h"), "sshpass -p *** ssh -p 2222 u@h");
  EXPECT_EQ(RedactSecretsInText("/usr/bin/sshpass -pssh55 scp a h:"), "/usr/bin/sshpass -p*** scp a h:");
  EXPECT_EQ(RedactSecretsInText("mysql -u root -pmy55 train"), "mysql -u root -p*** train");
  EXPECT_EQ(RedactSecretsInText("bash -c 'mysqldump -pmy55 db > x.sql'"), "bash -c 'mysqldump -p*** db > x.sql'");
  EXPECT_EQ(RedactSecretsInText("sh -c 'mysql -pmy55'"), "sh -c 'mysql -p***'");
  EXPECT_EQ(RedactArgv({"sshpass", "-p", "ssh55", "ssh", "-p", "22", "h"}),
            (std::vector<std::string>{"sshpass", "-p", "***", "ssh", "-p", "22", "h"}));
  EXPECT_EQ(RedactArgv({"/usr/bin/mysql", "-uroot", "-pmy55", "-P", "3306"}),
            (std::vector<std::string>{"/usr/bin/mysql", "-uroot", "-p***", "-P", "3306"}));
  EXPECT_EQ(RedactArgv({"bash", "-c", "sshpass -p ssh55 rsync a h:b"}),
            (std::vector<std::string>{"bash", "-c", "sshpass -p *** rsync a h:b"}));
  // A port, a prompt, another program's -p: kept.
  for (const char* v : {"python -m http.server -p 8080", "docker run -p 8080:80 img", "ssh -p 2222 u@h",
                        "mysql -p train", "mysql -P 3306 -h db", "sshpass -e ssh -p 22 h", "ls -p; mysql -u u"})
    EXPECT_EQ(RedactSecretsInText(v), v) << v;
  EXPECT_EQ(RedactArgv({"python", "serve.py", "-p", "8080", "-p8081"}),
            (std::vector<std::string>{"python", "serve.py", "-p", "8080", "-p8081"}));
}

TEST(Redact, NetrcEntries) {
  EXPECT_EQ(RedactSecretsInText("machine h login u password net55"), "machine h login u password ***");
  EXPECT_EQ(RedactSecretsInText("machine a.example login u password n1\nmachine b password n2 login v\n"
                                "default login anonymous password n3"),
            "machine a.example login u password ***\nmachine b password *** login v\n"
            "default login anonymous password ***");
  for (const char* v : {"the machine password is in the vault", "reset your password and retry",
                        "password", "enter the password", "machine learning login page"})
    EXPECT_EQ(RedactSecretsInText(v), v) << v;
}

TEST(Redact, UserPasswordAtHostWithoutAScheme) {
  EXPECT_EQ(RedactSecretsInText("user:pass55@host"), "user:***@host");
  EXPECT_EQ(RedactSecretsInText("rsync -a d/ backup:pass55@10.0.0.5:/srv"), "rsync -a d/ backup:***@10.0.0.5:/srv");
  EXPECT_EQ(RedactSecretsInText("--target=u:pass55@db.example:5432"), "--target=u:***@db.example:5432");
  EXPECT_EQ(RedactSecretsInText("a:p:w@h"), "a:***@h");
  for (const char* v : {"user@host", "git@github.com:o/r.git", "mailto:a@b.c", "/srv/a:b@c",
                        "python:3.11@sha256:0123456789abcdef", "https://host/users/@me:x", "a@b:c", "@x", "a:@h",
                        ":p@h", "u:p@", "build 12:30 @ noon"})
    EXPECT_EQ(RedactSecretsInText(v), v) << v;
}

TEST(Redact, OrdinaryValuesStayVisible) {
  for (const char* v : {"1", "0", "8675309", "3.14", "true", "/usr/local/lib/python3.11/site-packages",
                        "/home/someone/projects/dflash-launch/build/bin:/usr/bin:/bin",
                        "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-Coder-32B-Instruct-GPTQ-Int4",
                        "da39a3ee5e6b4b0d3255bfef95601890afd80709",
                        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824",
                        "123e4567-e89b-12d3-a456-426614174000", "LD_LIBRARY_PATH_usr_local_cuda_12_4_lib64",
                        "expandable_segments:True,garbage_collection_threshold:0.8", "7.0;7.5;8.0;8.6;9.0+PTX",
                        "node001,node002,node003", "eth0", "hf_transfer", "sk-learn", "task-0001",
                        "inductor_compile_threads_per_worker_limit", "http://127.0.0.1:8080/health?ready=1",
                        "2.13.0+cpu-cxx11-abi-20261201", "bearer", "Basic"})
    EXPECT_EQ(RedactEnvValue("INNOCENT", v), v) << v;
}

}  // namespace
}  // namespace dflash
