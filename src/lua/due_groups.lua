-- Reads which groups of a shard are due, by the Redis clock. Writes nothing.
--
-- KEYS[1]: the shard's due sorted set
-- ARGV[1]: the most group keys to return
-- Returns: {now (ms), earliest due time (ms) of a group not yet due or -1, key...}
--   keys in due order

local now = now_ms()
local keys = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]))
local next_due = -1
local upcoming = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
if #upcoming > 0 then next_due = tonumber(upcoming[2]) end
local out = { now, next_due }
for i = 1, #keys do out[#out + 1] = keys[i] end
return out
