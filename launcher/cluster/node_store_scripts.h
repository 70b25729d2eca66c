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

// The start barrier, one node's step (O(1) until the set is full): this node joins the session's
// `arrived` set and reads how many joined, and node 0's nonce (the session is node 0's instance: a
// new one means the session ended). Once the set holds N members, only this run's ranks count: a
// member a peer of the store forged ("9", "01") opens no barrier. {node 0's nonce, valid count, raw count}.
inline constexpr const char* kArrive = R"lua(
local n = tonumber(ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local raw = redis.call('SCARD', KEYS[2])
local valid = raw
if raw >= n then
  valid = 0
  for _, m in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    local r = tonumber(m)
    if r and r >= 0 and r < n and tostring(r) == m then valid = valid + 1 end
  end
end
return {redis.call('HGET', KEYS[1], 'nonce') or '', valid, raw}
)lua";

// One node's look once the barrier is passed, O(1): the watch roles, the failure, the round, the
// round's stopped count, and (while waiting in a round) the finished nodes. Roles (ARGV[4] == '1'):
// the watcher scans every registration each poll; the deputy checks the watcher's lease each poll
// and takes it the moment it lapses (or names a node whose registration is not its own any more),
// then scans at once. A lease value is "<rank>:<nonce>"; one that names no live registration (a dead
// holder, a forged value without a TTL) counts as lapsed: result[6] = 1 says one was overwritten.
// KEYS: watcher, deputy, failed, round, stopped:<waiting>, finished. ARGV: me, ttl ms, node key
// prefix, may take roles, waiting (1: return the finished set).
inline constexpr const char* kPoll = R"lua(
local me, ttl = ARGV[1], ARGV[2]
local function live(v)
  if not v then return false end
  local r, n = string.match(v, '^(%d+):(%x+)$')
  return r ~= nil and redis.call('HGET', ARGV[3] .. r, 'nonce') == n
end
local role, forged = '', 0
if ARGV[4] == '1' then
  local w = redis.call('GET', KEYS[1])
  if w == me then
    redis.call('PEXPIRE', KEYS[1], ttl)
    role = 'watcher'
  else
    local d = redis.call('GET', KEYS[2])
    local wlive = live(w)
    if w and not wlive and string.match(w, '^%d+:%x+$') == nil then forged = 1 end
    if not wlive and (d == me or not live(d)) then
      redis.call('SET', KEYS[1], me, 'PX', ttl)
      if d == me then redis.call('DEL', KEYS[2]) end
      role = 'watcher'
    elseif d == me then
      redis.call('PEXPIRE', KEYS[2], ttl)
      role = 'deputy'
    elseif not live(d) then
      redis.call('SET', KEYS[2], me, 'PX', ttl)
      role = 'deputy'
    end
  end
end
local finished = {}
if ARGV[5] == '1' then finished = redis.call('SMEMBERS', KEYS[6]) end
return {role, redis.call('GET', KEYS[3]) or '', redis.call('GET', KEYS[4]) or '', redis.call('SCARD', KEYS[5]),
        finished, forged}
)lua";

// The watcher's scan, O(N) on one node: per node its nonce and heartbeat, and (only when its
// registration is gone) whether it is done. ARGV: node key prefix, done key prefix, N.
inline constexpr const char* kScan = R"lua(
local out = {}
for i = 0, tonumber(ARGV[3]) - 1 do
  local v = redis.call('HMGET', ARGV[1] .. i, 'nonce', 'hb')
  out[#out + 1] = v[1] or ''
  out[#out + 1] = v[2] or ''
  if v[1] then out[#out + 1] = 0 else out[#out + 1] = redis.call('EXISTS', ARGV[2] .. i) end
end
return out
)lua";

// Give up this node's watch roles (a clean end): the deputy, or anyone, takes them at its next poll.
inline constexpr const char* kReleaseRoles = R"lua(
for i = 1, 2 do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 0
)lua";

// This node stopped for round ARGV[2]: in the round's set; the node that completes it rings the news
// once (not every node: N rings would wake N nodes N times). KEYS: stopped:<n>, news. ARGV: rank, N, keep.
inline constexpr const char* kStopped = R"lua(
local added = redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if added == 1 and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', '64', '*', 'stopped', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 0
)lua";

// The round after ARGV[1], unless another node already began it; a new round rings the news.
// KEYS: round, news.
inline constexpr const char* kAdvanceRound = R"lua(
local r = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if r == tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], r + 1, 'PX', ARGV[2])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', '64', '*', 'round', r + 1)
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return r + 1
end
return r
)lua";

// The run's failure (first one wins: SET NX), and the news rung so every node reads it now (only when
// it was written: a publisher repeats this every poll, for a Redis restarted empty). 1: ours is the
// record, 0: another one holds the key. KEYS: failed, news. ARGV: record, keep.
inline constexpr const char* kPublishFailure = R"lua(
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', '64', '*', 'failed', '1')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
)lua";

}  // namespace dflash::node_store
