// The coordination store's check-and-write steps, each one Lua script so that no
// two launchers can interleave them (launcher/cluster/node_coordinator.cc runs them; the
// keys are in docs/multinode.md, "Keys").
#pragma once

namespace dflash::node_store {

/// Run-level keys live a day: long after any run, short enough not to pile up.
inline constexpr const char* kKeepMs = "86400000";

// Claim the registration if nobody holds it; else say who does.
inline constexpr const char* kClaim = R"lua(
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 2))
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return {1}
end
return {0, redis.call('HGETALL', KEYS[1])}
)lua";

// Drop a registration whose launcher is provably dead, if it is still that one.
inline constexpr const char* kTakeOver = R"lua(
if redis.call('HGET', KEYS[1], 'nonce') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
)lua";

// Refresh our registration: 1 refreshed, 2 it is gone (deleted or expired; not recreated: the
// coordinator decides whether the store restarted or the run left this node behind), 0 another
// instance holds it now.
inline constexpr const char* kRefresh = R"lua(
local cur = redis.call('HGET', KEYS[1], 'nonce')
if not cur then return 2 end
if cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
)lua";

// Recreate our registration after a reconnect that found it gone (a restarted, empty Redis): 1
// recreated (or still there), 0 another instance holds it now.
inline constexpr const char* kRecreate = R"lua(
local cur = redis.call('HGET', KEYS[1], 'nonce')
if cur and cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
)lua";

// Unregister, if it is still ours.
inline constexpr const char* kUnregister = kTakeOver;

// Everything one poll needs, read at one instant: per node its nonce, heartbeat
// and done flag; the failure, the round, and how many nodes stopped for a round.
inline constexpr const char* kWatch = R"lua(
local n = tonumber(ARGV[1])
local out = {}
for i = 1, n do
  local v = redis.call('HMGET', KEYS[i], 'nonce', 'hb')
  out[#out + 1] = v[1] or ''
  out[#out + 1] = v[2] or ''
  out[#out + 1] = redis.call('EXISTS', KEYS[n + i])
end
out[#out + 1] = redis.call('GET', KEYS[2 * n + 1]) or ''
out[#out + 1] = redis.call('GET', KEYS[2 * n + 2]) or ''
out[#out + 1] = redis.call('SCARD', KEYS[2 * n + 3])
return out
)lua";

// The round after ARGV[1], unless another node already began it.
inline constexpr const char* kAdvanceRound = R"lua(
local r = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if r == tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], r + 1, 'PX', ARGV[2])
  return r + 1
end
return r
)lua";

}  // namespace dflash::node_store
