#include "store/redis_client.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <openssl/sha.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>

#include "common/hash.h"
#include "common/printable.h"

namespace dflash {
namespace {

timeval ToTimeval(Millis m) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(m.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((m.count() % 1000) * 1000);
  return tv;
}

bool ParseInt(std::string_view s, int lo, int hi, int* out) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

RedisReply Copy(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING: out.type = RedisReply::Type::kString; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_STATUS: out.type = RedisReply::Type::kStatus; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_ERROR: out.type = RedisReply::Type::kError; out.str.assign(r->str, r->len); break;
    case REDIS_REPLY_INTEGER: out.type = RedisReply::Type::kInteger; out.integer = r->integer; break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Copy(r->element[i]));
      break;
    default: out.type = RedisReply::Type::kNil; break;
  }
  return out;
}

/// One command, its arguments binary-safe (hiredis's argv form: no formatting, no quoting).
redisReply* SendArgv(redisContext* c, const std::vector<std::string>& argv) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  return static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data()));
}

}  // namespace

std::string StoreUrl::ToString() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return "redis://" + h + ":" + std::to_string(port) + (db ? "/" + std::to_string(db) : "");
}

bool ParseStoreUrl(const std::string& text, StoreUrl* url, std::string* err) {
  const std::string scheme = "redis://";
  // Whatever precedes an '@' may be a password: never echoed.
  std::string shown = text;
  if (auto at = shown.rfind('@'); at != std::string::npos && shown.rfind(scheme, 0) == 0)
    shown = scheme + "***" + shown.substr(at);
  auto fail = [&](const std::string& why) {
    *err = "store \"" + shown + "\": " + why + " (expected redis://HOST[:PORT][/DB])";
    return false;
  };
  if (text.rfind(scheme, 0) != 0) return fail("only redis:// is supported");
  std::string rest = text.substr(scheme.size());
  StoreUrl u;
  // A password in the URL would show in argv, logs and `check`: it comes from a file or a variable.
  if (rest.find('@') != std::string::npos)
    return fail("no user or password in the URL: they would show in argv, logs and `check`; set [run] "
                "store_password_file or store_password_env (and store_user)");
  if (rest.find('?') != std::string::npos || rest.find('#') != std::string::npos)
    return fail("options are not supported");
  std::string path;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    if (!path.empty() && !ParseInt(path, 0, 15, &u.db)) return fail("the db must be a number 0-15");
  }
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    auto close = rest.find(']');
    if (close == std::string::npos) return fail("an IPv6 host needs its ']'");
    u.host = rest.substr(1, close - 1);
    std::string after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return fail("junk after the host");
      port = after.substr(1);
    }
  } else if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    u.host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  } else {
    u.host = rest;
  }
  if (u.host.empty()) return fail("no host");
  for (char c : u.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':'))
      return fail("the host has a character that is not allowed: '" + std::string(1, c) + "'");
  if (!port.empty() && !ParseInt(port, 1, 65535, &u.port)) return fail("the port must be 1-65535");
  *url = u;
  return true;
}

struct RedisClient::Impl {
  redisContext* ctx = nullptr;
  // Interrupt() comes from another thread: it reads the socket under `mu` while this one closes it under
  // `mu`, so it never shuts down a descriptor number that was closed and reused meanwhile.
  std::mutex mu;
  int fd = -1;
  std::atomic<bool> interrupted{false};
  ~Impl() { Close(); }
  void Adopt(redisContext* c) {
    std::lock_guard<std::mutex> l(mu);
    ctx = c;
    fd = c->fd;
  }
  void Close() {
    std::lock_guard<std::mutex> l(mu);
    if (ctx) redisFree(ctx);
    ctx = nullptr;
    fd = -1;
  }
};

RedisClient::RedisClient(StoreUrl url, Millis timeout, StoreAuth auth)
    : url_(std::move(url)), timeout_(timeout), auth_(std::move(auth)), impl_(std::make_unique<Impl>()) {}

