-- The FROZEN FLOOR WITH EVERY RULE. DO NOT CHANGE THIS FILE.
--
-- floor_dedup.lua plus the least an add script must do for batcher's
-- rules besides max_items and max_wait: max_idle, a capacity of two
-- measures, a cutoff, item deadlines with a lead, and max_age (min_items
-- only holds a group at the sweeper, so an add does nothing for it). Like
-- the other floors it must never follow batcher's scripts when they
-- change; if it ever has to change, do it in a commit of its own that
-- says why, and regenerate bench/instructions.toml there.
--
-- Each group's hash holds its items and one field, byte 128 (no item id
-- can be it): struct '<ddddddd' of opened, item count, the two sums, the
-- earliest deadline (0: none), the due time the due set holds, and the
-- last arrival (which the sweeper needs for max_idle). An item's value is
-- its parcel (below), as the caller packed it, then its payload.
--
-- Per call, as floor_dedup: one ZMSCORE of every item's member of the
-- shard's flushed set and, when the call flushed groups, one ZADD of their
-- items and the removal of members whose window has ended. Per item: one
-- HMGET of the group's field and the id (a duplicate, in the group, in
-- the window or flushed earlier in the same call, is reported as 0 and
-- costs no HMGET when the window or the call already says so); an item
-- that would take the group past a capacity flushes it first (the item
-- then opens the next group); then one HSET of the field and the item.
-- The due time is the earliest of opened + max_wait, the arrival +
-- max_idle, the cutoff, the earliest deadline - lead and opened + max_age;
-- the due set only moves earlier (a later time, which each arrival gives
-- max_idle, is the sweeper's to find), so ZADD runs when a group opens or
-- a deadline brings it earlier. The item that brings the group to
-- max_items or a capacity is written and the group flushed: HGETALL, XADD
-- of every field (the counters' too: the least work), DEL, ZREM from the
-- due set.
--
-- KEYS: the shard's due zset, its stream, its flushed zset, then one hash
--       per group.
-- ARGV: max_items, max_wait, window, max_idle, the two capacities, the
--       next cutoff, the deadline lead, max_age (all ms), then per item:
--       its group's index (1 for KEYS[4], ...), its id, its payload, its
--       parcel: struct '<ddd' of its two measures and its deadline (ms, 0
--       for none), packed by the caller.
-- Reply: per item, 0 for a duplicate, the group's size after the add while
--        it stays open, or the stream entry id of the batch it completed.
local due, stream, flushed = KEYS[1], KEYS[2], KEYS[3]
local max_items, max_wait, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_idle, cap_a, cap_b = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cutoff, lead, max_age = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local FIELD = '\128'
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local members = {}
for i = 10, #ARGV, 4 do
  members[#members + 1] = KEYS[3 + tonumber(ARGV[i])] .. '\255' .. ARGV[i + 1]
end
local until_ms = redis.call('ZMSCORE', flushed, unpack(members))
local reply, recent, just = {}, {}, {}
local ends = now + window

local function flush(group)
  local fields = redis.call('HGETALL', group)
  local id = redis.call('XADD', stream, '*', unpack(fields))
  redis.call('DEL', group)
  redis.call('ZREM', due, group)
  for k = 1, #fields, 2 do
    if fields[k] ~= FIELD then
      local flushed_member = group .. '\255' .. fields[k]
      just[flushed_member] = true
      recent[#recent + 1] = ends
      recent[#recent + 1] = flushed_member
    end
  end
  return id
end

local j = 0
for i = 10, #ARGV, 4 do
  j = j + 1
  local group, id = KEYS[3 + tonumber(ARGV[i])], ARGV[i + 1]
  local got = false
  if not (just[members[j]] or (until_ms[j] and tonumber(until_ms[j]) > now)) then
    got = redis.call('HMGET', group, FIELD, id)
  end
  if not got or got[2] then
    reply[#reply + 1] = 0
  else
    local parcel = ARGV[i + 3]
    local a, b, deadline = struct.unpack('<ddd', parcel)
    local opened, n, sum_a, sum_b, earliest, due_at = now, 0, 0, 0, 0, 0
    if got[1] then opened, n, sum_a, sum_b, earliest, due_at = struct.unpack('<ddddddd', got[1]) end
    local batch = false
    if n > 0 and (sum_a + a > cap_a or sum_b + b > cap_b) then
      batch = flush(group)
      opened, n, sum_a, sum_b, earliest, due_at = now, 0, 0, 0, 0, 0
    end
    n, sum_a, sum_b = n + 1, sum_a + a, sum_b + b
    if deadline > 0 and (earliest == 0 or deadline < earliest) then earliest = deadline end
    local value = parcel .. ARGV[i + 2]
    if n >= max_items or sum_a >= cap_a or sum_b >= cap_b then
      redis.call('HSET', group, id, value)
      reply[#reply + 1] = flush(group)
    else
      local t = math.min(opened + max_wait, now + max_idle, opened + max_age)
      if cutoff > 0 and cutoff < t then t = cutoff end
      if earliest > 0 and earliest - lead < t then t = earliest - lead end
      local moved = n == 1 or t < due_at
      if moved then due_at = t end
      redis.call('HSET', group, FIELD,
        struct.pack('<ddddddd', opened, n, sum_a, sum_b, earliest, due_at, now), id, value)
      if moved then redis.call('ZADD', due, due_at, group) end
      reply[#reply + 1] = batch or n
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
