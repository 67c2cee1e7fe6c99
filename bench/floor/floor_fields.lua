-- The FROZEN FLOOR WITH BATCHER'S BATCH OF FORMAT 4. DO NOT CHANGE THIS FILE.
--
-- floor_batch.lua with the batch as format 4 writes it: the group's hash
-- passed to XADD as HGETALL gives it, its items' fields and values as
-- they are (each value starts with the item's sequence number, so readers
-- order the items), with the batch's key, reason and flush time after
-- them, each named by a byte from 128 ('\133', '\134', '\135'; the
-- opening time, '\128', comes with the hash). Everything else is
-- floor_batch.lua's, line for line: the least a script with batcher's
-- semantics of a plain group must do in format 4. Like the other floors it
-- must never follow batcher's scripts when they change; if it ever has to
-- change, do it in a commit of its own that says why, and regenerate
-- bench/instructions.toml there.
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
    ends = ends or format('%d', now + window)
    recent, just = recent or {}, just or {}
    local n = #flat
    for k = 1, n, 2 do
      local f = flat[k]
      if f ~= '\128' then
        local flushed_member = group .. '\255' .. f
        just[flushed_member] = true
        recent[#recent + 1] = ends
        recent[#recent + 1] = flushed_member
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
