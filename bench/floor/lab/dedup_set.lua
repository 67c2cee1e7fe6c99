-- A LOWER BOUND, NOT A CORRECT ADD: floor_dedup.lua with its window in a
-- plain set that never forgets (SMISMEMBER, then SADD of the flushed
-- members), the least that any dict-based dedup costs per item. Measured
-- against floor_dedup.lua (bench/sittings/32-36a55c5-dedup.md); not a
-- yardstick, and not what batcher runs.
--
-- KEYS: the shard's due zset, its stream, its set, then one hash per group.
-- ARGV, reply: as floor_dedup.lua's (the window is read and not used).
local due, stream, flushed = KEYS[1], KEYS[2], KEYS[3]
local max_items = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local members = {}
for i = 4, #ARGV, 3 do
  members[#members + 1] = KEYS[3 + tonumber(ARGV[i])] .. '\255' .. ARGV[i + 1]
end
local known = redis.call('SMISMEMBER', flushed, unpack(members))
local reply, recent, just = {}, {}, {}
local j = 0
for i = 4, #ARGV, 3 do
  j = j + 1
  local group = KEYS[3 + tonumber(ARGV[i])]
  local member = members[j]
  if just[member] or known[j] == 1
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
      end
    else
      reply[#reply + 1] = size
    end
  end
end
if #recent > 0 then
  redis.call('SADD', flushed, unpack(recent))
end
return reply
