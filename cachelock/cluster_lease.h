// The cluster-wide compile gate's Redis side (docs/cachelock.md, "Cluster-wide gate"): per gate key, a
// lease with a fencing token that one process in the whole cluster holds while it compiles, and the
// kernels it publishes when done. Every check-and-write is one Lua script, so it is one step on the
// server: a lease is taken only if nobody holds it and nothing is published; it is renewed, released or
// turned into a publication only while its value is still the holder's token. A leader that lost its
// lease (it stalled past the TTL and another took over) can therefore never publish.
//
// Keys, for gate key K:
//   dflash:gate:K:lease    "<token>:<nonce>" of the holder (the nonce: 16 random hex digits, so a value stays
//                          unique even if a Redis restarted without persistence starts the fence over); PX ttl
//   dflash:gate:K:fence    INCR counter: every take gets a token larger than any before
//   dflash:gate:K:holder   JSON {host, role, pid, since, cpu_s} of the holder, same PX as the lease
//   dflash:gate:K:kernels  hash {archive: the cache archive (cachelock/cache_archive.h), meta: JSON,
//                          sig: HMAC-SHA256 under the run's secret of the gate key and the meta (which holds
//                          the archive's SHA-256): whoever can write the store but lacks the secret cannot
//                          make a process import their .so files and pickles}
#pragma once

#include <cstdint>
#include <string>

#include "common/duration.h"
#include "store/redis_client.h"

namespace dflash {

/// Who holds (or held) a lease, for people: in waiters' progress lines and the idle hint.
struct ClusterHolder {
  int64_t token = 0;
  std::string lease;  ///< the lease's value, "<token>:<nonce>": what every fenced step compares
  std::string host;
  std::string role;  ///< "drafter:0"
  int64_t pid = 0;
  double since = 0;  ///< unix seconds when it took the lease
  double cpu_s = 0;  ///< CPU its compiling tree had used at its last renewal
  int64_t ttl_left_ms = 0;

  std::string ToJson() const;
  /// "drafter:0 (pid 12, host n1, token 7)".
  std::string Describe() const;
};

/// What a publication says about itself (the `meta` field), type-checked on read: it is input from
/// whoever could write to the store.
struct ClusterKernelsMeta {
  int64_t token = 0;
  std::string host, role;
  std::string torch_version, device;
  uint64_t bytes = 0;  ///< of the archive
  std::string sha256;  ///< of the archive
  double compile_s = 0;
  double published_at = 0;

  std::string ToJson() const;
  static bool Parse(const std::string& text, ClusterKernelsMeta* out, std::string* err);
};

class ClusterLease {
 public:
  /// `io_timeout` bounds connecting and each command (RedisClient); `auth` is sent on each connection;
  /// `sign_key` (the run's secret) signs what Publish stores and verifies what Fetch returns.
  ClusterLease(StoreUrl store, std::string gate_key, Millis ttl, Millis io_timeout = Millis(2000),
               StoreAuth auth = {}, std::string sign_key = {});

  enum class Take { kTaken, kHeld, kPublished };
  /// One atomic look: kernels published -> kPublished; a live lease -> kHeld (`holder` says whose, with
  /// its token and time left); else a fresh token is drawn and the lease is ours (kTaken, `holder.token`).
  /// False (with `err`) only when the store could not be asked.
  bool TryTake(const ClusterHolder& me, Take* out, ClusterHolder* holder, std::string* err);
  /// Extends the lease by the TTL and refreshes the holder record, only while its value is `me.lease`.
  /// `*still_ours` false: the lease expired or another process holds it now.
  bool Renew(const ClusterHolder& me, bool* still_ours, std::string* err);
  /// Stores `archive` and `meta` and drops the lease, in one step, only while the lease's value is
  /// `lease` (ClusterHolder::lease). `*published` false: the lease was lost (fencing), nothing was stored.
  bool Publish(const std::string& lease, const std::string& archive, const ClusterKernelsMeta& meta,
               bool* published, std::string* err);
  /// Drops the lease if its value is still `lease` (a leader that ends without kernels: the next one
  /// takes it at once instead of after the TTL).
  bool Release(const std::string& lease, std::string* err);
  /// The published kernels. `*present` false if nothing is published. The signature is verified (no
  /// key, no signature or a wrong one: false, `err` says "unsigned"/"forged"), the meta type-checked and
  /// the archive's size and SHA-256 checked against it; a mismatch is false with `err` (corrupt).
  bool Fetch(std::string* archive, ClusterKernelsMeta* meta, bool* present, std::string* err);

  std::string Key(const char* part) const { return "dflash:gate:" + gate_key_ + ":" + part; }
  /// The signature of `meta_json` for this gate key under `key` (hex HMAC-SHA256).
  static std::string Sign(const std::string& key, const std::string& gate_key, const std::string& meta_json);
  Millis ttl() const { return ttl_; }
  const StoreUrl& store() const { return client_.url(); }

 private:
  RedisClient client_;
  std::string gate_key_;
  std::string sign_key_;
  Millis ttl_;
};

/// The lease TTL when DFLASH_GATE_LEASE_TTL is not set: a SIGKILLed leader's lease is taken over after
/// at most this long; the holder renews every third of it.
inline constexpr Millis kDefaultClusterLeaseTtl{15'000};

}  // namespace dflash
