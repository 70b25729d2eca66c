// Credentials for the store (docs/multinode.md, "Who can use the store"). A password is a secret: it
// comes from a file (owned by us, readable by nobody else) or an environment variable, never from a
// URL or argv, and nothing here prints it. The same secret keys the HMAC that the cluster gate signs
// its archives with (cachelock/cluster_gate.h): whoever can write the store without it cannot make a
// training process load their code.
#pragma once

#include <functional>
#include <string>

namespace dflash {

struct StoreAuth {
  std::string user;      ///< ACL user; empty: the default user (AUTH password)
  std::string password;  ///< empty: no AUTH
  /// What a person sets when the store refuses us ("set [run] store_password_file ..."): auth errors
  /// end with it, so they name the key to set.
  std::string hint;
  /// Run on every new connection, before AUTH or anything else is sent: false (with why) refuses the
  /// server and nothing reaches it. Node 0 proves here that the private store's listener is its own
  /// redis-server's socket (launcher/cluster/private_store.h), so the password never goes to a squatter.
  std::function<bool(std::string* why)> verify_server;
  /// Not empty (a private store's clients: PrivateStoreProofKey): before AUTH, the server must answer a fresh
  /// random challenge with this key (PrivateStoreProofAnswer); one that cannot gets nothing derived from the
  /// run's secret, only the public proof login and the challenge.
  std::string proof_key;
  bool empty() const { return password.empty(); }
};

/// Reads a secret from `path`: a regular file owned by this user with no group/other permission bits
/// (a secret anyone may read is no secret); one line, the trailing newline dropped, not empty.
bool ReadSecretFile(const std::string& path, std::string* secret, std::string* err);

/// Writes `secret` to a new file `path` (0600, O_EXCL, no link followed); an older one is replaced.
bool WriteSecretFile(const std::string& path, const std::string& secret, std::string* err);

/// 32 random bytes from the kernel (getrandom), as 64 hex digits: a private store's password.
bool RandomSecret(std::string* secret, std::string* err);

/// What a private store's clients send with AUTH, and what its redis-server requires: HMAC-SHA256 of the run
/// id under the run's secret, never the secret itself. The secret keys the HMAC that signs shipped kernels
/// (cachelock/cluster_gate.h); a client that cannot prove the server it reaches (another node's launcher, the
/// run's processes) may be talking to whoever bound the port first, and hands them only this: no signing key,
/// and a password no other run accepts.
std::string PrivateStoreAuthPassword(const std::string& secret, const std::string& run_id);

/// The key a private store proves itself with before any client sends AUTH: HMAC-SHA256 of the run id under
/// the run's secret, in another domain than the password (knowing one gives nothing of the other).
std::string PrivateStoreProofKey(const std::string& secret, const std::string& run_id);
/// The answer to challenge `nonce`: SHA-1(key . SHA-1(key . nonce)) in hex, what the store's Lua function
/// computes (Redis's Lua has sha1hex and no other hash; nested, a fresh nonce cannot be answered without the key).
std::string PrivateStoreProofAnswer(const std::string& proof_key, const std::string& nonce);
/// The Redis 7 function library the private store is loaded with (FUNCTION LOAD): dflash_prove(nonce).
std::string PrivateStoreProveLibrary(const std::string& proof_key);
/// The ACL user that may only call it (FCALL_RO), and its password: public, it guards nothing; it exists so
/// that a client may ask before it has proven anything.
inline constexpr const char* kProveUser = "dflash-prove";
inline constexpr const char* kProvePassword = "dflash-prove";
inline constexpr const char* kProveFunction = "dflash_prove";

/// The environment variables the launcher sets for its processes (the cluster gate reads them):
/// DFLASH_STORE_SECRET_FILE names a 0600 file with the password, DFLASH_STORE_USER the ACL user.
inline constexpr const char* kStoreSecretFileEnv = "DFLASH_STORE_SECRET_FILE";
inline constexpr const char* kStoreUserEnv = "DFLASH_STORE_USER";

}  // namespace dflash