std::string RedisClient::AuthError(const std::string& what) const {
  const_cast<RedisClient*>(this)->auth_refused_ = true;
  std::string hint = auth_.hint.empty() ? "" : ": " + auth_.hint;
  return url_.ToString() + ": " + what + hint;
}
RedisClient::~RedisClient() = default;

bool RedisClient::connected() const { return impl_->ctx != nullptr; }
void RedisClient::Disconnect() { impl_->Close(); }

void RedisClient::Interrupt() {
  impl_->interrupted = true;
  std::lock_guard<std::mutex> l(impl_->mu);
  if (impl_->fd >= 0) ::shutdown(impl_->fd, SHUT_RDWR);
}

bool RedisClient::Connect(std::string* err) {
  if (impl_->interrupted) {
    *err = url_.ToString() + ": interrupted";
    return false;
  }
  if (impl_->ctx) return true;
  auth_refused_ = false;
  redisContext* c = redisConnectWithTimeout(url_.host.c_str(), url_.port, ToTimeval(timeout_));
  if (c == nullptr) {
    *err = url_.ToString() + ": cannot allocate a connection";
    return false;
  }
  if (c->err) {
    *err = url_.ToString() + ": " + c->errstr;
    redisFree(c);
    return false;
  }
  // hiredis 0.14 opens its socket without SOCK_CLOEXEC: mark it at once (our
  // spawn core also closes every fd above 2 in the child, so a fork racing
  // this line still hands no payload the connection).
  ::fcntl(c->fd, F_SETFD, FD_CLOEXEC);
  redisSetTimeout(c, ToTimeval(timeout_));
  impl_->Adopt(c);
  if (impl_->interrupted) {  // Interrupt() came while connecting: it found no socket to shut down
    *err = url_.ToString() + ": interrupted";
    Disconnect();
    return false;
  }
  if (std::string why; auth_.verify_server && !auth_.verify_server(&why)) {
    *err = url_.ToString() + ": not the server meant, nothing was sent to it: " + why;
    Disconnect();
    return false;
  }
  if (std::string why; !auth_.proof_key.empty() && !ServerProvesKey(&why)) {
    *err = url_.ToString() + ": not the run's private store, nothing derived from the run's secret was sent to it: " +
           why;
    Disconnect();
    return false;
  }
  if (!auth_.empty()) {
    // Never through Command(): its error text would carry the argv (the password) nowhere, but keep
    // the password out of every message by construction.
    std::vector<std::string> argv{"AUTH"};
    if (!auth_.user.empty()) argv.push_back(auth_.user);
    argv.push_back(auth_.password);
    redisReply* r = SendArgv(c, argv);
    std::string what;
    if (r == nullptr)
      what = std::string("the store closed the connection after AUTH (") + (c->errstr[0] ? c->errstr : "no reply") +
             "): is the password (and user) right?";
    else if (r->type == REDIS_REPLY_ERROR &&
             std::string_view(r->str, r->len).find("without any password configured") == std::string_view::npos)
      what = "the store refused our credentials (" + std::string(r->str, r->len) + ")";
    if (r) freeReplyObject(r);
    if (!what.empty()) {
      *err = AuthError(what);
      Disconnect();
      return false;
    }
  }
  if (url_.db != 0) {
    RedisReply r;
    if (!Command({"SELECT", std::to_string(url_.db)}, &r, err)) {
      Disconnect();
      return false;
    }
  }
  ++connections_;
  return true;
}

