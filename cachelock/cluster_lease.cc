#include "cachelock/cluster_lease.h"

#include <sys/random.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>

#include "common/hash.h"

namespace dflash {
namespace {

// KEYS: lease, fence, holder, kernels. ARGV: ttl ms, holder JSON, nonce.
constexpr const char* kTakeScript = R"lua(
if redis.call('HEXISTS', KEYS[4], 'archive') == 1 then return {'published'} end
local cur = redis.call('GET', KEYS[1])
if cur then return {'held', cur, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[3]) or ''} end
local t = redis.call('INCR', KEYS[2])
local v = tostring(t) .. ':' .. ARGV[3]
redis.call('SET', KEYS[1], v, 'PX', ARGV[1])
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[1])
return {'taken', t, v}
)lua";

// KEYS: lease, holder. ARGV: lease value, ttl ms, holder JSON.
constexpr const char* kRenewScript = R"lua(
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
return 1
)lua";

// KEYS: lease, holder, kernels. ARGV: lease value, archive, meta, sig.
constexpr const char* kPublishScript = R"lua(
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[3], 'archive', ARGV[2], 'meta', ARGV[3], 'sig', ARGV[4])
redis.call('DEL', KEYS[1], KEYS[2])
return 1
)lua";

// KEYS: lease, holder. ARGV: lease value.
constexpr const char* kReleaseScript = R"lua(
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
)lua";

/// The token of a lease value "<token>:<nonce>".
bool ParseToken(const std::string& value, int64_t* out) {
  std::string s = value.substr(0, value.find(':'));
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

/// The holder record is advisory (for messages): anything unreadable is left blank, never fatal.
void ReadHolder(const std::string& text, ClusterHolder* h) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return;
  auto str = [&](const char* k, std::string* out) {
    if (j.contains(k) && j[k].is_string()) *out = j[k].get<std::string>().substr(0, 200);
  };
  str("host", &h->host);
  str("role", &h->role);
  if (j.contains("pid") && j["pid"].is_number_integer()) h->pid = j["pid"].get<int64_t>();
  if (j.contains("since") && j["since"].is_number()) h->since = j["since"].get<double>();
  if (j.contains("cpu_s") && j["cpu_s"].is_number()) h->cpu_s = j["cpu_s"].get<double>();
}

/// 16 random hex digits (getrandom): what makes a lease value unique beyond its token.
std::string Nonce() {
  unsigned char b[8] = {};
  if (::getrandom(b, sizeof b, 0) != static_cast<ssize_t>(sizeof b)) {
    // No entropy call: the pid and a clock still differ between the processes that could meet.
    uint64_t v = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
                 static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::memcpy(b, &v, sizeof b);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

}  // namespace

std::string ClusterHolder::ToJson() const {
  return nlohmann::json{{"host", host}, {"role", role}, {"pid", pid}, {"since", since}, {"cpu_s", cpu_s}}.dump();
}

std::string ClusterHolder::Describe() const {
  std::string who = role.empty() ? "a process" : role;
  std::string pid_text = pid > 0 ? "pid " + std::to_string(pid) + ", " : "";
  return who + " (" + pid_text + "host " + (host.empty() ? "?" : host) + ", token " + std::to_string(token) + ")";
}

std::string ClusterKernelsMeta::ToJson() const {
  return nlohmann::json{{"format", "dflash-cluster-kernels/1"},
                        {"token", token},
                        {"host", host},
                        {"role", role},
                        {"torch_version", torch_version},
                        {"device", device},
                        {"bytes", bytes},
                        {"sha256", sha256},
                        {"compile_s", compile_s},
                        {"published_at", published_at}}
      .dump();
}

bool ClusterKernelsMeta::Parse(const std::string& text, ClusterKernelsMeta* out, std::string* err) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) {
    *err = "the kernels' meta is not a JSON object";
    return false;
  }
  auto need_str = [&](const char* k, std::string* v) {
    if (!j.contains(k) || !j[k].is_string()) {
      *err = std::string("the kernels' meta: \"") + k + "\" must be a string";
      return false;
    }
    *v = j[k].get<std::string>();
    return true;
  };
  ClusterKernelsMeta m;
  std::string format;
  if (!need_str("format", &format) || !need_str("host", &m.host) || !need_str("role", &m.role) ||
      !need_str("torch_version", &m.torch_version) || !need_str("device", &m.device) ||
      !need_str("sha256", &m.sha256))
    return false;
  if (format != "dflash-cluster-kernels/1") {
    *err = "the kernels' meta has format \"" + format.substr(0, 64) + "\", not dflash-cluster-kernels/1";
    return false;
  }
  if (!j.contains("bytes") || !j["bytes"].is_number_unsigned() || !j.contains("token") ||
      !j["token"].is_number_integer()) {
    *err = "the kernels' meta: \"bytes\" and \"token\" must be non-negative integers";
    return false;
  }
  m.bytes = j["bytes"].get<uint64_t>();
  m.token = j["token"].get<int64_t>();
  if (j.contains("compile_s") && j["compile_s"].is_number()) m.compile_s = j["compile_s"].get<double>();
  if (j.contains("published_at") && j["published_at"].is_number()) m.published_at = j["published_at"].get<double>();
  *out = std::move(m);
  return true;
}

