-- A CANDIDATE LAYOUT OF THE DEDUP WINDOW, measured against floor_dedup.lua
-- (bench/sittings/32-36a55c5-dedup.md); not a yardstick, and not what
-- batcher runs.
--
-- floor_dedup.lua with the window in two hashes, one per generation, in
-- place of one sorted set: a dict lookup per member in each, no skip list,
-- and no trim per call. A member's field holds when its window ends (ms).
-- The items flushed in time slice n (n = floor(now / window)) go to the
-- generation n % 2, whose field \128 holds n; a write into a generation
-- that still holds an older slice first UNLINKs it, since every window in
-- it has ended. A member stays between one window and two.
--
-- KEYS: the shard's due zset, its stream, its two generations, then one
--       hash per group.
-- ARGV, reply: as floor_dedup.lua's.
local due, stream, even, odd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local max_items = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local members = {}
for i = 4, #ARGV, 3 do
  members[#members + 1] = KEYS[4 + tonumber(ARGV[i])] .. '\255' .. ARGV[i + 1]
end
local in_even = redis.call('HMGET', even, unpack(members))
local in_odd = redis.call('HMGET', odd, unpack(members))
local reply, recent, just = {}, {}, {}
local ends = now + window
local j = 0
for i = 4, #ARGV, 3 do
  j = j + 1
  local group = KEYS[4 + tonumber(ARGV[i])]
  local member = members[j]
  if just[member] or (in_even[j] and tonumber(in_even[j]) > now)
    or (in_odd[j] and tonumber(in_odd[j]) > now)
    or redis.call('HSETNX', group, ARGV[i + 1], ARGV[i + 2]) == 0 then
    reply[#reply + 1] = 0
  else
    local size = redis.call('HLEN', group)
    if size == 1 then
      redis.call('ZADD', due, now + max_wait, group)
    end
    if size >= max_items then
      local items = redis.call('HGETALL', group)
      reply[#reply + 1] = redis.call('XADD', stream, '*', unpack(items))
      redis.call('DEL', group)
      redis.call('ZREM', due, group)
      for k = 1, #items, 2 do
        local flushed_member = group .. '\255' .. items[k]
        just[flushed_member] = true
        recent[#recent + 1] = flushed_member
        recent[#recent + 1] = ends
      end
    else
      reply[#reply + 1] = size
    end
  end
end
if #recent > 0 then
  local slice = math.floor(now / window)
  local generation = (slice % 2 == 0) and even or odd
  local held = redis.call('HGET', generation, '\128')
  if held ~= tostring(slice) then
    if held then redis.call('UNLINK', generation) end
    recent[#recent + 1] = '\128'
    recent[#recent + 1] = slice
  end
  redis.call('HSET', generation, unpack(recent))
end
return reply
