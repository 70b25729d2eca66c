#include "store/store_auth.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>

#include "common/fd.h"
#include "common/hash.h"

namespace dflash {

bool ReadSecretFile(const std::string& path, std::string* secret, std::string* err) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    *err = ErrnoMessage("the secret file " + path, errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    *err = "the secret file " + path + " is not a regular file";
    return false;
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *err = "the secret file " + path + " is readable by others or not ours (mode " + mode + ", owner uid " +
           std::to_string(st.st_uid) + "): chmod 600 it, as its owner";
    return false;
  }
  std::string text;
  bool too_big = false;
  if (!ReadAllFrom(fd.get(), path, 65536, &text, err, &too_big)) {
    if (too_big) *err = "the secret file " + path + " is larger than 64 KiB: not a password";
    return false;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty() || text.find('\n') != std::string::npos) {
    *err = "the secret file " + path + " must hold one non-empty line";
    return false;
  }
  *secret = std::move(text);
  return true;
}

bool WriteSecretFile(const std::string& path, const std::string& secret, std::string* err) {
  ::unlink(path.c_str());  // O_EXCL below: a file (or link) someone left there is never written through
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    *err = ErrnoMessage("create " + path, errno);
    return false;
  }
  return WriteAll(fd.get(), secret + "\n", err);
}

std::string PrivateStoreAuthPassword(const std::string& secret, const std::string& run_id) {
  return HmacSha256Hex(secret, "dflash private store AUTH/1\n" + run_id);
}

std::string PrivateStoreProofKey(const std::string& secret, const std::string& run_id) {
  return HmacSha256Hex(secret, "dflash private store PROVE/1\n" + run_id);
}

namespace {
std::string Sha1Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha1(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}
}  // namespace

std::string PrivateStoreProofAnswer(const std::string& proof_key, const std::string& nonce) {
  return Sha1Hex(proof_key + Sha1Hex(proof_key + nonce));
}

std::string PrivateStoreProveLibrary(const std::string& proof_key) {
  // The key is hex (HmacSha256Hex): nothing in it needs quoting in a Lua string.
  return std::string("#!lua name=dflash\nlocal k = '") + proof_key + "'\n"
         "redis.register_function{function_name='" + kProveFunction + "', callback=function(keys, args) "
         "return redis.sha1hex(k .. redis.sha1hex(k .. args[1])) end, flags={'no-writes', 'allow-stale'}}\n";
}

bool RandomSecret(std::string* secret, std::string* err) {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *err = ErrnoMessage("getrandom", errno);
      return false;
    }
    got += static_cast<size_t>(n);
  }
  static const char* k = "0123456789abcdef";
  secret->clear();
  for (unsigned char b : bytes) {
    *secret += k[b >> 4];
    *secret += k[b & 15];
  }
  return true;
}

}  // namespace dflash
