"""The consumer's Lua scripts: each runs whole in Redis, so a batch's read is one command
and its write one atomic step (on a Redis Cluster, one per user: a script's keys must share
a slot, and a user's do)."""

from __future__ import annotations

# Lua's unpack() puts its results on a stack of about 8,000 slots: argument lists of any
# length go to Redis in pieces this long (an even number, for field-value pairs).
_CHUNKED = """
local function hmget_into(out, key, from, n)
  local i = 0
  while i < n do
    local m = math.min(1000, n - i)
    local got = redis.call('HMGET', key, unpack(ARGV, from + i, from + i + m - 1))
    for j = 1, m do out[#out + 1] = got[j] end
    i = i + m
  end
end
local function hset_pairs(key, from, count)
  local i = 0
  while i < count do
    local m = math.min(1000, count - i)
    redis.call('HSET', key, unpack(ARGV, from + i, from + i + m - 1))
    i = i + m
  end
end
local function persistent(key)
  return redis.call('PTTL', key) == -1
end
"""

# Each user's state, for users whose keys come five at a time (positives, seen, blob,
# impressions, applied ids): the three strings; 1 when the user is the world's (their blob
# or seen list never expires), else 0; how many applied ids are kept; then the impression
# counts and the applied marks asked for (ARGV: for each user, a count and the fields,
# twice). One command for a batch instead of several per user: the client's per-command
# cost is what bounds the rate.
READ_SCRIPT = (
    _CHUNKED
    + """
local out = {}
local a = 1
for k = 1, #KEYS, 5 do
  for j = 0, 2 do out[#out + 1] = redis.call('GET', KEYS[k + j]) end
  if persistent(KEYS[k + 1]) or persistent(KEYS[k + 2]) then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  out[#out + 1] = redis.call('HLEN', KEYS[k + 4])
  for j = 3, 4 do
    local n = tonumber(ARGV[a])
    a = a + 1
    if n > 0 then
      hmget_into(out, KEYS[k + j], a, n)
      a = a + n
    end
  end
end
return out
"""
)

# Each user's change, atomically (a script runs whole or not at all). ARGV[1] is how long
# applied ids are kept, ARGV[2] and ARGV[3] the most bytes of positives and of seen list
# kept (the latest); then for each user: seen to append, how the positives change (A
# append, S set, "" not) and with what, the new blob ("" none), the impression counts as a
# count and pairs, whether the applied ids start afresh, the ids applied now, and how long
# the user lives without an event (0: for good; a world user is never given one).
WRITE_SCRIPT = (
    _CHUNKED
    + """
local ttl = ARGV[1]
local most_positives = tonumber(ARGV[2])
local most_seen = tonumber(ARGV[3])
local function trim(key, most)
  local len = redis.call('STRLEN', key)
  if len > most then
    redis.call('SET', key, redis.call('GETRANGE', key, len - most, -1), 'KEEPTTL')
  end
end
local a = 4
for k = 1, #KEYS, 5 do
  if ARGV[a] ~= '' then
    redis.call('APPEND', KEYS[k + 1], ARGV[a])
    trim(KEYS[k + 1], most_seen)
  end
  if ARGV[a + 1] == 'A' then redis.call('APPEND', KEYS[k], ARGV[a + 2])
  elseif ARGV[a + 1] == 'S' then redis.call('SET', KEYS[k], ARGV[a + 2], 'KEEPTTL') end
  if ARGV[a + 1] ~= '' then trim(KEYS[k], most_positives) end
  if ARGV[a + 3] ~= '' then redis.call('SET', KEYS[k + 2], ARGV[a + 3], 'KEEPTTL') end
  local n = tonumber(ARGV[a + 4])
  a = a + 5
  if n > 0 then
    hset_pairs(KEYS[k + 3], a, 2 * n)
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
  local idle = tonumber(ARGV[a])
  a = a + 1
  if idle > 0 then
    for j = 0, 3 do redis.call('EXPIRE', KEYS[k + j], idle) end
  end
end
return 0
"""
)
