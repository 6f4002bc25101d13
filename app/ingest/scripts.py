"""The consumer's Lua scripts: each runs whole in Redis, so a batch's read is one command
and its write one atomic step (on a Redis Cluster, one per user: a script's keys must share
a slot, and a user's do)."""

from __future__ import annotations

# Each user's state, for users whose keys come five at a time (positives, seen, blob,
# impressions, applied ids): the three strings, then the impression counts and the applied
# marks asked for (ARGV: for each user, a count and the fields, twice). One command for a
# batch instead of five per user: the client's per-command cost is what bounds the rate.
READ_SCRIPT = """
local out = {}
local a = 1
for k = 1, #KEYS, 5 do
  for j = 0, 2 do out[#out + 1] = redis.call('GET', KEYS[k + j]) end
  for j = 3, 4 do
    local n = tonumber(ARGV[a])
    a = a + 1
    if n > 0 then
      local got = redis.call('HMGET', KEYS[k + j], unpack(ARGV, a, a + n - 1))
      for i = 1, n do out[#out + 1] = got[i] end
      a = a + n
    end
  end
end
return out
"""

# Each user's change, atomically (a script runs whole or not at all). ARGV[1] is how long
# applied ids are kept; then for each user: seen to append, how the positives change (A
# append, S set, "" not) and with what, the new blob ("" none), the impression counts as a
# count and pairs, whether the applied ids start afresh, and the ids applied now.
WRITE_SCRIPT = """
local ttl = ARGV[1]
local a = 2
for k = 1, #KEYS, 5 do
  if ARGV[a] ~= '' then redis.call('APPEND', KEYS[k + 1], ARGV[a]) end
  if ARGV[a + 1] == 'A' then redis.call('APPEND', KEYS[k], ARGV[a + 2])
  elseif ARGV[a + 1] == 'S' then redis.call('SET', KEYS[k], ARGV[a + 2]) end
  if ARGV[a + 3] ~= '' then redis.call('SET', KEYS[k + 2], ARGV[a + 3]) end
  local n = tonumber(ARGV[a + 4])
  a = a + 5
  if n > 0 then
    redis.call('HSET', KEYS[k + 3], unpack(ARGV, a, a + 2 * n - 1))
    a = a + 2 * n
  end
  if ARGV[a] == '1' then redis.call('DEL', KEYS[k + 4]) end
  n = tonumber(ARGV[a + 1])
  a = a + 2
  if n > 0 then
    for i = a, a + n - 1 do redis.call('HSET', KEYS[k + 4], ARGV[i], 1) end
    redis.call('EXPIRE', KEYS[k + 4], ttl)
    a = a + n
  end
end
return 0
"""

# Raises decayed trending scores, kept in log2 space, score = log2(sum of 2^(ts / half-life)),
# so they stay small and compare as the decayed counts they stand for, at any moment; only
# the 10,000 highest are kept.
TRENDING_SCRIPT = """
for n = 1, #ARGV, 2 do
  local x = tonumber(ARGV[n + 1])
  local old = redis.call('ZSCORE', KEYS[1], ARGV[n])
  local new = x
  if old then
    old = tonumber(old)
    local high, low = math.max(old, x), math.min(old, x)
    new = high + math.log(1 + 2 ^ (low - high)) / math.log(2)
  end
  redis.call('ZADD', KEYS[1], new, ARGV[n])
end
local excess = redis.call('ZCARD', KEYS[1]) - 10000
if excess > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1) end
return 0
"""
