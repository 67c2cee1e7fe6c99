-- The FROZEN FLOOR WITH A DEDUP WINDOW. DO NOT CHANGE THIS FILE.
--
-- floor.lua plus the one feature of batcher's add path that costs Redis
-- the most beyond it: a dedup window, which remembers every flushed item
-- for `window` ms so that a re-sent item is not added again. It is the
-- least an add script must do for batcher's semantics of idempotency, and
-- like floor.lua it must never follow batcher's scripts when they change;
-- if it ever has to change, do it in a commit of its own that says why,
-- and regenerate bench/instructions.toml there.
--
-- The window is one sorted set per shard, as batcher's: members are the
-- group's key, a byte 255 and the id, scored by when the window ends. Per
-- call: one ZMSCORE of every item's member, and when the call flushed
-- groups, one ZADD of their items and the removal of members whose window
-- has ended (at most as many as were added, and 16). Per item, as
-- floor.lua: HSETNX of its id into its group's hash and HLEN; a duplicate
-- (in the open group, in the window, or flushed earlier in the same call)
-- is reported as 0. The item that opens a group ZADDs its due time; the
-- item that brings it to max_items flushes it: HGETALL, XADD of the items
-- (id, payload pairs), DEL, ZREM from the due set.
--
-- KEYS: the shard's due zset, its stream, its flushed zset, then one hash
--       per group.
-- ARGV: max_items, max_wait (ms), window (ms), then per item: its group's
--       index (1 for KEYS[4], 2 for KEYS[5], ...), its id, its payload.
-- Reply: per item, 0 for a duplicate, the group's size after the add while
--        it stays open, or the stream entry id of the batch it completed.
local due, stream, flushed = KEYS[1], KEYS[2], KEYS[3]
local max_items = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local members = {}
for i = 4, #ARGV, 3 do
  members[#members + 1] = KEYS[3 + tonumber(ARGV[i])] .. '\255' .. ARGV[i + 1]
end
local until_ms = redis.call('ZMSCORE', flushed, unpack(members))
local reply, recent, just = {}, {}, {}
local ends = now + window
local j = 0
for i = 4, #ARGV, 3 do
  j = j + 1
  local group = KEYS[3 + tonumber(ARGV[i])]
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
      local items = redis.call('HGETALL', group)
      reply[#reply + 1] = redis.call('XADD', stream, '*', unpack(items))
      redis.call('DEL', group)
      redis.call('ZREM', due, group)
      for k = 1, #items, 2 do
        local flushed_member = group .. '\255' .. items[k]
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