ClusterLease::ClusterLease(StoreUrl store, std::string gate_key, Millis ttl, Millis io_timeout, StoreAuth auth,
                           std::string sign_key)
    : client_(std::move(store), io_timeout, std::move(auth)),
      gate_key_(std::move(gate_key)),
      sign_key_(std::move(sign_key)),
      ttl_(ttl) {}

std::string ClusterLease::Sign(const std::string& key, const std::string& gate_key, const std::string& meta_json) {
  // The gate key is signed too: a signed archive of one gate key cannot be replayed under another.
  return HmacSha256Hex(key, "dflash-cluster-kernels/1\n" + gate_key + "\n" + meta_json);
}

bool ClusterLease::TryTake(const ClusterHolder& me, Take* out, ClusterHolder* holder, std::string* err) {
  RedisReply r;
  if (!client_.Eval(kTakeScript, {Key("lease"), Key("fence"), Key("holder"), Key("kernels")},
                    {std::to_string(ttl_.count()), me.ToJson(), Nonce()}, &r, err))
    return false;
  if (r.type != RedisReply::Type::kArray || r.elements.empty()) {
    *err = client_.url().ToString() + ": unexpected reply to the lease script";
    return false;
  }
  const std::string& what = r.elements[0].str;
  *holder = ClusterHolder{};
  if (what == "published") {
    *out = Take::kPublished;
    return true;
  }
  if (what == "taken" && r.elements.size() == 3) {
    *out = Take::kTaken;
    *holder = me;
    holder->token = r.elements[1].integer;
    holder->lease = r.elements[2].str;
    holder->ttl_left_ms = ttl_.count();
    return true;
  }
  if (what == "held" && r.elements.size() == 4) {
    *out = Take::kHeld;
    holder->lease = r.elements[1].str;
    ParseToken(holder->lease, &holder->token);  // a foreign value stays token 0: it is still held
    holder->ttl_left_ms = r.elements[2].integer;
    ReadHolder(r.elements[3].str, holder);
    return true;
  }
  *err = client_.url().ToString() + ": unexpected reply to the lease script";
  return false;
}

bool ClusterLease::Renew(const ClusterHolder& me, bool* still_ours, std::string* err) {
  RedisReply r;
  if (!client_.Eval(kRenewScript, {Key("lease"), Key("holder")},
                    {me.lease, std::to_string(ttl_.count()), me.ToJson()}, &r, err))
    return false;
  *still_ours = r.type == RedisReply::Type::kInteger && r.integer == 1;
  return true;
}

bool ClusterLease::Publish(const std::string& lease, const std::string& archive, const ClusterKernelsMeta& meta,
                           bool* published, std::string* err) {
  RedisReply r;
  std::string meta_json = meta.ToJson();
  if (!client_.Eval(kPublishScript, {Key("lease"), Key("holder"), Key("kernels")},
                    {lease, archive, meta_json, Sign(sign_key_, gate_key_, meta_json)}, &r, err))
    return false;
  *published = r.type == RedisReply::Type::kInteger && r.integer == 1;
  return true;
}

bool ClusterLease::Release(const std::string& lease, std::string* err) {
  RedisReply r;
  return client_.Eval(kReleaseScript, {Key("lease"), Key("holder")}, {lease}, &r, err);
}

bool ClusterLease::Fetch(std::string* archive, ClusterKernelsMeta* meta, bool* present, std::string* err) {
  RedisReply r;
  if (!client_.Command({"HMGET", Key("kernels"), "meta", "archive", "sig"}, &r, err)) return false;
  *present = false;
  if (r.type != RedisReply::Type::kArray || r.elements.size() != 3) {
    *err = client_.url().ToString() + ": unexpected reply to HMGET";
    return false;
  }
  if (r.elements[0].nil() && r.elements[1].nil()) return true;
  *present = true;
  if (r.elements[0].type != RedisReply::Type::kString || r.elements[1].type != RedisReply::Type::kString) {
    *err = Key("kernels") + " lacks its meta or its archive";
    return false;
  }
  // Before anything of it is believed: is it ours? Only a holder of the run's secret can sign.
  if (sign_key_.empty()) {
    *err = "this process has no run secret to verify them with (DFLASH_STORE_SECRET_FILE)";
    return false;
  }
  if (r.elements[2].type != RedisReply::Type::kString || r.elements[2].str.empty()) {
    *err = "they are unsigned (no \"sig\" in " + Key("kernels") + ")";
    return false;
  }
  if (!ConstantTimeEqual(r.elements[2].str, Sign(sign_key_, gate_key_, r.elements[0].str))) {
    *err = "their signature does not verify (forged, or signed with another run's secret)";
    return false;
  }
  if (!ClusterKernelsMeta::Parse(r.elements[0].str, meta, err)) return false;
  *archive = std::move(r.elements[1].str);
  if (archive->size() != meta->bytes) {
    *err = "the archive has " + std::to_string(archive->size()) + " bytes, its meta says " +
           std::to_string(meta->bytes);
    return false;
  }
  if (std::string sha = Sha256Hex(*archive); sha != meta->sha256) {
    *err = "the archive's SHA-256 is " + sha + ", its meta says " + meta->sha256.substr(0, 64);
    return false;
  }
  return true;
}

}  // namespace dflash