bool RedisClient::ServerProvesKey(std::string* why) {
  redisContext* c = impl_->ctx;
  std::string nonce;
  if (!RandomSecret(&nonce, why)) return false;
  // Only the public proof login and a fresh nonce go out: a squatter learns nothing it could use.
  auto reply_text = [](redisReply* r) {
    if (r == nullptr) return std::string("the connection was closed");
    std::string t(r->str ? std::string(r->str, r->len) : "");
    return t.substr(0, 80);
  };
  redisReply* r = SendArgv(c, {"AUTH", kProveUser, kProvePassword});
  bool ok = r && r->type == REDIS_REPLY_STATUS && std::string_view(r->str, r->len) == "OK";
  if (!ok) *why = "it does not let the proof user in (" + Printable(reply_text(r)) + ")";
  if (r) freeReplyObject(r);
  if (!ok) return false;
  r = SendArgv(c, {"FCALL_RO", kProveFunction, "0", nonce});
  ok = r && r->type == REDIS_REPLY_STRING &&
       ConstantTimeEqual(std::string_view(r->str, r->len), PrivateStoreProofAnswer(auth_.proof_key, nonce));
  if (!ok)
    *why = r && r->type == REDIS_REPLY_ERROR ? "it cannot answer the challenge (" + Printable(reply_text(r)) + ")"
                                             : "its answer to a fresh challenge is wrong: it does not know the run's "
                                               "secret";
  if (r) freeReplyObject(r);
  return ok;
}

bool RedisClient::Command(const std::vector<std::string>& argv, RedisReply* reply, std::string* err) {
  auth_refused_ = false;
  if (!Connect(err)) return false;
  redisReply* r = SendArgv(impl_->ctx, argv);
  if (r == nullptr) {
    std::string why = impl_->ctx->errstr[0] ? impl_->ctx->errstr : "connection lost";
    // A store that wants a password may drop a client that did not send one (protected mode, a proxy):
    // hiredis only says "Server closed the connection".
    if (auth_.empty() && why.find("closed the connection") != std::string::npos)
      *err = AuthError(why + " (a password-protected store closes on clients that send no password?)");
    else
      *err = url_.ToString() + ": " + why;
    Disconnect();  // hiredis cannot reuse a context after an I/O error
    return false;
  }
  *reply = Copy(r);
  freeReplyObject(r);
  if (reply->type == RedisReply::Type::kError) {
    if (reply->str.rfind("NOAUTH", 0) == 0)
      *err = AuthError("the store requires a password (" + reply->str + ")");
    else if (reply->str.rfind("WRONGPASS", 0) == 0 || reply->str.rfind("NOPERM", 0) == 0)
      *err = AuthError("the store refused us (" + reply->str + ")");
    else
      *err = url_.ToString() + ": " + argv[0] + ": " + reply->str;
    return false;
  }
  return true;
}

bool RedisClient::Eval(const std::string& script, const std::vector<std::string>& keys,
                       const std::vector<std::string>& args, RedisReply* reply, std::string* err) {
  // EVALSHA first: the server neither receives nor hashes the script's text on every call (a node's
  // poll, at a thousand nodes, is most of what the store does); EVAL when it does not know it yet
  // (NOSCRIPT: a new or restarted server), which caches it there.
  auto sha = scripts_sha1_.find(script);
  if (sha == scripts_sha1_.end()) {
    unsigned char d[SHA_DIGEST_LENGTH];
    ::SHA1(reinterpret_cast<const unsigned char*>(script.data()), script.size(), d);
    static const char* hex = "0123456789abcdef";
    std::string h;
    for (unsigned char c : d) {
      h += hex[c >> 4];
      h += hex[c & 15];
    }
    sha = scripts_sha1_.emplace(script, h).first;
  }
  std::vector<std::string> argv{"EVALSHA", sha->second, std::to_string(keys.size())};
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  *reply = RedisReply{};
  if (Command(argv, reply, err)) return true;
  if (reply->type != RedisReply::Type::kError || reply->str.rfind("NOSCRIPT", 0) != 0) return false;
  argv[0] = "EVAL";
  argv[1] = script;
  err->clear();
  return Command(argv, reply, err);
}

}  // namespace dflash
