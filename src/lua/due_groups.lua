-- Reads which groups of a shard are due, by the Redis clock, and which come
-- due next. Writes nothing.
--
-- KEYS[1]: the shard's due sorted set
-- ARGV[1]: the most group keys to return, of each kind
-- Returns: {now (ms), earliest due time (ms) of a group not yet due or -1,
--   the number of due keys, the due keys in due order, then the keys due
--   at that earliest time}

local now = now_ms()
local limit = tonumber(ARGV[1])
local keys = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
local next_due = -1
local out = { now, next_due, #keys }
for i = 1, #keys do out[#out + 1] = keys[i] end
local upcoming = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
if #upcoming > 0 then
  out[2] = tonumber(upcoming[2])
  local next_keys = redis.call('ZRANGE', KEYS[1], upcoming[2], upcoming[2], 'BYSCORE', 'LIMIT', 0, limit)
  for i = 1, #next_keys do out[#out + 1] = next_keys[i] end
end
return out
