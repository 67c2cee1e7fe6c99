-- The FROZEN FLOOR WITH BATCHER'S GROUP COUNTERS. DO NOT CHANGE THIS FILE.
--
-- floor_fields.lua with a group's counters kept as batcher's layout of
-- format 4 keeps them: a field '\129' holding struct '<dddd' (the last
-- sequence number, the item count, the payload bytes, the last arrival in
-- ms), read with the item's id in one HMGET and written with the item in
-- one HSET, in place of floor_fields' HLEN and HSETNX. An item's value is
-- its sequence number, ',' and its payload (the last arrival is in the
-- counters, not in each item); the flush drops '\129' from the batch.
-- Everything else is floor_fields.lua's, line for line: the least a script
-- with batcher's semantics of a plain group must do in a layout that keeps
-- per-group counters, so that `addmany / floor_counters` is what our add
-- does beyond its layout, and `floor_counters / floor_fields` what the
-- counters cost. Like the other floors it must never follow batcher's
-- scripts when they change; if it ever has to change, do it in a commit
-- of its own that says why, and regenerate bench/instructions.toml there.
--
-- KEYS: the shard's due zset, its stream, its flushed zset, then one hash
--       per group.
-- ARGV: max_items, max_wait (ms), window (ms), then per item: its group's
--       index (1 for KEYS[4], 2 for KEYS[5], ...), its id, its payload.
-- Reply: per item, 0 for a duplicate, the group's size after the add while
--        it stays open, or the stream entry id of the batch it completed.
local due, stream, flushed = KEYS[1], KEYS[2], KEYS[3]
local format, find, sub = string.format, string.find, string.sub
local max_items = tonumber(ARGV[1])
local max_wait = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_s, due_s, ends = format('%d', now), nil, nil
-- Decimal texts of small numbers (lengths, counts), made once per call.
local texts = {}
local function text(n)
  local t = texts[n]
  if not t then
    t = format('%d', n)
    texts[n] = t
  end
  return t
end
local members = {}
for i = 4, #ARGV, 3 do
  members[#members + 1] = KEYS[3 + tonumber(ARGV[i])] .. '\255' .. ARGV[i + 1]
end
-- A call of one item looks it up and formats its number without a table.
local one = #members == 1
local until_ms
if one then
  until_ms = { redis.call('ZSCORE', flushed, members[1]) }
else
  until_ms = redis.call('ZMSCORE', flushed, unpack(members))
end
local reply, recent, just = {}, false, false
local j = 0
for i = 4, #ARGV, 3 do
  j = j + 1
  local group, id = KEYS[3 + tonumber(ARGV[i])], ARGV[i + 1]
  local size = false
  if not ((just and just[members[j]]) or (until_ms[j] and tonumber(until_ms[j]) > now)) then
    local got = redis.call('HMGET', group, '\129', id)
    if not got[2] then
      local seq, count, bytes = 0, 0, 0
      if got[1] then seq, count, bytes = struct.unpack('<ddd', got[1]) end
      seq, size = seq + 1, count + 1
      local value = (one and format('%d', seq) or text(seq)) .. ',' .. ARGV[i + 2]
      local counters = struct.pack('<dddd', seq, size, bytes + #ARGV[i + 2], now)
      if got[1] then
        redis.call('HSET', group, '\129', counters, id, value)
      else
        redis.call('HSET', group, '\129', counters, '\128', now_s, id, value)
        due_s = due_s or format('%d', now + max_wait)
        redis.call('ZADD', due, due_s, group)
      end
    end
  end
  if not size then
    reply[#reply + 1] = 0
  elseif size < max_items then
    reply[#reply + 1] = size
  else
    local flat = redis.call('HGETALL', group)
    ends = ends or format('%d', now + window)
    recent, just = recent or {}, just or {}
    local n = #flat
    local k = 1
    while k < n do
      local f = flat[k]
      if f == '\129' then
        flat[k], flat[k + 1] = flat[n - 1], flat[n]
        flat[n - 1], flat[n], n = nil, nil, n - 2
      else
        if f ~= '\128' then
          local flushed_member = group .. '\255' .. f
          just[flushed_member] = true
          recent[#recent + 1] = ends
          recent[#recent + 1] = flushed_member
        end
        k = k + 2
      end
    end
    flat[n + 1], flat[n + 2], flat[n + 3], flat[n + 4], flat[n + 5], flat[n + 6] =
      '\133', group, '\134', 'SIZE', '\135', now_s
    reply[#reply + 1] = redis.call('XADD', stream, '*', unpack(flat))
    redis.call('DEL', group)
    redis.call('ZREM', due, group)
  end
end
if recent then
  redis.call('ZADD', flushed, unpack(recent))
  local stale = redis.call('ZRANGE', flushed, '-inf', now_s, 'BYSCORE', 'LIMIT', '0', text(#recent / 2 + 16))
  if #stale > 0 then
    redis.call('ZREM', flushed, unpack(stale))
  end
end
return reply
