-- A CANDIDATE WAY TO WRITE A BATCH, measured against floor_dedup.lua
-- (bench/sittings/32-36a55c5-dedup.md); not a yardstick, and not what
-- batcher runs.
--
-- floor_dedup.lua with a flush that copies no item through Lua: the
-- group's hash is RENAMEd to a batch key of its own, and the stream entry
-- names that key; only the ids come back (HKEYS), for the dedup window's
-- members. Every key a script touches must be in KEYS, and the script
-- cannot know beforehand which groups an item will complete, so the
-- caller passes a batch key with every group of the call.
--
-- KEYS: the shard's due zset, its stream, its flushed zset, then per
--       group its hash and the batch key it would be renamed to.
-- ARGV, reply: as floor_dedup.lua's.
local due, stream, flushed = KEYS[1], KEYS[2], KEYS[3]
local max_items = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local members = {}
for i = 4, #ARGV, 3 do
  members[#members + 1] = KEYS[2 + 2 * tonumber(ARGV[i])] .. '\255' .. ARGV[i + 1]
end
local until_ms = redis.call('ZMSCORE', flushed, unpack(members))
local reply, recent, just = {}, {}, {}
local ends = now + window
local j = 0
for i = 4, #ARGV, 3 do
  j = j + 1
  local g = tonumber(ARGV[i])
  local group = KEYS[2 + 2 * g]
  local member = members[j]
  if just[member] or (until_ms[j] and tonumber(until_ms[j]) > now)
    or redis.call('HSETNX', group, ARGV[i + 1], ARGV[i + 2]) == 0 then
    reply[#reply + 1] = 0
  else
    local size = redis.call('HLEN', group)
    if size == 1 then
      redis.call('ZADD', due, now + max_wait, group)
    end
    if size >= max_items then
      local ids = redis.call('HKEYS', group)
      local batch = KEYS[3 + 2 * g]
      redis.call('RENAME', group, batch)
      reply[#reply + 1] = redis.call('XADD', stream, '*', 'b', batch)
      redis.call('ZREM', due, group)
      for k = 1, #ids do
        local flushed_member = group .. '\255' .. ids[k]
        just[flushed_member] = true
        recent[#recent + 1] = ends
        recent[#recent + 1] = flushed_member
      end
    else
      reply[#reply + 1] = size
    end
  end
end
if #recent > 0 then
  redis.call('ZADD', flushed, unpack(recent))
  local stale = redis.call('ZRANGE', flushed, '-inf', now, 'BYSCORE', 'LIMIT', 0, #recent / 2 + 16)
  if #stale > 0 then
    redis.call('ZREM', flushed, unpack(stale))
  end
end
return reply
