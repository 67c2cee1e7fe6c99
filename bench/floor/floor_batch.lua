-- The FROZEN FLOOR WITH BATCHER'S BATCH. DO NOT CHANGE THIS FILE.
--
-- floor_dedup.lua plus what batcher's plain add keeps beside an item's id
-- and payload, and the batch as batcher's stream carries it, each at the
-- least cost measured so far: the least a script with batcher's semantics
-- of a plain group must do. Like the other floors it must never follow
-- batcher's scripts when they change; if it ever has to change, do it in a
-- commit of its own that says why, and regenerate bench/instructions.toml
-- there.
--
-- What it keeps beyond floor_dedup.lua:
-- - arrival order: an item's value starts with its sequence number, the
--   group's item count after the add, read with HLEN before it (the hash's
--   one other field is the opening time). Unique while items are only
--   added; a removal would keep it unique by renumbering the group's later
--   items, proportional to one group.
-- - its arrival time (ms, as text), so an inspection can say when the
--   group last took an item.
-- - the group's opening time, field '\128', written with its first item.
-- - the batch, in batcher's format: the fields key, reason, opened,
--   flushed, n, and items: #id ':' id #payload ':' payload for each item,
--   in arrival order (sorted by sequence number only when the hash did not
--   return them in order).
-- Numbers go to Redis as text, never through Lua's %.14g, each made when
-- first needed: the due time when a group opens, the window's end when a
-- call flushes, lengths and sequence numbers once per call (a call of one
-- item formats its one number and looks its id up with ZSCORE, without
-- the tables a call of many uses).
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
    local fields = redis.call('HLEN', group)
    if fields == 0 then
      redis.call('HSET', group, '\128', now_s, id, '1,' .. now_s .. ',' .. ARGV[i + 2])
      due_s = due_s or format('%d', now + max_wait)
      redis.call('ZADD', due, due_s, group)
      size = 1
    else
      local seq = one and format('%d', fields) or text(fields)
      if redis.call('HSETNX', group, id, seq .. ',' .. now_s .. ',' .. ARGV[i + 2]) == 1 then
        size = fields
      end
    end
  end
  if not size then
    reply[#reply + 1] = 0
  elseif size < max_items then
    reply[#reply + 1] = size
  else
    local flat = redis.call('HGETALL', group)
    local opened, seqs, ids, payloads, n, sorted, last = '', {}, {}, {}, 0, true, 0
    for k = 1, #flat, 2 do
      local f, v = flat[k], flat[k + 1]
      if f == '\128' then
        opened = v
      else
        local c1 = find(v, ',', 1, true)
        local seq = tonumber(sub(v, 1, c1 - 1))
        n = n + 1
        seqs[n], ids[n], payloads[n] = seq, f, sub(v, find(v, ',', c1 + 1, true) + 1)
        if seq < last then sorted = false end
        last = seq
      end
    end
    local order = {}
    for q = 1, n do order[q] = q end
    if not sorted then table.sort(order, function(a, b) return seqs[a] < seqs[b] end) end
    local parts, w = {}, 0
    ends = ends or format('%d', now + window)
    recent, just = recent or {}, just or {}
    for q = 1, n do
      local item, payload = ids[order[q]], payloads[order[q]]
      parts[w + 1], parts[w + 2], parts[w + 3], parts[w + 4], parts[w + 5], parts[w + 6] =
        text(#item), ':', item, text(#payload), ':', payload
      w = w + 6
      local flushed_member = group .. '\255' .. item
      just[flushed_member] = true
      recent[#recent + 1] = ends
      recent[#recent + 1] = flushed_member
    end
    reply[#reply + 1] = redis.call('XADD', stream, '*', 'key', group, 'reason', 'SIZE', 'opened', opened,
      'flushed', now_s, 'n', text(n), 'items', table.concat(parts, '', 1, w))
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
