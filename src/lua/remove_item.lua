-- Takes one item out of its open group; deletes the group if it empties.
--
-- KEYS[1]: the shard's due sorted set
-- KEYS[2]: the group's hash
-- ARGV[1]: the group's key
-- ARGV[2]: the item id
-- Returns: {removed (1 or 0), group size after}

local due_key, gkey = KEYS[1], KEYS[2]
local key, id = ARGV[1], ARGV[2]
local v = redis.call('HGET', gkey, ':' .. id)
if not v then
  return { 0, tonumber(redis.call('HGET', gkey, 'n') or '0') }
end
local comma = string.find(v, ',', 1, true)
redis.call('HDEL', gkey, ':' .. id)
local size = redis.call('HINCRBY', gkey, 'n', -1)
-- 0 - x, not -x: Lua formats -0 as "-0", which HINCRBY refuses.
redis.call('HINCRBY', gkey, 'b', 0 - (#v - comma))
if size <= 0 then
  redis.call('DEL', gkey)
  redis.call('ZREM', due_key, key)
  size = 0
end
return { 1, size }
